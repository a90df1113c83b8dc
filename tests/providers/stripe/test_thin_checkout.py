"""Checkout through a thin destination (app/providers/stripe.py's thin Session types): the Session's
`v1.checkout.session.completed` and `.async_payment_succeeded` fetched (GET /v1/checkout/sessions/{id}, in the
event's account context) and read as their snapshots are, so that a thin-only integrator's Checkout payment is
credited once, whichever of the Session's and the PaymentIntent's thin events comes first; and twins that read
different metadata (a thin event reads it as it is now) never turn into a 409 for ever (money.sql's
read_when_fetched). Sessions shaped as https://docs.stripe.com/api/checkout/sessions/object shows them, thin bodies
as https://docs.stripe.com/api/v2/core/events/object, signed by stripe-python's signer; Stripe's API is
devservers/stripe_stand_in.py, which stripe-python itself reads. Real PostgreSQL and Redis."""

import logging
import uuid

import pytest
import stripe

from app.settings.config import Settings
from devservers.stripe_stand_in import API_KEY
from tests.helpers import ALICE, BOB, OPENING, SECRETS, assert_ledger_consistent, balance, db_url, samples, send
from tests.providers.stripe.events import (
    checkout_session,
    deliver,
    intent_succeeded,
    invoice_intent_succeeded,
    stripe_signed,
    thin,
    thin_signed,
)

pytestmark = pytest.mark.core

COMPLETED, ASYNC = "v1.checkout.session.completed", "v1.checkout.session.async_payment_succeeded"
DISAGREEMENTS = ("webhook_ledger_payment_user_disagreements_total", (("source", "default"),))


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url}


@pytest.fixture
def verify(app):
    runner = app.test_cli_runner()

    def run():
        result = runner.invoke(args=["ledger", "verify"])
        assert result.exit_code == 0, result.output
    return run


def _pi():
    return f"pi_{uuid.uuid4().hex[:24]}"


def _session(pi, user=BOB, cents=1500, **kwargs):
    """A Checkout Session as Stripe's API has it (its client_reference_id names user)."""
    return checkout_session(pi, user=user, cents=cents, **kwargs).data.object.to_dict()


def _guest_intent(pi, cents=1500, **kwargs):
    """The Session's PaymentIntent: Checkout copies neither client_reference_id nor metadata to it."""
    return intent_succeeded(pi, cents=cents, metadata={}, **kwargs).data.object.to_dict()


def _credits(db):
    return db.execute("SELECT payment_id, user_id, amount_cents FROM ledger_journal WHERE kind = 'credit'").fetchall()


def test_stripe_python_fetches_a_thin_sessions_session_from_the_stand_in(stripe_api):
    session = _session(_pi())
    stripe_api.put(session, context="acct_1Shop")
    body, headers = thin_signed(thin(COMPLETED, session, context="acct_1Shop"))
    client = stripe.StripeClient(API_KEY, base_addresses={"api": stripe_api.url})
    notification = client.parse_event_notification(body, headers["Stripe-Signature"], SECRETS["stripe"])
    fetched = notification.fetch_related_object()
    assert (type(fetched), fetched.client_reference_id) == (stripe.checkout.Session, str(BOB))
    assert stripe_api.requests[-1] == {"object": "checkout.session", "id": session["id"], "context": "acct_1Shop"}


def test_a_thin_session_then_its_thin_payment_intent_credit_once(client, db, stripe_api, verify):
    pi = _pi()
    session, intent = _session(pi), _guest_intent(pi)
    stripe_api.put(session)
    stripe_api.put(intent)
    assert deliver(client, thin(COMPLETED, session)).json["status"] == "processed"
    assert stripe_api.requests[-1] == {"object": "checkout.session", "id": session["id"], "context": None}
    assert deliver(client, thin("v1.payment_intent.succeeded", intent)).json["status"] == "duplicate"
    assert _credits(db) == [(pi, BOB, 1500)]
    assert balance(db, BOB) == OPENING[BOB] + 1500
    verify()


def test_a_thin_payment_intent_refused_for_want_of_a_user_is_credited_once_its_thin_session_names_one(
        client, db, stripe_api, verify):
    pi = _pi()
    session, intent = _session(pi), _guest_intent(pi)
    stripe_api.put(session)
    stripe_api.put(intent)
    refused = thin_signed(thin("v1.payment_intent.succeeded", intent))
    answer = send(client, *refused)
    assert answer.status == 422 and "no user" in answer.json["message"]
    assert deliver(client, thin(COMPLETED, session)).json["status"] == "processed"
    assert send(client, *refused).json["status"] == "duplicate"  # Stripe's retry of the refused one
    assert _credits(db) == [(pi, BOB, 1500)]
    assert balance(db, BOB) == OPENING[BOB] + 1500
    verify()


def test_a_thin_session_and_its_snapshot_twin_credit_once(client, db, stripe_api, verify):
    pi = _pi()
    snapshot = checkout_session(pi, user=BOB, cents=1500)
    session = snapshot.data.object.to_dict()
    stripe_api.put(session)
    assert deliver(client, thin(COMPLETED, session, snapshot_event=snapshot.id)).json["status"] == "processed"
    assert send(client, *stripe_signed(snapshot)).json["status"] == "duplicate"
    assert _credits(db) == [(pi, BOB, 1500)]
    verify()


def test_a_delayed_payment_credits_by_its_thin_async_payment_succeeded(client, db, stripe_api, verify):
    """A completed Session still unpaid (a bank debit) moves nothing; once paid, its async event credits it."""
    pi = _pi()
    unpaid = _session(pi, payment_status="unpaid")
    stripe_api.put(unpaid)
    assert deliver(client, thin(COMPLETED, unpaid)).json["status"] == "processed"
    assert _credits(db) == []
    paid = {**unpaid, "payment_status": "paid"}
    stripe_api.put(paid)
    assert deliver(client, thin(ASYNC, paid)).json["status"] == "processed"
    assert _credits(db) == [(pi, BOB, 1500)]
    verify()


def test_a_thin_session_in_a_connected_account_credits_its_payment_in_that_account(client, db, stripe_api, verify):
    pi = _pi()
    session = _session(pi)
    stripe_api.put(session, context="acct_1Shop")
    assert deliver(client, thin(COMPLETED, session)).status == 422  # the platform's own account has no such Session
    assert deliver(client, thin(COMPLETED, session, context="acct_1Shop")).json["status"] == "processed"
    assert _credits(db) == [(f"acct_1Shop/{pi}", BOB, 1500)]
    verify()


def test_a_thin_subscription_session_links_its_customer_and_its_invoices_thin_events_credit_that_user(
        client, db, stripe_api, verify):
    customer = f"cus_{uuid.uuid4().hex[:14]}"
    session = checkout_session(None, mode="subscription", user=BOB, customer=customer,
                               cents=2000).data.object.to_dict()
    invoice = invoice_intent_succeeded(_pi(), customer).data.object.to_dict()
    stripe_api.put(session)
    stripe_api.put(invoice)
    refused = thin_signed(thin("v1.payment_intent.succeeded", invoice))  # the first invoice often comes first
    assert send(client, *refused).status == 422
    assert deliver(client, thin(COMPLETED, session)).json["status"] == "processed"
    assert db.execute("SELECT customer_id, user_id FROM customer_links").fetchall() == [(customer, BOB)]
    assert send(client, *refused).json["status"] == "processed"
    assert _credits(db) == [(invoice["id"], BOB, 2000)]
    verify()


# -- twins that read different metadata --------------------------------------------------------

@pytest.mark.parametrize("thin_first", [False, True], ids=["snapshot first", "thin first"])
def test_twins_reading_metadata_changed_after_success_are_a_logged_and_counted_duplicate(
        client, db, stripe_api, verify, caplog, thin_first):
    """The PaymentIntent succeeded naming ALICE (its snapshot says so); its metadata was changed to BOB after, and
    its thin twin reads BOB. Whichever comes first is the credit, for ever; the other is a duplicate, not a 409."""
    pi = _pi()
    snapshot = intent_succeeded(pi, user=ALICE, cents=900)
    stripe_api.put({**snapshot.data.object.to_dict(), "metadata": {"user_id": str(BOB)}})
    twins = [thin_signed(thin("v1.payment_intent.succeeded", snapshot.data.object, snapshot_event=snapshot.id)),
             stripe_signed(snapshot)]
    first, second = twins if thin_first else twins[::-1]
    assert send(client, *first).json["status"] == "processed"
    with caplog.at_level(logging.WARNING, logger="app.store.ledger"):
        for _ in range(2):  # and so does Stripe's retry of it
            assert send(client, *second).json["status"] == "duplicate"
    credited = BOB if thin_first else ALICE
    assert _credits(db) == [(pi, credited, 900)]
    assert balance(db, credited) == OPENING[credited] + 900
    lines = [r.getMessage() for r in caplog.records if r.name == "app.store.ledger"]
    assert len(lines) == 1
    assert f"payment {pi} was credited to user {credited}" in lines[0]
    assert f"names user {ALICE if thin_first else BOB}" in lines[0]
    assert samples(client.get("/metrics").text)[DISAGREEMENTS] == 1
    verify()
    assert_ledger_consistent(db, Settings.of(client.application).policy)


def test_twins_disagreeing_on_the_amount_are_still_a_payment_mismatch(client, db, stripe_api):
    pi = _pi()
    snapshot = intent_succeeded(pi, cents=900)
    stripe_api.put({**snapshot.data.object.to_dict(), "amount_received": 800})
    assert send(client, *stripe_signed(snapshot)).json["status"] == "processed"
    answer = deliver(client, thin("v1.payment_intent.succeeded", snapshot.data.object))
    assert (answer.status, answer.json["error"]) == (409, "payment_mismatch")
    assert _credits(db) == [(pi, ALICE, 900)]


def test_two_snapshot_events_naming_two_users_are_still_a_payment_mismatch(client, db, stripe_api):
    """Neither was read as it is now: each says what was true when it happened, so they contradict each other."""
    pi = _pi()
    assert send(client, *stripe_signed(intent_succeeded(pi, user=ALICE, cents=900))).json["status"] == "processed"
    answer = send(client, *stripe_signed(checkout_session(pi, user=BOB, cents=900)))
    assert (answer.status, answer.json["error"]) == (409, "payment_mismatch")
