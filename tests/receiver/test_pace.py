"""At the provider's pace (docs/design.md, "The provider's pace"): a notification whose money must be read from
Stripe's API, when Stripe cannot be asked now, is recorded and answered 202 accepted; the drain (app/receiver/drain.py)
applies it through the ledger's own apply_event, once, whoever else applies it. Thin bodies as
https://docs.stripe.com/api/v2/core/events/object shows them; Stripe's API is devservers/stripe_stand_in.py.
Real PostgreSQL and Redis."""

import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.receiver.drain import Drain
from app.store import waiting
from app.store.db import get_pool
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
    stored_event_row,
    waiting_row,
    waiting_rows,
)
from tests.providers.stripe.events import intent_succeeded, refund, thin, thin_signed

pytestmark = pytest.mark.core


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url,
            **UNMETERED}


def _paid(cents=500):
    """A PaymentIntent that succeeded, as Stripe's API has it, and its thin event."""
    obj = intent_succeeded(f"pi_{uuid.uuid4().hex[:24]}", cents=cents).data.object.to_dict()
    return obj, thin("v1.payment_intent.succeeded", obj)


def _accepted(client, stripe_api, evt, status=500):
    """Deliver evt while Stripe answers status: accepted."""
    stripe_api.fail_next(status)
    answer = send(client, *thin_signed(evt))
    assert (answer.status, answer.json["status"]) == (202, "accepted"), answer.json
    return answer


def test_a_waiting_notification_is_listed_shown_counted_and_verified(app, client, db, stripe_api):
    obj, evt = _paid(700)
    stripe_api.put(obj)
    _accepted(client, stripe_api, evt)
    cli = app.test_cli_runner()
    listed = cli.invoke(args=["events", "list", "--status", "waiting"]).output
    assert evt["id"] in listed and "waiting" in listed
    shown = cli.invoke(args=["events", "show", evt["id"]]).output
    assert "waits for its provider's record" in shown and "Stripe answered 500" in shown
    metrics = samples(client.get("/metrics").text)
    assert metrics[("webhook_ledger_waiting_notifications", (("source", "default"),))] == 1
    assert metrics[("webhook_ledger_waiting_oldest_seconds", (("source", "default"),))] >= 0
    verified = cli.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0 and "1 notifications accepted wait for their provider's record" in verified.output
    assert drain(app, db) == 1
    assert balance(db, ALICE) == OPENING[ALICE] + 700
    assert samples(client.get("/metrics").text)[("webhook_ledger_waiting_notifications", (("source", "default"),))] == 0
    assert "status:         completed" in cli.invoke(args=["events", "show", evt["id"]]).output


def test_a_claim_whose_host_died_expires_and_another_drain_applies_it_once(app, client, db, stripe_api):
    obj, evt = _paid(600)
    stripe_api.put(obj)
    _accepted(client, stripe_api, evt)
    assert len(waiting.claim(get_pool(app), 10, 30)) == 1  # a host claims it, then dies
    assert Drain(app).round() == 0  # claimed: no other drain takes it
    db.execute("UPDATE waiting_notifications SET not_before = now()")  # the claim's 30 s have passed
    assert Drain(app).round() == 1
    assert balance(db, ALICE) == OPENING[ALICE] + 600 and waiting_rows(db) == 0
    assert_ledger_consistent(db)


def test_two_drains_at_once_apply_each_notification_once_with_one_fetch_each(app, client, db, stripe_api):
    events = []
    for _ in range(30):
        obj, evt = _paid(100)
        stripe_api.put(obj)
        _accepted(client, stripe_api, evt)
        events.append(evt)
    asked = len(stripe_api.requests)
    barrier = threading.Barrier(2)

    def run():
        barrier.wait()
        rounds = Drain(app)
        while rounds.round():
            pass

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert waiting_rows(db) == 0
    assert len(stripe_api.requests) - asked == 30  # SKIP LOCKED: no notification claimed by both
    assert balance(db, ALICE) == OPENING[ALICE] + 3000
    assert_ledger_consistent(db)


def test_a_notification_stripe_does_not_have_when_drained_keeps_no_body_and_a_genuine_one_applies(app, client, db,
                                                                                                 stripe_api):
    obj, evt = _paid(900)  # Stripe has no such PaymentIntent (yet)
    _accepted(client, stripe_api, evt)
    assert drain(app, db) == 1
    kept = waiting_row(db, evt["id"])
    assert (kept.state, kept.body) == ("unknown", None) and event_rows(db) == 0
    assert app.test_cli_runner().invoke(args=["events", "replay", "--all-failed"]).exit_code == 0
    stripe_api.put(obj)
    assert send(client, *thin_signed(evt)).json["status"] == "processed"
    assert waiting_row(db, evt["id"]) is None and balance(db, ALICE) == OPENING[ALICE] + 900


def test_a_refund_drained_before_its_payment_is_tried_again_and_applies_once_the_payment_is_in(app, client, db,
                                                                                              stripe_api):
    obj, paid = _paid(1000)
    stripe_api.put(obj)
    re = refund(f"re_{obj['id'][3:]}", obj["id"], 300, status="succeeded", event_type="refund.created")
    re_obj = re.data.object.to_dict()
    stripe_api.put(re_obj)
    refunded = thin("v1.refund.created", re_obj)
    _accepted(client, stripe_api, refunded)
    assert Drain(app).round() == 0  # 422 in the ledger (its payment is not credited): it waits again
    assert waiting_row(db, refunded["id"]).state == "waiting"
    assert send(client, *thin_signed(paid)).json["status"] == "processed"
    assert drain(app, db) == 1
    assert balance(db, ALICE) == OPENING[ALICE] + 700
    assert_ledger_consistent(db)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_inline_and_drained_applications_in_any_interleaving_give_the_snapshot_only_ledger(app, client, db,
                                                                                           stripe_api, data):
    """A payment, two refunds (one fails later) as thin events, each delivered once or twice, each copy applied
    inline or accepted and drained at any later point: the snapshot ledger's balance, each movement once."""
    obj, paid = _paid(1000)
    stripe_api.put(obj)
    refunds = []
    for cents, final in ((300, "succeeded"), (200, "failed")):
        re = refund(f"re_{uuid.uuid4().hex[:24]}", obj["id"], cents, status=final, event_type="refund.created")
        re_obj = re.data.object.to_dict()
        stripe_api.put(re_obj)
        refunds.append(thin("v1.refund.created" if final == "succeeded" else "v1.refund.failed", re_obj))
    drain(app, db)  # an example starts with nothing waiting, whatever one before it left
    copies = [(evt, n) for evt in [paid, *refunds] for n in range(data.draw(st.integers(1, 2), label="copies"))]
    order = data.draw(st.permutations(copies), label="order")
    before = balance(db, ALICE)
    for evt, _ in order:
        if data.draw(st.booleans(), label=f"accept {evt['type']}"):
            stripe_api.fail_next(503)
        answer = send(client, *thin_signed(evt))
        stripe_api._faults.clear()  # unspent when this copy asked nothing (a duplicate, or one that waits)
        assert answer.status in (200, 202, 422), answer.json
        if data.draw(st.booleans(), label="drain now"):
            db.execute("UPDATE waiting_notifications SET not_before = now() WHERE state = 'waiting'")
            Drain(app).round()
    drain(app, db)
    for evt in [paid, *refunds]:  # Stripe retries what was answered 422; a 2xx is never sent again
        row = stored_event_row(db, evt["id"])
        if row is not None and row.status == "failed":
            assert send(client, *thin_signed(evt)).json["status"] == "processed"
    assert balance(db, ALICE) - before == 1000 - 300  # the failed refund took nothing in the end
    assert_ledger_consistent(db)
