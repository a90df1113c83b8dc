"""Stripe's thin events (object v2.core.event, app/providers/stripe/thin.py): verified as snapshot events are, then
the related object fetched from Stripe's API (devservers/stripe_stand_in.py, which stripe-python itself reads)
in the event's account context, and the money read from its current state, keyed as its snapshot twin's.
Thin bodies as https://docs.stripe.com/api/v2/core/events/object shows them, signed by stripe-python's signer.
Real PostgreSQL and Redis."""

import shlex
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest
import stripe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.providers.stripe import THIN_RULES
from devservers import ROOT, readme
from devservers.stripe_stand_in import API_KEY
from tests.helpers import (
    ALICE,
    OPENING,
    SECRETS,
    UNMETERED,
    assert_ledger_consistent,
    balance,
    db_url,
    drain,
    event_rows,
    samples,
    send,
    source_secret,
    sources_config,
    stored_event_row,
    wait_drained,
    waiting_row,
    waiting_rows,
)
from tests.providers.stripe.events import (
    charge_refunded,
    deliver,
    dispute,
    intent_succeeded,
    refund,
    stripe_signed,
    thin,
    thin_signed,
)

pytestmark = pytest.mark.core

@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url,
            **UNMETERED}


def _obj(evt):
    return evt.data.object.to_dict()


def _withdrawn(obj, reinstated=False):
    """The Dispute with the balance transactions its funds moved by (negative: withdrawn, positive: back)."""
    moves = [-obj["amount"]] + ([obj["amount"]] if reinstated else [])
    return {**obj, "balance_transactions": [{"id": f"txn_{i}{obj['id']}", "object": "balance_transaction",
                                             "amount": cents, "currency": obj["currency"]}
                                            for i, cents in enumerate(moves)]}


def _movement(name, pi):
    """(events before, the snapshot event, its thin twin, the object Stripe has now, the balance change of all)."""
    paid = intent_succeeded(pi, cents=900)
    if name == "payment":
        return [], paid, "v1.payment_intent.succeeded", _obj(paid), 900
    if name == "refund":
        snapshot = refund(f"re_{pi}", pi, 300, status="succeeded", event_type="refund.created")
        return [paid], snapshot, "v1.refund.created", _obj(snapshot), 600
    if name == "refund failed":  # the refund was counted (its pending state), then failed
        pending = refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created")
        snapshot = refund(f"re_{pi}", pi, 300, status="failed")
        return [paid, pending], snapshot, "v1.refund.failed", _obj(snapshot), 900
    if name == "dispute withdrawn":
        snapshot = dispute(f"du_{pi}", pi, 400)
        return [paid], snapshot, "v1.charge.dispute.funds_withdrawn", _withdrawn(_obj(snapshot)), 500
    if name == "dispute reinstated":
        withdrawn = dispute(f"du_{pi}", pi, 400)
        snapshot = dispute(f"du_{pi}", pi, 400, event_type="charge.dispute.funds_reinstated", status="won")
        obj = _withdrawn(_obj(snapshot), reinstated=True)
        return [paid, withdrawn], snapshot, "v1.charge.dispute.funds_reinstated", obj, 900
    raise AssertionError(name)


MOVEMENTS = ["payment", "refund", "refund failed", "dispute withdrawn", "dispute reinstated"]


def _pi():
    return f"pi_{uuid.uuid4().hex[:24]}"


def test_stripe_python_parses_a_thin_body_and_fetches_its_object_from_the_stand_in(stripe_api):
    obj = _obj(intent_succeeded(_pi(), cents=700))
    stripe_api.put(obj, context="acct_1Connected")
    body, headers = thin_signed(thin("v1.payment_intent.succeeded", obj, context="acct_1Connected"))
    client = stripe.StripeClient(API_KEY, base_addresses={"api": stripe_api.url})
    notification = client.parse_event_notification(body, headers["Stripe-Signature"], SECRETS["stripe"])
    assert notification.fetch_related_object().amount_received == 700
    assert stripe_api.requests[-1] == {"object": "payment_intent", "id": obj["id"], "context": "acct_1Connected"}


def test_stripe_python_retrieves_a_thin_event_from_the_stand_in_in_its_context(stripe_api):
    document = thin("v1.payment_intent.succeeded", _obj(intent_succeeded(_pi())), context="acct_1Connected")
    stripe_api.put(document, context="acct_1Connected")
    body, headers = thin_signed(document)
    client = stripe.StripeClient(API_KEY, base_addresses={"api": stripe_api.url})
    notification = client.parse_event_notification(body, headers["Stripe-Signature"], SECRETS["stripe"])
    assert notification.fetch_event().id == document["id"]
    assert stripe_api.requests[-1] == {"object": "v2.core.event", "id": document["id"], "context": "acct_1Connected"}


@pytest.mark.parametrize("name", MOVEMENTS)
def test_each_movement_as_a_thin_event_moves_the_money_its_object_shows(client, db, stripe_api, name):
    pi = _pi()
    before, _, thin_type, obj, change = _movement(name, pi)
    for evt in before:
        assert deliver(client, evt).json["status"] == "processed"
    stripe_api.put(obj)
    assert deliver(client, thin(thin_type, obj)).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + change
    assert_ledger_consistent(db)


@pytest.mark.parametrize("thin_first", [True, False], ids=["thin first", "snapshot first"])
@pytest.mark.parametrize("name", MOVEMENTS)
def test_a_thin_event_and_its_snapshot_twin_move_the_money_once(client, db, stripe_api, name, thin_first):
    pi = _pi()
    before, snapshot, thin_type, obj, change = _movement(name, pi)
    for evt in before:
        deliver(client, evt)
    stripe_api.put(obj)
    first, second = [thin(thin_type, obj, snapshot_event=snapshot.id), snapshot][::1 if thin_first else -1]
    assert deliver(client, first).json["status"] == "processed"
    assert deliver(client, second).json["status"] in ("processed", "duplicate")  # a credit's twin: duplicate
    assert balance(db, ALICE) == OPENING[ALICE] + change
    assert_ledger_consistent(db)


@pytest.mark.parametrize("thin_first", [True, False], ids=["thin first", "snapshot first"])
@pytest.mark.parametrize("name", MOVEMENTS)
def test_a_thin_destination_beside_a_snapshot_destination_moves_the_money_once(make_app, config, db, stripe_api, name,
                                                                                thin_first):
    """Stripe's migration set-up: the snapshot destination on /api/webhooks, the thin one on /api/webhooks/thin
    with its own secret and key, its events one account's with the default source's (_MOVED_FROM)."""
    client = make_app(sources_config(config, {"thin": "stripe"}, WEBHOOK_THIN_MOVED_FROM="default",
                                     WEBHOOK_THIN_API_KEY=API_KEY)).test_client()
    before, snapshot, thin_type, obj, change = _movement(name, _pi())
    for evt in before:
        deliver(client, evt)
    stripe_api.put(obj)
    thin_evt = thin(thin_type, obj, snapshot_event=snapshot.id)
    twins = [lambda: send(client, *thin_signed(thin_evt, source_secret("thin", "stripe")), source="thin"),
             lambda: deliver(client, snapshot)]
    first, second = twins[::1 if thin_first else -1]
    assert first().json["status"] == "processed"
    assert second().json["status"] in ("processed", "duplicate")
    assert balance(db, ALICE) == OPENING[ALICE] + change
    assert_ledger_consistent(db)


def test_a_refund_whose_thin_event_arrives_after_it_failed_never_takes_its_amount(client, db, stripe_api):
    """Stripe's object has moved on: the thin event of its creation reads it failed, as refund.failed would."""
    pi = _pi()
    deliver(client, intent_succeeded(pi, cents=900))
    failed = _obj(refund(f"re_{pi}", pi, 300, status="failed"))
    stripe_api.put(failed)
    assert deliver(client, thin("v1.refund.created", failed)).json["status"] == "processed"
    assert deliver(client, refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created")).json[
        "status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 900
    assert_ledger_consistent(db)


def test_a_thin_event_delivered_again_after_its_object_moved_on_is_a_duplicate(client, db, stripe_api):
    """Stripe retries a thin event whose answer it did not get: the refund has failed since. The copy is the
    same event (200 duplicate, not 409 payload_mismatch); the failure is its own event's to apply."""
    pi = _pi()
    deliver(client, intent_succeeded(pi, cents=900))
    pending = _obj(refund(f"re_{pi}", pi, 300, status="pending"))
    stripe_api.put(pending)
    delivery = thin_signed(thin("v1.refund.created", pending))
    assert send(client, *delivery).json["status"] == "processed"
    failed = {**pending, "status": "failed"}
    stripe_api.put(failed)
    assert send(client, *delivery).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + 600
    assert deliver(client, thin("v1.refund.failed", failed)).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 900
    assert_ledger_consistent(db)


def test_a_thin_event_refused_before_its_payment_applies_on_retry_in_its_objects_later_state(client, db, stripe_api):
    """Stripe retries a thin event answered 422 (its payment not credited yet); the refund has failed since."""
    pi = _pi()
    pending = _obj(refund(f"re_{pi}", pi, 300, status="pending"))
    stripe_api.put(pending)
    delivery = thin_signed(thin("v1.refund.created", pending))
    answer = send(client, *delivery)
    assert (answer.status, answer.json["message"]) == (422, f"unknown payment {pi}")
    stripe_api.put({**pending, "status": "failed"})
    deliver(client, intent_succeeded(pi, cents=900))
    assert send(client, *delivery).json["status"] == "processed"  # the refund as it is now: failed, nothing taken
    assert balance(db, ALICE) == OPENING[ALICE] + 900
    assert_ledger_consistent(db)


def test_a_thin_event_and_its_snapshot_twin_sent_at_once_on_many_threads_credit_once(gunicorn, db, stripe_api):
    server = gunicorn(workers=2, threads=4)
    pi = _pi()
    paid = intent_succeeded(pi, cents=900)
    obj = _obj(paid)
    stripe_api.put(obj)
    deliveries = [thin_signed(thin("v1.payment_intent.succeeded", obj, snapshot_event=paid.id)),
                  stripe_signed(paid)] * 4
    barrier = Barrier(len(deliveries))

    def post(delivery):
        barrier.wait()
        for _ in range(100):
            answer = send(server.base, *delivery)
            if answer.status not in (409, 503):  # another copy holds the event; every provider slot is busy
                return answer.status
            time.sleep(0.02)  # Stripe retries both
        return answer.status

    with ThreadPoolExecutor(len(deliveries)) as pool:
        assert set(pool.map(post, deliveries)) <= {200, 202}  # 202: accepted, every provider slot busy
    wait_drained(db)  # the hosts' drains apply what was accepted
    assert balance(db, ALICE) == OPENING[ALICE] + 900
    assert event_rows(db) == 2
    assert_ledger_consistent(db)


def test_a_source_that_fetches_every_event_reads_a_thin_events_money_from_its_object(make_app, config, db,
                                                                                     stripe_api):
    client = make_app({**config, "WEBHOOK_FETCH": "true"}).test_client()
    obj = _obj(intent_succeeded(_pi(), cents=650))
    stripe_api.put(obj)
    asked = len(stripe_api.requests)
    assert deliver(client, thin("v1.payment_intent.succeeded", obj)).json["status"] == "processed"
    assert stripe_api.requests[asked:] == [{"object": "payment_intent", "id": obj["id"], "context": None}]
    assert balance(db, ALICE) == OPENING[ALICE] + 650


def test_a_thin_event_is_fetched_in_its_account_context(client, db, stripe_api):
    pi = _pi()
    obj = _obj(intent_succeeded(pi, cents=500))
    stripe_api.put(obj, context="acct_1Other")
    answer = deliver(client, thin("v1.payment_intent.succeeded", obj))  # the platform's own account has no pi
    assert answer.status == 422
    assert deliver(client, thin("v1.payment_intent.succeeded", obj, context="acct_1Other")).json[
        "status"] == "processed"
    assert stripe_api.requests[-1]["context"] == "acct_1Other"
    assert balance(db, ALICE) == OPENING[ALICE] + 500


def test_a_thin_event_whose_object_stripe_does_not_have_is_422_kept_without_its_body_and_a_genuine_one_applies(
        client, db, stripe_api):
    pi = _pi()
    obj = _obj(intent_succeeded(pi, cents=800))
    evt = thin("v1.payment_intent.succeeded", obj)
    answer = deliver(client, evt)
    assert (answer.status, answer.json["error"]) == (422, "unprocessable")
    assert f"Stripe's API has no payment_intent {pi}" in answer.json["message"]
    kept = waiting_row(db, evt["id"])
    assert (kept.state, kept.body) == ("unknown", None) and f"no payment_intent {pi}" in kept.last_error
    assert event_rows(db) == 0  # no failed event: no alert, nothing for `events replay --all-failed` to ask again
    assert balance(db, ALICE) == OPENING[ALICE]
    stripe_api.put(obj)
    assert deliver(client, evt).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 800
    assert waiting_row(db, evt["id"]) is None
    assert db.execute("SELECT fetched FROM webhook_events WHERE event_id = %s", [evt["id"]]).fetchone()[0]
    assert_ledger_consistent(db)


@pytest.mark.parametrize("fault", ["500", "hang", "429"])
def test_stripe_unavailable_for_a_thin_event_is_accepted_and_the_drain_applies_it_once(make_app, config, db,
                                                                                      stripe_api, fault):
    app = make_app({**config, "PROVIDER_DEADLINE_MS": "300"})
    client = app.test_client()
    obj = _obj(intent_succeeded(_pi(), cents=300))
    stripe_api.put(obj)
    if fault == "hang":
        stripe_api.delay = 2.0
    else:
        stripe_api.fail_next(int(fault))
    evt = thin("v1.payment_intent.succeeded", obj)
    body, headers = thin_signed(evt)
    answer = send(client, body, headers)
    assert (answer.status, answer.json) == (202, {"status": "accepted", "event_id": evt["id"]})
    assert event_rows(db) == 0 and waiting_row(db, evt["id"]).body == body  # the exact bytes, committed
    stripe_api.delay = 0.0
    asked = len(stripe_api.requests)
    assert deliver(client, evt).json["status"] == "accepted"  # a re-delivery while it waits asks nothing
    assert len(stripe_api.requests) == asked
    assert drain(app, db) == 1
    assert balance(db, ALICE) == OPENING[ALICE] + 300
    assert stored_event_row(db, evt["id"]).status == "completed" and waiting_rows(db) == 0
    assert deliver(client, evt).json["status"] == "duplicate"
    assert len(stripe_api.requests) == asked + 1  # the drain's one fetch; the duplicate asked nothing
    assert_ledger_consistent(db)


def test_a_thin_event_that_moves_money_on_a_source_without_an_api_key_is_accepted_and_counted(make_app, config, db,
                                                                                              stripe_api):
    client = make_app({k: v for k, v in config.items() if k != "WEBHOOK_API_KEY"}).test_client()
    obj = _obj(intent_succeeded(_pi(), cents=300))
    stripe_api.put(obj)
    evt = thin("v1.payment_intent.succeeded", obj)
    answer = deliver(client, evt)
    assert (answer.status, answer.json["status"]) == (202, "accepted")
    assert event_rows(db) == 0
    assert "set WEBHOOK_API_KEY" in waiting_row(db, evt["id"]).last_error
    assert samples(client.get("/metrics").text)[
        ("webhook_ledger_provider_calls_total", (("provider", "stripe"), ("result", "no_api_key")))] == 1
    assert deliver(client, thin("v2.core.account.updated")).json["status"] == "processed"


@pytest.mark.parametrize("event_type", ["v2.core.account.updated", "v1.billing.meter.error_report_triggered",
                                        "v1.payment_intent.created"])
def test_a_thin_event_that_moves_no_money_is_stored_and_acknowledged_without_a_fetch(client, db, stripe_api,
                                                                                     event_type):
    asked = len(stripe_api.requests)
    evt = thin(event_type)
    evt["related_object"] = {"id": "acct_1Thing", "type": "v2.core.account", "url": "/v2/core/accounts/acct_1Thing"}
    assert deliver(client, evt).json["status"] == "processed"
    assert stored_event_row(db, evt["id"]).status == "completed"
    assert len(stripe_api.requests) == asked
    assert balance(db, ALICE) == OPENING[ALICE]


@pytest.mark.parametrize("change, message", [
    ({"related_object": {"id": "re_1", "type": "charge", "url": "/v1/charges/re_1"}}, "'related_object.type'"),
    ({"related_object": None}, "'related_object.type'"),
    ({"related_object": {"id": "", "type": "payment_intent", "url": "/v1/payment_intents/"}}, "'related_object.id'"),
    ({"context": "acct_1\r\nX-Injected: 1"}, "'context'"),
])
def test_a_thin_event_that_names_no_object_it_could_move_money_by_is_400(client, db, stripe_api, change, message):
    evt = {**thin("v1.payment_intent.succeeded", _obj(intent_succeeded(_pi()))), **change}
    answer = deliver(client, evt)
    assert (answer.status, answer.json["error"]) == (400, "invalid_event")
    assert message in answer.json["message"]
    assert event_rows(db) == 0


@pytest.mark.unit
def test_providers_stripe_listen_forwards_every_thin_event_that_moves_money():
    (listen,) = [e for e in readme.examples(ROOT / "docs" / "providers" / "stripe.md") if "--thin-events" in e.script]
    events = shlex.split(listen.script.replace("\\\n", " "))
    assert sorted(events[events.index("--thin-events") + 1].split(",")) == sorted(THIN_RULES)


def _history(pi):
    """One payment's life as Stripe's snapshot events tell it, in order: each event, and the object it carries
    (that object's state from then on): credited 900, refund A (300) counted then failed, refund B (200),
    the charge's running totals, a dispute (400) withdrawn then reinstated."""
    a, b, du = f"re_a{pi}", f"re_b{pi}", f"du_{pi}"
    withdrawn = dispute(du, pi, 400)
    reinstated = dispute(du, pi, 400, event_type="charge.dispute.funds_reinstated", status="won")
    steps = [intent_succeeded(pi, cents=900),
             refund(a, pi, 300, status="pending", event_type="refund.created"),
             charge_refunded(pi, 300, cents=900),
             refund(a, pi, 300, status="succeeded"),
             refund(b, pi, 200, status="succeeded", event_type="refund.created"),
             charge_refunded(pi, 500, cents=900),
             refund(a, pi, 300, status="failed"),
             withdrawn, reinstated]
    objects = [_obj(evt) for evt in steps]
    objects[7], objects[8] = _withdrawn(objects[7]), _withdrawn(objects[8], reinstated=True)
    return steps, objects


_THIN_TYPES = {"payment_intent.succeeded": "v1.payment_intent.succeeded", "charge.refunded": "v1.charge.refunded"}


def _state_at(objects, step, later):
    """The object of step's event as Stripe's API has it after step `later` (>= step)."""
    key = (objects[step]["object"], objects[step]["id"])
    return [obj for obj in objects[:later + 1] if (obj["object"], obj["id"]) == key][-1]


def _payment_ledger(db, pi):
    """What the ledger holds of one payment: its debit, and each movement's kind, amount and state."""
    debited = db.execute("SELECT debited_cents FROM payments WHERE payment_id = %s", [pi]).fetchone()[0]
    moves = db.execute("SELECT kind, amount_cents, state FROM movements WHERE payment_id = %s ORDER BY kind, "
                       "amount_cents", [pi]).fetchall()
    return debited, moves


def _deliver_until_applied(client, deliveries):
    """Deliver each in order, then again those answered 422 (a movement before its payment), as Stripe retries."""
    waiting = list(deliveries)
    for _ in range(len(deliveries) + 1):
        waiting = [d for d in waiting if send(client, *d).status == 422]
        if not waiting:
            return
    raise AssertionError(f"{len(waiting)} deliveries never applied")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_interleaving_of_snapshot_and_thin_events_gives_the_snapshot_only_ledger(client, db, stripe_api, data):
    """Every snapshot event and some of their thin twins, in any order, each thin one fetched in any state its
    object reaches at or after its event, on the platform's account or a connected one (snapshot events with
    `account`, thin ones with that `context`): the same debit and movements as the platform's snapshot events
    alone, in order."""
    alone, pi = _pi(), _pi()
    before = balance(db, ALICE)
    _deliver_until_applied(client, [stripe_signed(evt) for evt in _history(alone)[0]])
    expected = _payment_ledger(db, alone), balance(db, ALICE) - before
    account = data.draw(st.sampled_from([None, "acct_1Interleaved"]), label="account")
    steps, objects = _history(pi)
    if account is not None:  # as a Connect endpoint receives them (docs.stripe.com/connect/webhooks)
        for evt in steps:
            evt["account"] = account
    twins = data.draw(st.lists(st.integers(0, len(steps) - 1), unique=True), label="thin twins")
    seen = {i: data.draw(st.integers(i, len(steps) - 1), label=f"state of twin {i}") for i in twins}
    order = data.draw(st.permutations([("snapshot", i) for i in range(len(steps))] + [("thin", i) for i in twins]))
    before = balance(db, ALICE)
    waiting = []
    for kind, i in order:
        delivery = stripe_signed(steps[i])
        if kind == "thin":
            obj = _state_at(objects, i, seen[i])
            stripe_api.put(obj, account)  # Stripe's object, in its account, when this thin event is fetched
            delivery = thin_signed(thin(_THIN_TYPES.get(steps[i].type, "v1." + steps[i].type), obj,
                                        context=account, snapshot_event=steps[i].id))
        status = send(client, *delivery).status
        assert status in (200, 422)
        if status == 422:  # a movement before its payment: Stripe retries it later
            waiting.append(delivery)
    for obj in objects:  # by the retries, every object has reached its last state
        stripe_api.put(obj, account)
    _deliver_until_applied(client, waiting)
    key = pi if account is None else f"{account}/{pi}"
    assert (_payment_ledger(db, key), balance(db, ALICE) - before) == expected


def test_a_completed_thin_event_delivered_again_is_a_duplicate_without_asking_stripe(client, db, stripe_api,
                                                                                     redis_client):
    obj = _obj(intent_succeeded(_pi(), cents=400))
    stripe_api.put(obj)
    evt = thin("v1.payment_intent.succeeded", obj)
    assert deliver(client, evt).json["status"] == "processed"
    asked = len(stripe_api.requests)
    assert deliver(client, evt).json["status"] == "duplicate"  # the done marker decides
    redis_client.flushall()
    assert deliver(client, evt).json["status"] == "duplicate"  # the stored row decides
    assert len(stripe_api.requests) == asked
    assert balance(db, ALICE) == OPENING[ALICE] + 400
