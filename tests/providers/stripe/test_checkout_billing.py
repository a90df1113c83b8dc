"""Stripe Billing through Checkout (app/providers/stripe.py's subscription Session, money.sql's link_session): a
completed `mode=subscription` Session that names a user and a customer links that customer to that user, as
`flask users link` would, moving no money; its invoices' PaymentIntents (customer, no metadata) then credit that
user, whichever comes first. Real PostgreSQL and Redis; Sessions shaped as
https://docs.stripe.com/api/checkout/sessions/object shows them, built and signed by stripe-python."""

import itertools

import pytest

from app.settings.config import Settings
from tests.helpers import ALICE, BOB, OPENING, UNKNOWN_USER, assert_ledger_consistent, balance
from tests.providers.stripe.events import ASYNC_SUCCEEDED, invoice_intent_succeeded, send_stripe
from tests.providers.stripe.events import checkout_session as session

pytestmark = [pytest.mark.core, pytest.mark.parametrize("scheme", ["stripe"])]

ACCOUNT = "acct_1BillingA"


def subscribed(customer, user=BOB, payment_status="paid", **kwargs):
    """A subscription's checkout.session.completed: it names its user (client_reference_id) and its customer."""
    return session(None, mode="subscription", user=user, customer=customer, payment_status=payment_status,
                   cents=2000, **kwargs)


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _links(db):
    return db.execute("SELECT customer_id, user_id FROM customer_links ORDER BY customer_id").fetchall()


def _journal(db):
    return db.execute("SELECT kind, payment_id, user_id, amount_cents FROM ledger_journal ORDER BY id").fetchall()


def _clean(client, db, run):
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output
    assert_ledger_consistent(db, Settings.of(client.application).policy)


def test_a_subscription_session_links_its_customer_then_its_invoices_credit_that_user(client, db, run):
    evt = subscribed("cus_sub")
    assert send_stripe(client, evt).json == {"status": "processed", "event_id": evt.id}
    assert _links(db) == [("cus_sub", BOB)]
    assert _journal(db) == []  # a link moves no money
    assert db.execute("SELECT linked_by FROM customer_links").fetchone()[0] == f"event {evt.id}"
    _clean(client, db, run)
    for month, pi in enumerate(("pi_inv_1", "pi_inv_2")):
        assert send_stripe(client, invoice_intent_succeeded(pi, "cus_sub")).json["status"] == "processed", month
    assert _journal(db) == [("credit", "pi_inv_1", BOB, 2000), ("credit", "pi_inv_2", BOB, 2000)]
    assert balance(db, BOB) == OPENING[BOB] + 4000
    _clean(client, db, run)


def test_an_invoice_refused_for_want_of_a_user_is_credited_by_its_retry_once_the_session_linked(client, db, run):
    invoice = invoice_intent_succeeded("pi_early", "cus_early")
    refused = send_stripe(client, invoice)
    assert refused.status == 422 and "customer cus_early is linked to no user" in refused.json["message"]
    assert send_stripe(client, subscribed("cus_early")).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB]
    assert send_stripe(client, invoice).json["status"] == "processed"  # Stripe's retry
    assert send_stripe(client, invoice).json["status"] == "duplicate"
    assert _journal(db) == [("credit", "pi_early", BOB, 2000)]
    _clean(client, db, run)


def test_a_replay_of_the_refused_invoice_credits_it_once_the_session_linked(client, db, run):
    invoice = invoice_intent_succeeded("pi_replay", "cus_replay")
    send_stripe(client, invoice)
    send_stripe(client, subscribed("cus_replay"))
    # `flask users link` with the link the Session made changes nothing, and lists the events waiting for it.
    listed = run("users", "link", "default", "cus_replay", str(BOB), "--by", "ops")
    assert "already: nothing changed" in listed.output
    assert f"flask events replay {invoice.id}" in listed.output
    assert run("events", "replay", invoice.id).exit_code == 0
    assert _journal(db) == [("credit", "pi_replay", BOB, 2000)]
    _clean(client, db, run)


def test_a_customer_linked_to_another_user_is_not_relinked_and_the_answer_names_both(client, db, run):
    assert run("users", "link", "default", "cus_taken", str(ALICE), "--by", "ops").exit_code == 0
    evt = subscribed("cus_taken", user=BOB)
    refused = send_stripe(client, evt)
    assert refused.status == 422
    assert f"customer cus_taken is linked to user {ALICE}" in refused.json["message"]
    assert f"this Session names user {BOB}" in refused.json["message"]
    assert send_stripe(client, evt).status == 422  # a retry is refused alike: a link is never changed
    assert db.execute("SELECT customer_id, user_id, linked_by FROM customer_links").fetchall() == \
        [("cus_taken", ALICE, "ops")]
    assert send_stripe(client, invoice_intent_succeeded("pi_taken", "cus_taken")).json["status"] == "processed"
    assert _journal(db) == [("credit", "pi_taken", ALICE, 2000)]
    _clean(client, db, run)


def test_a_customer_linked_to_the_same_user_is_left_as_it_is(client, db, run):
    assert run("users", "link", "default", "cus_same", str(BOB), "--by", "ops").exit_code == 0
    evt = subscribed("cus_same")
    assert send_stripe(client, evt).json["status"] == "processed"
    assert send_stripe(client, evt).json["status"] == "duplicate"
    assert db.execute("SELECT customer_id, user_id, linked_by FROM customer_links").fetchall() == \
        [("cus_same", BOB, "ops")]
    _clean(client, db, run)


def test_a_connected_accounts_session_links_its_customer_in_the_account(client, db, run):
    evt = subscribed("cus_conn")
    evt["account"] = ACCOUNT
    assert send_stripe(client, evt).json["status"] == "processed"
    assert _links(db) == [(f"{ACCOUNT}/cus_conn", BOB)]
    invoice = invoice_intent_succeeded("pi_conn", "cus_conn")
    invoice["account"] = ACCOUNT
    assert send_stripe(client, invoice).json["status"] == "processed"
    assert db.execute("SELECT payment_id, user_id, customer_id FROM payments").fetchall() == \
        [(f"{ACCOUNT}/pi_conn", BOB, f"{ACCOUNT}/cus_conn")]
    # The platform's own customer of the same id is another customer: not linked.
    platform = send_stripe(client, invoice_intent_succeeded("pi_platform", "cus_conn"))
    assert platform.status == 422 and "no user" in platform.json["message"]
    _clean(client, db, run)


@pytest.mark.parametrize("customer, user, payment_status", [
    (None, BOB, "paid"),  # no customer: nothing to link
    ("cus_nobody", None, "paid"),  # no user named: nothing to link it to
    ("cus_unpaid", BOB, "unpaid"),  # a delayed payment method: linked when async_payment_succeeded says paid
])
def test_a_session_that_names_no_customer_or_no_user_or_is_unpaid_moves_nothing(client, db, run, customer, user,
                                                                                 payment_status):
    assert send_stripe(client, subscribed(customer, user, payment_status)).json["status"] == "processed"
    assert _links(db) == [] and _journal(db) == []
    _clean(client, db, run)


def test_a_trial_without_payment_and_an_async_payment_succeeded_session_link(client, db, run):
    assert send_stripe(client, subscribed("cus_trial", payment_status="no_payment_required")).json["status"] \
        == "processed"
    assert send_stripe(client, subscribed("cus_sepa", event_type=ASYNC_SUCCEEDED)).json["status"] == "processed"
    assert _links(db) == [("cus_sepa", BOB), ("cus_trial", BOB)]
    _clean(client, db, run)


def test_a_session_naming_an_unknown_user_is_refused_until_the_user_exists(client, db, run):
    evt = subscribed("cus_new", user=UNKNOWN_USER)
    refused = send_stripe(client, evt)
    assert refused.status == 422 and f"unknown user {UNKNOWN_USER}" in refused.json["message"]
    assert _links(db) == []
    assert run("users", "add", str(UNKNOWN_USER)).exit_code == 0
    assert send_stripe(client, evt).json["status"] == "processed"
    assert _links(db) == [("cus_new", UNKNOWN_USER)]
    _clean(client, db, run)


def test_a_replay_of_a_session_refused_for_an_unknown_user_links_once_the_user_exists(client, db, run):
    evt = subscribed("cus_later", user=UNKNOWN_USER)
    assert send_stripe(client, evt).status == 422
    run("users", "add", str(UNKNOWN_USER))
    replayed = run("events", "replay", evt.id)
    assert replayed.exit_code == 0, replayed.output
    assert _links(db) == [("cus_later", UNKNOWN_USER)]
    assert run("events", "replay", evt.id).exit_code == 0  # completed: left as it is
    _clean(client, db, run)


def test_verify_flags_a_completed_session_whose_customer_is_not_linked_to_its_user(client, db, run):
    evt = subscribed("cus_moved")
    send_stripe(client, evt)
    db.execute("UPDATE customer_links SET user_id = %s WHERE customer_id = 'cus_moved'", [ALICE])  # never done
    verified = run("ledger", "verify")
    assert verified.exit_code == 1
    assert f"completed event {evt.id!r}: customer 'cus_moved' is linked to {ALICE}, its bytes link it to {BOB}" \
        in verified.output


def test_a_payment_mode_session_does_not_link_its_customer(client, db, run):
    evt = session("pi_once", user=BOB, customer="cus_once", cents=500)
    assert send_stripe(client, evt).json["status"] == "processed"
    assert _links(db) == []
    assert _journal(db) == [("credit", "pi_once", BOB, 500)]


# The Session and its first invoice's PaymentIntent, each delivered twice (a retry, or a duplicate), in every
# order; then Stripe's retries of whatever is still refused.
DELIVERIES = ("session", "session", "invoice", "invoice")


def test_the_session_and_its_invoice_in_any_order_with_retries_end_at_the_same_ledger(client, db, run):
    orders = sorted(set(itertools.permutations(DELIVERIES)))
    for n, order in enumerate(orders):
        customer, pi = f"cus_order_{n}", f"pi_order_{n}"
        evts = {"session": subscribed(customer), "invoice": invoice_intent_succeeded(pi, customer)}
        refused = {}
        for name in order:
            evt = evts[name]
            answer = send_stripe(client, evt)
            assert answer.status in (200, 422), (order, name, answer.json)
            refused[evt.id] = evt if answer.status == 422 else None
        for evt in filter(None, refused.values()):  # Stripe's retries of what is still refused
            assert send_stripe(client, evt).status == 200, order
    n = len(orders)
    assert _links(db) == sorted((f"cus_order_{i}", BOB) for i in range(n))
    assert sorted(_journal(db)) == sorted(("credit", f"pi_order_{i}", BOB, 2000) for i in range(n))
    assert balance(db, BOB) == OPENING[BOB] + 2000 * n
    assert db.execute("SELECT count(*) FROM webhook_events WHERE status <> 'completed'").fetchone()[0] == 0
    _clean(client, db, run)
