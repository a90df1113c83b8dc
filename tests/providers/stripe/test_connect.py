"""Stripe Connect (app/providers/stripe.py's keys in an account, money.sql's account link, migration 005): a
connected account's events carry a top-level `account` (https://docs.stripe.com/connect/webhooks), a thin event
its `context`; its money is keyed in that account (acct_X/pi_Y, acct_X/re_Y, acct_X/du_Y, acct_X/cus_Y), so
that two accounts' ids never collide, and its event is fetched as that account (Stripe-Account, against
devservers/stripe_stand_in.py). Events built and signed by stripe-python; real PostgreSQL and Redis."""

import hashlib
import json
import logging
import socket
import uuid

import psycopg
import pytest
import stripe as stripe_sdk

from app.commands import base
from app.intake import events
from app.providers import stripe
from app.settings.config import Settings
from app.store import ledger
from app.store.db import apply_schema, get_pool
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import (
    ALICE,
    BOB,
    OPENING,
    SECRETS,
    assert_ledger_consistent,
    balance,
    before_012,
    db_url,
    event_rows,
    samples,
    send,
    source_secret,
    sources_config,
)
from tests.providers.stripe.events import (
    checkout_session,
    deliver,
    dispute,
    intent_succeeded,
    refund,
    thin,
    thin_signed,
)

pytestmark = pytest.mark.core

ACCOUNT, OTHER = "acct_1ConnectA", "acct_1ConnectB"


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url}


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def connected(evt, account=ACCOUNT):
    """evt as a Connect endpoint receives it from the connected account: with its top-level `account`."""
    evt["account"] = account
    return evt


def _pi():
    return f"pi_{uuid.uuid4().hex[:24]}"


def _obj(evt):
    return evt.data.object.to_dict()


def _payments(db):
    return db.execute("SELECT payment_id, user_id, amount_cents, debited_cents, customer_id FROM payments"
                      " ORDER BY payment_id").fetchall()


def _movements(db):
    return db.execute("SELECT kind, movement_id, payment_id, state FROM movements ORDER BY movement_id").fetchall()


def _consistent(client, db):
    assert_ledger_consistent(db, Settings.of(client.application).policy)


# Each movement in a connected account: (events before, its snapshot event, its thin type, the object Stripe has
# now, the balance change of all, the movement's row).
def _movement(name, pi, account=ACCOUNT):
    paid = connected(intent_succeeded(pi, cents=900), account)
    if name == "payment":
        return [], paid, "v1.payment_intent.succeeded", _obj(paid), 900, None
    if name == "refund succeeded":  # pending (counted), then succeeded: taken once
        pending = connected(refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created"), account)
        snapshot = connected(refund(f"re_{pi}", pi, 300, status="succeeded"), account)
        return [paid, pending], snapshot, "v1.refund.updated", _obj(snapshot), 600, ("refund", "applied")
    if name == "refund failed":  # counted, then failed: given back once
        pending = connected(refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created"), account)
        snapshot = connected(refund(f"re_{pi}", pi, 300, status="failed"), account)
        return [paid, pending], snapshot, "v1.refund.failed", _obj(snapshot), 900, ("refund", "reversed")
    if name == "dispute withdrawn":
        snapshot = connected(dispute(f"du_{pi}", pi, 400), account)
        obj = {**_obj(snapshot), "balance_transactions": [{"id": f"txn_w{pi}", "amount": -400, "currency": "usd"}]}
        return [paid], snapshot, "v1.charge.dispute.funds_withdrawn", obj, 500, ("dispute", "applied")
    if name == "dispute reinstated":
        withdrawn = connected(dispute(f"du_{pi}", pi, 400), account)
        snapshot = connected(dispute(f"du_{pi}", pi, 400, event_type="charge.dispute.funds_reinstated",
                                     status="won"), account)
        obj = {**_obj(snapshot), "balance_transactions": [{"id": f"txn_w{pi}", "amount": -400, "currency": "usd"},
                                                          {"id": f"txn_r{pi}", "amount": 400, "currency": "usd"}]}
        return [paid, withdrawn], snapshot, "v1.charge.dispute.funds_reinstated", obj, 900, ("dispute", "reversed")
    raise AssertionError(name)


# That platform event's effect hash under effect version 6, release 1.0's: accounts leave it unchanged.
PLATFORM_SHA256 = "47395dd904b438a6ae10bfbb377d287bd1c98e7834db59246df0d7e57e105e48"
MOVEMENTS = ["payment", "refund succeeded", "refund failed", "dispute withdrawn", "dispute reinstated"]
PREFIX = {"refund": "re", "dispute": "du"}


@pytest.mark.parametrize("name", MOVEMENTS)
def test_each_movement_of_a_connected_account_moves_its_money_once_under_keys_in_its_account(client, db, name):
    pi = _pi()
    before, snapshot, _, _, change, movement = _movement(name, pi)
    for evt in [*before, snapshot]:
        assert deliver(client, evt).json["status"] == "processed"
        assert deliver(client, evt).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + change
    assert _payments(db) == [(f"{ACCOUNT}/{pi}", ALICE, 900, 900 - change, None)]
    if movement:
        kind, state = movement
        assert _movements(db) == [(kind, f"{ACCOUNT}/{PREFIX[kind]}_{pi}", f"{ACCOUNT}/{pi}", state)]
    _consistent(client, db)


@pytest.mark.parametrize("thin_first", [True, False], ids=["thin first", "snapshot first"])
@pytest.mark.parametrize("name", MOVEMENTS)
def test_a_connected_accounts_thin_event_and_its_snapshot_twin_move_the_money_once(client, db, stripe_api, name,
                                                                                   thin_first):
    """The thin event names the account in its context, its snapshot twin in `account`: one key, one movement."""
    before, snapshot, thin_type, obj, change, _ = _movement(name, _pi())
    for evt in before:
        deliver(client, evt)
    stripe_api.put(obj, context=ACCOUNT)
    first, second = [thin(thin_type, obj, context=ACCOUNT, snapshot_event=snapshot.id), snapshot][
        ::1 if thin_first else -1]
    assert deliver(client, first).json["status"] == "processed"
    assert deliver(client, second).json["status"] in ("processed", "duplicate")  # a credit's twin: duplicate
    assert balance(db, ALICE) == OPENING[ALICE] + change
    assert stripe_api.requests[-1]["context"] == ACCOUNT  # either way the thin one is fetched, in its account
    _consistent(client, db)


def test_a_thin_destination_moved_from_the_connect_endpoint_keys_the_account_alike(make_app, config, db, stripe_api):
    """The thin destination on its own route, its events the Connect endpoint's (_MOVED_FROM): one movement."""
    client = make_app(sources_config(config, {"thin": "stripe"}, WEBHOOK_THIN_MOVED_FROM="default",
                                     WEBHOOK_THIN_API_KEY=API_KEY)).test_client()
    before, snapshot, thin_type, obj, change, _ = _movement("refund succeeded", _pi())
    for evt in before:
        deliver(client, evt)
    stripe_api.put(obj, context=ACCOUNT)
    thin_evt = thin(thin_type, obj, context=ACCOUNT, snapshot_event=snapshot.id)
    assert send(client, *thin_signed(thin_evt, source_secret("thin", "stripe")), source="thin").json[
        "status"] == "processed"
    assert deliver(client, snapshot).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + change
    _consistent(client, db)


def test_two_accounts_and_the_platform_with_the_same_ids_each_move_their_own_money(client, db):
    pi = _pi()
    for account, user, cents in ((ACCOUNT, ALICE, 900), (OTHER, BOB, 500), (None, BOB, 300)):
        paid = intent_succeeded(pi, user=user, cents=cents)
        pending = refund(f"re_{pi}", pi, 100, status="pending", event_type="refund.created")
        for evt in (paid, pending):
            answer = deliver(client, evt if account is None else connected(evt, account))
            assert answer.json == {"status": "processed", "event_id": evt.id}
    withdrawn = connected(dispute(f"du_{pi}", pi, 500), OTHER)  # the whole of OTHER's, nothing of the others'
    assert deliver(client, withdrawn).json["status"] == "processed"
    assert [row[:4] for row in _payments(db)] == [
        (f"{ACCOUNT}/{pi}", ALICE, 900, 100), (f"{OTHER}/{pi}", BOB, 500, 500), (pi, BOB, 300, 100)]
    assert balance(db, ALICE) == OPENING[ALICE] + 800
    assert balance(db, BOB) == OPENING[BOB] + 0 + 200
    _consistent(client, db)


def test_a_platform_event_keeps_the_keys_and_effect_it_always_had(client, db):
    evt = intent_succeeded("pi_platform", cents=400, customer="cus_plain")
    effect = events.effect_of(events.parse(str(evt).encode(), "stripe"))
    assert (effect.payment_id, effect.customer_id) == ("pi_platform", "cus_plain")
    assert effect.sha256.hex() == PLATFORM_SHA256  # effect version 6's hash of it, as release 1.0 stored it
    assert deliver(client, evt).json["status"] == "processed"
    assert _payments(db) == [("pi_platform", ALICE, 400, 0, None)]


# -- which user: the metadata, the customer's link, the payment's own, the account's link, the assignment ----------

def test_an_account_link_credits_a_payment_whose_customer_has_no_link(client, db, run):
    assert run("users", "link", "default", ACCOUNT, str(BOB), "--by", "ops").exit_code == 0
    pi = _pi()
    evt = connected(intent_succeeded(pi, cents=700, customer="cus_guest", metadata={}))
    assert deliver(client, evt).json["status"] == "processed"
    assert _payments(db) == [(f"{ACCOUNT}/{pi}", BOB, 700, 0, ACCOUNT)]
    assert balance(db, BOB) == OPENING[BOB] + 700
    _consistent(client, db)


def test_the_metadata_then_the_customers_link_name_the_user_before_the_accounts_link(client, db, run):
    run("users", "link", "default", ACCOUNT, str(BOB), "--by", "ops")
    run("users", "link", "default", f"{ACCOUNT}/cus_known", str(ALICE), "--by", "ops")
    run("users", "link", "default", "cus_known", str(BOB), "--by", "ops")  # the platform's cus_known: another one
    named, known = _pi(), _pi()
    deliver(client, connected(intent_succeeded(named, user=ALICE, cents=100, customer="cus_other")))
    deliver(client, connected(intent_succeeded(known, cents=200, customer="cus_known", metadata={})))
    assert _payments(db) == sorted([(f"{ACCOUNT}/{named}", ALICE, 100, 0, None),
                                    (f"{ACCOUNT}/{known}", ALICE, 200, 0, f"{ACCOUNT}/cus_known")])
    _consistent(client, db)


def test_a_checkout_payment_credited_to_its_session_user_is_not_given_to_the_accounts_link(client, db, run):
    run("users", "link", "default", ACCOUNT, str(BOB), "--by", "ops")
    pi = _pi()
    assert deliver(client, connected(checkout_session(pi, user=ALICE, cents=600))).json["status"] == "processed"
    guest = connected(intent_succeeded(pi, cents=600, metadata={}))
    assert deliver(client, guest).json["status"] == "duplicate"
    assert _payments(db) == [(f"{ACCOUNT}/{pi}", ALICE, 600, 0, None)]
    _consistent(client, db)


def test_linking_an_account_names_the_events_waiting_for_it_and_the_retry_applies_them(client, db, run):
    evt = connected(intent_succeeded(_pi(), cents=500, metadata={}))
    answer = deliver(client, evt)
    assert answer.status == 422
    assert f"account {ACCOUNT} is linked to no user (flask users link default {ACCOUNT} USER_ID)" in \
        answer.json["message"]
    platform = intent_succeeded(_pi(), cents=500, metadata={})  # the platform's: not the account's to name
    assert deliver(client, platform).status == 422
    linked = run("users", "link", "default", ACCOUNT, str(BOB), "--by", "ops")
    assert linked.exit_code == 0, linked.output
    assert linked.output == (f"linked account {ACCOUNT} of source default to user {BOB}\n"
                             f"  event {evt.id} is failed for want of it: flask events replay {evt.id}\n")
    assert deliver(client, evt).json["status"] == "processed"  # Stripe's retry
    assert balance(db, BOB) == OPENING[BOB] + 500
    assert "account acct_1ConnectA of source default" in run("users", "show", str(BOB)).output
    assert run("ledger", "verify").exit_code == 0


@pytest.mark.parametrize("named", ["acct_", "acct_1/", "acct_x-y/cus_1", "cus_1/cus_2", "acct_1//cus_1",
                                   "acct_1/cus_1/cus_2", "acct_1/ cus_1"])
def test_a_link_of_something_that_is_no_account_nor_its_customer_is_refused(db, run, named):
    refused = run("users", "link", "default", named, str(BOB), "--by", "ops")
    assert refused.exit_code == 2 and "connected account" in refused.output
    assert db.execute("SELECT count(*) FROM customer_links").fetchone() == (0,)


# -- the account, checked; the event fetched in it ---------------------------------------------------------------

@pytest.mark.parametrize("account", [42, "", "acct_", "acct_1-2", "cus_1", "acct_1/acct_2", "acct_" + "a" * 251])
def test_an_event_whose_account_is_not_a_connected_accounts_id_is_400_and_writes_nothing(client, db, account):
    document = {**json.loads(str(intent_succeeded(_pi(), cents=300))), "account": account}
    answer = deliver(client, document)  # a dict: its JSON, signed by stripe-python's signer
    assert (answer.status, answer.json["error"]) == (400, "invalid_event")
    assert "'account' must be a connected account's id" in answer.json["message"]
    assert event_rows(db) == 0 and balance(db, ALICE) == OPENING[ALICE]


@pytest.mark.parametrize("context", ["foo", "acct_", "cus_1", "acct_1/foo", "foo/acct_1"])
def test_a_thin_event_whose_context_is_not_a_path_of_accounts_ids_is_400_and_asks_stripe_nothing(client, db, stripe_api,
                                                                                                 context):
    asked = len(stripe_api.requests)
    answer = deliver(client, thin("v1.payment_intent.succeeded", _obj(intent_succeeded(_pi())), context=context))
    assert (answer.status, answer.json["error"]) == (400, "invalid_event")
    assert "'context' must be an account context" in answer.json["message"]
    assert event_rows(db) == 0 and len(stripe_api.requests) == asked


def test_stripe_python_retrieves_a_connect_event_and_object_from_the_stand_in_only_as_their_account(stripe_api):
    evt = connected(intent_succeeded(_pi(), cents=450))
    stripe_api.add(evt)
    stripe_api.put(_obj(evt), context=ACCOUNT)
    client = stripe_sdk.StripeClient(API_KEY, base_addresses={"api": stripe_api.url})
    as_account = {"stripe_account": ACCOUNT}
    assert client.v1.events.retrieve(evt.id, options=as_account).account == ACCOUNT
    assert client.v1.payment_intents.retrieve(evt.data.object.id, options=as_account).amount_received == 450
    for options in ({"stripe_account": OTHER}, None):  # another account's, and the platform's own: Stripe's 404
        with pytest.raises(stripe_sdk.InvalidRequestError, match="No such"):
            client.v1.events.retrieve(evt.id, options=options)
        with pytest.raises(stripe_sdk.InvalidRequestError, match="No such"):
            client.v1.payment_intents.retrieve(evt.data.object.id, options=options)


@pytest.fixture
def fetching(make_app, config):
    return make_app({**config, "WEBHOOK_FETCH": "true"}).test_client()


def test_a_fetching_source_asks_stripe_for_a_connect_event_as_its_account(fetching, db, stripe_api):
    evt, platform = connected(intent_succeeded(_pi(), cents=450)), intent_succeeded(_pi(), cents=50)
    stripe_api.add(evt, platform)
    assert deliver(fetching, evt).json["status"] == "processed"
    assert stripe_api.requests[-1] == {"id": evt.id, "account": ACCOUNT}
    assert deliver(fetching, platform).json["status"] == "processed"
    assert stripe_api.requests[-1] == {"id": platform.id, "account": None}
    assert balance(db, ALICE) == OPENING[ALICE] + 500
    _consistent(fetching, db)


def test_a_connect_event_delivered_as_another_accounts_is_one_stripe_does_not_have(fetching, db, stripe_api):
    evt = connected(intent_succeeded(_pi(), cents=450))
    stripe_api.add(evt)
    answer = deliver(fetching, connected(intent_succeeded(evt.data.object.id, cents=450, event_id=evt.id), OTHER))
    assert (answer.status, answer.json["error"]) == (422, "unprocessable")
    assert f"Stripe's API has no event {evt.id}" in answer.json["message"]
    assert balance(db, ALICE) == OPENING[ALICE]
    assert deliver(fetching, evt).json["status"] == "processed"  # the genuine one replaces the unknown effect
    assert balance(db, ALICE) == OPENING[ALICE] + 450


class IgnoresStripeAccount(StripeStandIn):
    """A Stripe that answers an event as its owner's (owners: id -> account) whatever account asks: what the fetch
    step must not trust blindly."""

    owners: dict[str, str] = {}

    def retrieve_event(self, event_id, account=None):
        return super().retrieve_event(event_id, self.owners.get(event_id, account))


def test_an_event_fetched_in_another_account_than_delivered_contradicts_it_and_decides(make_app, config, db):
    with IgnoresStripeAccount() as hostile:
        client = make_app({**config, "WEBHOOK_FETCH": "true", "STRIPE_API_BASE": hostile.url}).test_client()
        pi = _pi()
        kept = connected(intent_succeeded(pi, cents=450), OTHER)
        hostile.add(kept)
        hostile.owners = {kept.id: OTHER}
        delivered = connected(intent_succeeded(pi, cents=450, event_id=kept.id), ACCOUNT)
        assert deliver(client, delivered).json["status"] == "processed"
        assert hostile.requests[-1] == {"id": kept.id, "account": ACCOUNT}
    assert [row[0] for row in _payments(db)] == [f"{OTHER}/{pi}"]  # Stripe's record of the event decides
    assert samples(client.get("/metrics").text)[
        ("webhook_ledger_provider_contradictions_total", (("source", "default"),))] == 1
    _consistent(client, db)


# -- the upgrade: a 1.0 ledger held connected accounts' money under bare keys --------------------------------------

def _as_1_0_applied_it(app, evt, policy):
    """evt applied as release 1.0 did: its bytes of record (with `account`) stored, its money keyed bare."""
    event = events.parse(str(evt).encode(), "stripe")
    bare = json.loads(str(evt))
    bare.pop("account", None)
    effect = events.effect_of(events.parse(json.dumps(bare).encode(), "stripe"), policy)
    result = ledger.apply_event(get_pool(app), event, effect, hashlib.sha256(event.body).digest(), policy)
    assert result.outcome == "processed", result


def _thin_as_before_connect_applied_it(app, document, obj, policy):
    """A thin event applied as a ledger before 005 held it: its related object fetched in its context and kept, its
    money keyed bare."""
    event = events.parse(json.dumps(document).encode(), "stripe")
    effect = events.effect_of(stripe.with_related(events.parse(json.dumps({**document, "context": None}).encode(),
                                                               "stripe"), obj), policy)
    result = ledger.apply_event(get_pool(app), stripe.with_related(event, obj), effect,
                                hashlib.sha256(event.body).digest(), policy, fetched=json.dumps(obj).encode())
    assert result.outcome == "processed", result


def _back_to_the_previous_migration(db):
    """db as 004 left it: 005 not recorded, effects of version 6 (ledger_delivery's extra attribute is dropped by
    005 itself, with every function that takes it), and 012 not applied (it journals 005's moves)."""
    before_012(db)
    db.execute("DELETE FROM schema_migrations WHERE name = '005_connect_accounts.sql'")
    db.execute("ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 6")
    db.execute("UPDATE webhook_events SET effect_version = 6")


def test_a_1_0_ledgers_connected_payment_is_rekeyed_and_its_later_refund_and_dispute_debit_it_once(app, client, db,
                                                                                                    run):
    policy = Settings.of(app).policy
    pi, linked, thin_paid = _pi(), _pi(), _pi()
    run("users", "link", "default", "cus_old", str(BOB), "--by", "ops")  # 1.0's bare link, read for acct's cus_old
    paid = connected(intent_succeeded(pi, cents=900))
    pending = connected(refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created"))
    by_link = connected(intent_succeeded(linked, cents=200, customer="cus_old", metadata={}))
    platform = intent_succeeded(_pi(), cents=100)
    for evt in (paid, pending, by_link, platform):
        _as_1_0_applied_it(app, evt, policy)
    paid_thin = _obj(intent_succeeded(thin_paid, cents=50))
    _thin_as_before_connect_applied_it(app, thin("v1.payment_intent.succeeded", paid_thin, context=ACCOUNT),
                                       paid_thin, policy)
    assert balance(db, ALICE) == OPENING[ALICE] + 600 + 100 + 50 and balance(db, BOB) == OPENING[BOB] + 200
    _back_to_the_previous_migration(db)

    assert run("init-db").exit_code == 0

    assert _payments(db) == sorted([(f"{ACCOUNT}/{pi}", ALICE, 900, 300, None),
                                    (f"{ACCOUNT}/{linked}", BOB, 200, 0, f"{ACCOUNT}/cus_old"),
                                    (f"{ACCOUNT}/{thin_paid}", ALICE, 50, 0, None),
                                    (platform.data.object.id, ALICE, 100, 0, None)])
    assert _movements(db) == [("refund", f"{ACCOUNT}/re_{pi}", f"{ACCOUNT}/{pi}", "applied")]
    # The journal is append-only: its rows keep their keys, a payment_moved row says each move, and the rows are
    # read under the keys in the account (ledger_journal_keyed, what verify reads).
    assert db.execute("SELECT payment_id, movement_id FROM ledger_journal WHERE kind = 'refund'").fetchall() == [
        (pi, f"re_{pi}")]
    assert db.execute("SELECT payment_id, movement_id FROM ledger_journal_keyed WHERE kind = 'refund'").fetchall() == [
        (f"{ACCOUNT}/{pi}", f"{ACCOUNT}/re_{pi}")]
    assert sorted(db.execute("SELECT payment_id, moved_from, user_id, amount_cents, actor FROM ledger_journal"
                             " WHERE kind = 'payment_moved'").fetchall()) == sorted(
        [(f"{ACCOUNT}/{key}", key, user, 0, "migration 005_connect_accounts.sql")
         for key, user in ((pi, ALICE), (linked, BOB), (thin_paid, ALICE))])
    assert run("ledger", "verify").exit_code == 0
    # The refund's later states, and a dispute, arrive with `account`: each takes the payment's money once.
    assert deliver(client, pending).json["status"] == "duplicate"
    succeeded = connected(refund(f"re_{pi}", pi, 300, status="succeeded"))
    assert deliver(client, succeeded).json["status"] == "processed"
    assert deliver(client, connected(dispute(f"du_{pi}", pi, 400))).json["status"] == "processed"
    thin_refund = connected(refund(f"re_{thin_paid}", thin_paid, 50, status="succeeded"))
    assert deliver(client, thin_refund).json["status"] == "processed"  # the thin-credited payment found too
    assert balance(db, ALICE) == OPENING[ALICE] + 900 - 300 - 400 + 100
    assert (f"{ACCOUNT}/{pi}", ALICE, 900, 700, None) in _payments(db)
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output
    _consistent(client, db)


def test_migration_005_keeps_bare_a_payment_whose_movements_key_would_be_over_128_characters_in_its_account(
        app, db, run):
    """The live rule refuses such a key (422); the upgrade keeps the payment and its movements bare, whole, and
    completes (a CHECK on movements would stop it)."""
    policy = Settings.of(app).policy
    pi, long_refund = _pi(), "re_" + "x" * (128 - len(ACCOUNT))  # 117 characters; 132 in the account
    for evt in (connected(intent_succeeded(pi, cents=900)),
                connected(refund(long_refund, pi, 300, status="pending", event_type="refund.created"))):
        _as_1_0_applied_it(app, evt, policy)
    _back_to_the_previous_migration(db)
    upgraded = run("init-db")
    assert upgraded.exit_code == 0, upgraded.output
    assert _payments(db) == [(pi, ALICE, 900, 300, None)]
    assert _movements(db) == [("refund", long_refund, pi, "applied")]


def test_a_customer_linked_bare_under_1_0_whose_events_were_purged_is_credited_its_next_payment_in_the_account(
        app, client, db, run):
    """005 links such a customer in its account from a stored event naming it; with none left (purged), the rule
    reads the 1.0 link as 1.0 did. A bare link made after the upgrade stays the platform's."""
    run("users", "link", "default", "cus_renews", str(BOB), "--by", "ops")
    _as_1_0_applied_it(app, connected(intent_succeeded(_pi(), cents=700, customer="cus_renews", metadata={})),
                       Settings.of(app).policy)
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    assert "purged 1 completed events" in run("events", "purge").output
    _back_to_the_previous_migration(db)
    assert run("init-db").exit_code == 0
    assert db.execute("SELECT customer_id FROM customer_links").fetchall() == [("cus_renews",)]  # no account read

    renewal = connected(intent_succeeded(_pi(), cents=700, customer="cus_renews", metadata={}))
    assert deliver(client, renewal).json["status"] == "processed"
    assert deliver(client, renewal).json["status"] == "duplicate"
    assert balance(db, BOB) == OPENING[BOB] + 700 + 700
    run("users", "link", "default", "cus_later", str(BOB), "--by", "ops")
    answer = deliver(client, connected(intent_succeeded(_pi(), cents=100, customer="cus_later", metadata={})))
    assert answer.status == 422 and f"customer {ACCOUNT}/cus_later is linked to no user" in answer.json["message"]
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output
    assert balance(db, BOB) == OPENING[BOB] + 1400


def test_migration_005_leaves_a_ledger_without_connected_accounts_as_it_was(app, client, db):
    deliver(client, intent_succeeded("pi_platform_only", cents=100))
    before = _payments(db), db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()
    _back_to_the_previous_migration(db)
    assert apply_schema(db)[1] == ["005_connect_accounts.sql", "012_journal_payment_moves.sql"]
    assert (_payments(db), db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()) == before


# -- flask payments move-to-account: a payment the upgrade could not place (its events purged) ---------------------

MONEY_TABLES = ("payments", "movements", "ledger_journal", "payment_users", "ignored_payments", "customer_links",
                "user_balances", "webhook_events")


def _tables(db):
    return {table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in MONEY_TABLES}


def _left_bare_by_the_upgrade(app, db, run, pi=None):
    """A 1.0 ledger's connected payment (900 cents to ALICE, a pending refund of 300 taken), its events purged
    (retention) before the upgrade: migration 005 cannot read its account and keeps it bare, pi."""
    pi = pi or _pi()
    policy = Settings.of(app).policy
    for evt in (connected(intent_succeeded(pi, cents=900)),
                connected(refund(f"re_{pi}", pi, 300, status="pending", event_type="refund.created"))):
        _as_1_0_applied_it(app, evt, policy)
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    assert "purged 2 completed events" in run("events", "purge").output
    _back_to_the_previous_migration(db)
    assert run("init-db").exit_code == 0
    assert _payments(db) == [(pi, ALICE, 900, 300, None)]
    return pi


def test_a_payment_the_upgrade_left_bare_is_moved_into_its_account_and_its_waiting_movements_debit_it_once(
        app, client, db, run):
    pi = _left_bare_by_the_upgrade(app, db, run)
    succeeded = connected(refund(f"re_{pi}", pi, 300, status="succeeded"))
    withdrawn = connected(dispute(f"du_{pi}", pi, 400))
    for evt in (succeeded, withdrawn):
        answer = deliver(client, evt)
        assert (answer.status, answer.json["message"].split(";")[0]) == (422, f"unknown payment {ACCOUNT}/{pi}")
        assert f"flask payments move-to-account default {pi} {ACCOUNT}" in answer.json["message"]
    moved = run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops")
    assert moved.exit_code == 0, moved.output
    assert moved.output == (f"moved payment {pi} of source default into account {ACCOUNT}: {ACCOUNT}/{pi}, "
                            "with 1 movement and 2 journal rows read under it (by ops)\n"
                            f"  event {succeeded.id}: processed\n  event {withdrawn.id}: processed\n")
    assert _payments(db) == [(f"{ACCOUNT}/{pi}", ALICE, 900, 700, None)]
    assert _movements(db) == [("dispute", f"{ACCOUNT}/du_{pi}", f"{ACCOUNT}/{pi}", "applied"),
                              ("refund", f"{ACCOUNT}/re_{pi}", f"{ACCOUNT}/{pi}", "applied")]
    assert balance(db, ALICE) == OPENING[ALICE] + 900 - 300 - 400
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output
    for evt in (succeeded, withdrawn):
        assert deliver(client, evt).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + 900 - 300 - 400  # (_consistent reads credits of stored events)


def test_move_to_account_writes_who_moved_it_to_the_system_log_not_into_its_output(app, db, run, capfd, monkeypatch,
                                                                                  tmp_path):
    """Issue 44: its output is for the person who ran it (it says who moved it); the audit line goes to the system log
    (journald's socket on a systemd host), one JSON line tagged webhook-ledger, and into neither stdout nor stderr."""
    pi = _left_bare_by_the_upgrade(app, db, run)
    system_log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    system_log.bind(str(tmp_path / "log"))
    system_log.settimeout(10)
    monkeypatch.setattr(base, "SYSTEM_LOG", str(tmp_path / "log"))
    audit = logging.getLogger(base.AUDIT)
    capfd.readouterr()
    try:
        moved = run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops")
        assert (moved.exit_code, moved.output) == (0, f"moved payment {pi} of source default into account {ACCOUNT}: "
                                                      f"{ACCOUNT}/{pi}, with 1 movement and 2 journal rows read under "
                                                      "it (by ops)\n")
        assert capfd.readouterr() == ("", "")
        tag, line = system_log.recv(65536).decode().rstrip("\x00").split(": ", 1)  # the NUL SysLogHandler ends with
    finally:
        for handler in audit.handlers:
            handler.close()
        audit.handlers.clear()
        audit.propagate = True
        system_log.close()
    assert tag == "<14>webhook-ledger"  # facility user (1) * 8 + severity info (6), RFC 3164
    assert json.loads(line)["message"] == f"payment {pi} of source default moved into account {ACCOUNT} by ops"


def test_moving_a_payment_appends_one_journal_row_the_feed_gives_once_and_changes_none(app, db, run):
    """The journal is append-only and its feed gives each row once: the move is a payment_moved row of 0 cents
    naming both keys and who moved it; the payment's earlier rows keep theirs and are not given again."""
    pi = _left_bare_by_the_upgrade(app, db, run)
    before = db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()
    cursor = db.execute("SELECT cursor FROM journal_changes(NULL, 1000) ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops").exit_code == 0
    after = db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()
    assert after[:len(before)] == before
    given = db.execute("SELECT id, kind, payment_id, moved_from, user_id, amount_cents FROM journal_changes(%s, 1000)",
                       [cursor]).fetchall()
    assert given == [(after[-1][0], "payment_moved", f"{ACCOUNT}/{pi}", pi, ALICE, 0)] and len(after) == len(before) + 1
    assert db.execute("SELECT actor FROM ledger_journal WHERE kind = 'payment_moved'").fetchone() == ("ops",)
    shown = run("users", "show", str(ALICE)).output.splitlines()[-1].split()
    assert shown[2:] == ["payment_moved", "+0", f"{ACCOUNT}/{pi}", "ops:", "moved", "from", pi]
    assert db.execute("SELECT payment_id, movement_id FROM ledger_journal_keyed WHERE kind = 'refund'").fetchall() == [
        (f"{ACCOUNT}/{pi}", f"{ACCOUNT}/re_{pi}")]
    assert balance(db, ALICE) == OPENING[ALICE] + 900 - 300
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output


def test_the_keyed_journal_reads_the_rows_before_a_keys_move_under_the_key_moved_to_and_a_key_moves_once(db):
    """A bare payment credited again after its key moved is another payment: its rows stay bare."""
    rows = [("credit", "evt_1", None, 100), ("payment_moved", None, "acct_A/pi_Z", 0), ("credit", "evt_2", None, 200)]
    insert = ("INSERT INTO ledger_journal (kind, source, event_id, payment_id, moved_from, actor, user_id,"
              " amount_cents) VALUES (%s, 'default', %s, %s, %s, %s, %s, %s)")
    for kind, event_id, moved_to, cents in rows:
        db.execute(insert, [kind, event_id, moved_to or "pi_Z", moved_to and "pi_Z", moved_to and "ops", ALICE, cents])
    assert db.execute("SELECT event_id, payment_id FROM ledger_journal_keyed WHERE kind = 'credit' ORDER BY id"
                      ).fetchall() == [("evt_1", "acct_A/pi_Z"), ("evt_2", "pi_Z")]
    assert db.execute("SELECT count(*) FROM ledger_journal_keyed").fetchone()[0] == len(rows)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(insert, ["payment_moved", None, "acct_B/pi_Z", "pi_Z", "ops", ALICE, 0])


def test_a_moved_payment_credited_through_its_customers_bare_link_keeps_it_in_the_account(app, client, db, run):
    """As migration 005 does: customer_id in the account, and the bare link copied there; verify clean."""
    run("users", "link", "default", "cus_old", str(BOB), "--by", "ops")
    pi = _pi()
    _as_1_0_applied_it(app, connected(intent_succeeded(pi, cents=200, customer="cus_old", metadata={})),
                       Settings.of(app).policy)
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    run("events", "purge")
    _back_to_the_previous_migration(db)
    assert run("init-db").exit_code == 0
    assert run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops").exit_code == 0
    assert _payments(db) == [(f"{ACCOUNT}/{pi}", BOB, 200, 0, f"{ACCOUNT}/cus_old")]
    assert db.execute("SELECT customer_id, user_id FROM customer_links ORDER BY 1").fetchall() == [
        (f"{ACCOUNT}/cus_old", BOB), ("cus_old", BOB)]
    assert deliver(client, connected(refund(f"re_{pi}", pi, 50))).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB] + 150
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output


def test_moving_a_payment_twice_refuses_the_second_changing_nothing(app, db, run):
    pi = _left_bare_by_the_upgrade(app, db, run)
    assert run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops").exit_code == 0
    before = _tables(db)
    again = run("payments", "move-to-account", "default", pi, ACCOUNT, "--by", "ops")
    assert again.exit_code == 1
    assert f"payment {pi} of source default is in account {ACCOUNT} already ({ACCOUNT}/{pi})" in again.output
    assert _tables(db) == before


def _stored_elsewhere(client, pi, account):
    """An event of pi stored with another account than ACCOUNT (None: the platform's own)."""
    evt = dispute(f"du_{pi}", pi, 100)
    deliver(client, evt if account is None else connected(evt, account))
    return evt.id


@pytest.mark.parametrize("case, says", [
    ("unknown", "unknown payment pi_nope of source default"),
    ("in an account", f"payment {ACCOUNT}/PI is keyed in account {ACCOUNT} already"),
    ("exists in the account", f"payment {ACCOUNT}/PI of source default exists already: it and PI would be one "
                              "payment credited twice"),
    ("an event of another account", f"event EVT of payment PI names account {OTHER}, not {ACCOUNT}"),
    ("an event of no account", "event EVT of payment PI names no account (the platform's own)"),
    ("over the limit", f"over {events.MAX_ID_CHARS} characters"),
])
def test_move_to_account_refuses_in_one_line_changing_nothing(app, client, db, run, case, says, monkeypatch):
    long_pi = "pi_" + "x" * (events.MAX_ID_CHARS - 6)  # it and its refund re_pi fit bare, not in the account
    pi = _left_bare_by_the_upgrade(app, db, run, long_pi if case == "over the limit" else None)
    if case == "over the limit":  # the guard, at a bound a key can reach: an account's and 1.0's ids cannot pass 511
        monkeypatch.setattr(ledger, "MAX_KEY_CHARS", events.MAX_ID_CHARS)
    evt_id = ""
    if case == "exists in the account":  # a credit of it, in its account, by an event that was never purged
        deliver(client, connected(intent_succeeded(pi, cents=900, event_id="evt_session_credit")))
    elif case == "an event of another account":
        evt_id = _stored_elsewhere(client, pi, OTHER)
    elif case == "an event of no account":
        evt_id = _stored_elsewhere(client, pi, None)
    payment_id = {"unknown": "pi_nope", "in an account": f"{ACCOUNT}/{pi}"}.get(case, pi)
    before = _tables(db)
    refused = run("payments", "move-to-account", "default", payment_id, ACCOUNT, "--by", "ops")
    assert refused.exit_code == 1, refused.output
    assert says.replace("EVT", evt_id).replace("PI", pi) in refused.output and "nothing moved" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert _tables(db) == before


@pytest.mark.parametrize("account", ["acct_", "cus_1", "acct_1/acct_2", "acct_1-2"])
def test_move_to_account_refuses_what_is_not_a_connected_accounts_id(app, db, run, account):
    pi = _left_bare_by_the_upgrade(app, db, run)
    before = _tables(db)
    refused = run("payments", "move-to-account", "default", pi, account, "--by", "ops")
    assert refused.exit_code == 2 and "connected account" in refused.output
    assert _tables(db) == before
