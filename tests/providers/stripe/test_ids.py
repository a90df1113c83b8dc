"""Stripe-generated ids of up to 255 characters (https://docs.stripe.com/upgrades, "Backwards-compatible changes":
"Make sure that your integration can handle Stripe-generated object IDs, which can contain up to 255
characters"): an event, its PaymentIntent and its refund with ids that long move their money once, on the platform
and in a connected account (whose id is a Stripe-generated id too); one character more is refused as before: 400
for an event's id or account, 422 for an object's id. Events built and signed by stripe-python; real PostgreSQL
and Redis."""

import pytest

from app.intake import events
from app.settings.config import Settings
from tests.helpers import ALICE, OPENING, assert_ledger_consistent, balance, event_rows
from tests.providers.stripe.events import checkout_session, deliver, intent_succeeded, refund, thin

pytestmark = pytest.mark.core

LONGEST = 255  # Stripe's bound, written out: not read from the code under test


@pytest.fixture
def scheme():
    return "stripe"


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def long_id(prefix, chars=LONGEST):
    """A Stripe-like id (prefix_ and letters or digits) of exactly chars characters."""
    return f"{prefix}_" + "7" * (chars - len(prefix) - 1)


def in_account(evt, account):
    """evt as a Connect endpoint receives it from account (None: the platform's own event)."""
    if account is not None:
        evt["account"] = account
    return evt


ACCOUNTS = [None, "acct_1ConnectA", long_id("acct")]


@pytest.mark.parametrize("account", ACCOUNTS, ids=["platform", "account", "account-of-255"])
def test_ids_of_255_characters_credit_once_and_the_refund_debits_once(client, db, run, account):
    pi, re = long_id("pi"), long_id("re")
    paid = in_account(intent_succeeded(pi, cents=900, event_id=long_id("evt")), account)
    refunded = in_account(refund(re, pi, 300, event_id=long_id("evt", LONGEST - 1)), account)
    for evt in (paid, refunded):
        assert deliver(client, evt).json == {"status": "processed", "event_id": evt.id}
        assert deliver(client, evt).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + 900 - 300
    key = pi if account is None else f"{account}/{pi}"
    assert db.execute("SELECT payment_id, debited_cents FROM payments").fetchall() == [(key, 300)]
    assert db.execute("SELECT movement_id FROM movements").fetchall() == [(re if account is None else
                                                                           f"{account}/{re}",)]
    assert sorted(db.execute("SELECT char_length(event_id) FROM webhook_events").fetchall()) == [(254,), (255,)]
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output
    assert_ledger_consistent(db, Settings.of(client.application).policy)


def test_a_customer_of_255_characters_in_an_account_of_255_is_linked_and_names_the_user(client, db, run):
    account, customer = long_id("acct"), long_id("cus")
    linked = run("users", "link", "default", f"{account}/{customer}", str(ALICE), "--by", "ops")
    assert linked.exit_code == 0, linked.output
    paid = in_account(intent_succeeded(long_id("pi"), cents=400, customer=customer, metadata={}), account)
    assert deliver(client, paid).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 400


def test_a_subscription_sessions_link_of_a_255_character_customer_in_a_255_character_account_names_the_user(
        client, db):
    account, customer = long_id("acct"), long_id("cus")
    subscribed = in_account(checkout_session(None, mode="subscription", customer=customer), account)
    assert deliver(client, subscribed).json["status"] == "processed"
    assert db.execute("SELECT customer_id, user_id FROM customer_links").fetchall() == [(f"{account}/{customer}",
                                                                                         ALICE)]
    invoice = in_account(intent_succeeded(long_id("pi"), cents=600, customer=customer, metadata={}), account)
    assert deliver(client, invoice).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 600


@pytest.mark.parametrize("named", [long_id("cus", LONGEST + 1), f"acct_1ConnectA/{long_id('cus', LONGEST + 1)}",
                                   f"{long_id('acct', LONGEST + 1)}/cus_1"], ids=["customer", "in-account", "account"])
def test_a_link_of_an_id_over_255_characters_is_refused(db, run, named):
    refused = run("users", "link", "default", named, str(ALICE), "--by", "ops")
    assert refused.exit_code == 2, refused.output
    assert db.execute("SELECT count(*) FROM customer_links").fetchone() == (0,)


def test_an_event_refused_before_for_its_long_id_is_applied_by_the_retry_after_init_db(client, db, run, monkeypatch):
    """As the previous release stored it: failed (422: its PaymentIntent's id over 128 characters), with a refusal's
    effect, of effect version 7. init-db recomputes that effect from the bytes, so Stripe's retry is no 409
    payload_mismatch: it credits once."""
    paid = intent_succeeded(long_id("pi", 200), cents=700)
    with monkeypatch.context() as before:
        before.setattr(events, "_problem", lambda rule, fields: "data.object.id must be a payment id of 1 to 128"
                       " characters")
        assert deliver(client, paid).status == 422
    db.execute("UPDATE webhook_events SET effect_version = 7")
    recomputed = run("init-db")
    assert "recomputed the effects of 1 stored events" in recomputed.output, recomputed.output
    assert deliver(client, paid).json["status"] == "processed"
    assert deliver(client, paid).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + 700
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output


def _over(what):
    """A payment and its refund where what is one character over Stripe's bound, and the delivery that is refused."""
    ids = {"event": long_id("evt"), "pi": long_id("pi"), "re": long_id("re"), "account": "acct_1ConnectA"}
    ids[what] = long_id(ids[what].split("_")[0], LONGEST + 1)
    paid = in_account(intent_succeeded(ids["pi"], cents=900, event_id=ids["event"]), ids["account"])
    return [paid, in_account(refund(ids["re"], ids["pi"], 300), ids["account"])]


@pytest.mark.parametrize("what, status, error", [
    ("event", 400, "invalid_event"),
    ("account", 400, "invalid_event"),
    ("pi", 422, "unprocessable"),
    ("re", 422, "unprocessable"),
])
def test_an_id_of_256_characters_is_refused_as_before(client, db, what, status, error):
    paid, refunded = _over(what)
    if what == "re":
        assert deliver(client, paid).json["status"] == "processed"
    refused = deliver(client, refunded if what == "re" else paid)
    assert (refused.status, refused.json["error"]) == (status, error), refused.json
    assert balance(db, ALICE) == OPENING[ALICE] + (900 if what == "re" else 0)
    assert event_rows(db) == (0 if status == 400 else 1) + (what == "re")
    assert db.execute("SELECT count(*) FROM movements").fetchone() == (0,)


def test_a_thin_events_context_of_a_255_character_account_is_read(client, db):
    """A thin event names its account in `context`; an account id of 255 characters is one Stripe may generate."""
    document = thin("v1.billing.meter.no_meter_found", None, context=f"acct_1Platform/{long_id('acct')}")
    assert deliver(client, document).json == {"status": "processed", "event_id": document["id"]}
