"""money.sql's functions called directly, in SQL: apply_event's steps (record_event, credit_payment, move_payment,
debit_payment, complete_event), each with a ledger_delivery, and apply_event on one payment from two connections.
The end-to-end tests (test_movements.py, test_payments.py, ...) prove the same rule through the receiver."""

import hashlib
import threading

import psycopg
import pytest

from app.intake.events import RULES, read_when_fetched
from app.store.ledger import APPLY_EVENT, DELIVERY
from devservers import wait_until
from tests.helpers import ALICE, BOB, UNKNOWN_USER, balance, db_url

pytestmark = pytest.mark.core

ROW = "ROW(" + ", ".join(f"%({name})s::{type_}" for name, type_ in DELIVERY) + ")::ledger_delivery"


def delivery(event_id, kind="credit", payment="pay_1", amount=1000, **fields):
    """A ledger_delivery's fields: a credit of payment pay_1 to Alice unless told otherwise."""
    body = f'{{"id": "{event_id}", "amount": {amount}}}'.encode()
    return {"source": "default", "event_id": event_id, "type": "t", "body": body,
            "sha256": hashlib.sha256(body).digest(), "effect": hashlib.sha256(body + str(kind).encode()).digest(),
            "problem": None, "kind": kind, "payment": payment, "user_id": ALICE if kind == "credit" else None,
            "amount": amount, "currency": "usd", "movement": None, "state": None, "ledger_currency": "usd",
            "test_events": False, "origin": "delivery", "customer": None, "user_key": "user_id",
            "no_user": "refuse", "account": None, "app_key": None, **fields}


def refund(event_id, refund_id, amount, state="applied", payment="pay_1"):
    return delivery(event_id, kind="refund", payment=payment, amount=amount, movement=refund_id, state=state)


def call(db, function, fields):
    """function(the ledger_delivery of fields): its one row, as a dict."""
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute(f"SELECT * FROM {function}({ROW})", fields).fetchone()


def apply(db, fields):
    return call(db, "apply_event", fields)


def journal(db):
    return db.execute("SELECT event_id, kind, amount_cents FROM ledger_journal ORDER BY id").fetchall()


def test_pythons_delivery_is_the_types_attributes_in_order(db):
    attributes = db.execute("""
        SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'ledger_delivery'::regtype)
              AND attnum > 0 AND NOT attisdropped
        ORDER BY attnum""").fetchall()
    assert attributes == list(DELIVERY)
    assert "ROW(" in APPLY_EVENT and APPLY_EVENT.endswith("::ledger_delivery)")


# -- record_event -------------------------------------------------------------------

@pytest.mark.parametrize("fields, outcome, status", [
    (delivery("evt_new"), None, "completed"),  # goes on to move its money
    (delivery("evt_new", problem="unknown user"), "failed", "failed"),
    (delivery("evt_new", kind=None), "processed", "completed"),  # moves nothing
])
def test_record_event_inserts_a_new_event_as_it_most_likely_ends(db, fields, outcome, status):
    recorded = call(db, "record_event", fields)
    assert (recorded["is_new"], recorded["outcome"], recorded["stored_sha256"]) == (True, outcome, None)
    assert db.execute("SELECT status FROM webhook_events WHERE id = %s", [recorded["row_id"]]).fetchone() == (status,)


def test_record_event_of_a_stored_event_is_a_duplicate_and_another_effect_a_counted_mismatch(db):
    first = delivery("evt_1")
    assert apply(db, first)["outcome"] == "processed"
    assert call(db, "record_event", first)["outcome"] == "duplicate"
    forged = {**first, "effect": bytes(32 * [7])}
    assert call(db, "record_event", forged)["outcome"] == "payload_mismatch"
    assert db.execute("SELECT status, mismatches, attempts FROM webhook_events").fetchone() == ("completed", 1, 1)


def test_record_event_tries_a_failed_event_again_from_the_new_bytes(db):
    assert apply(db, delivery("evt_1", problem="unknown user"))["outcome"] == "failed"
    again = call(db, "record_event", delivery("evt_1"))
    assert (again["is_new"], again["outcome"], again["problem"]) == (False, None, None)
    assert db.execute("SELECT attempts FROM webhook_events").fetchone() == (2,)


# -- credit_payment -----------------------------------------------------------------

def test_a_credit_moves_the_users_balance_once_per_payment(db):
    assert apply(db, delivery("evt_1")) == {"outcome": "processed", "problem": None, "stored_sha256": None,
                                            "change": "credit", "balance_after": 2000}
    twin = apply(db, delivery("evt_2"))  # another event announcing the same payment
    assert (twin["outcome"], twin["change"]) == ("duplicate", "payment_duplicate")
    other = apply(db, delivery("evt_3", amount=999))
    assert (other["outcome"], other["problem"]) == (
        "payment_mismatch", "payment pay_1 was credited by event evt_1 with another user, amount or currency")
    assert journal(db) == [("evt_1", "credit", 1000)]
    assert balance(db) == 2000


@pytest.mark.parametrize("no_user, outcome, status", [("refuse", "failed", "failed"),
                                                       ("ignore", "ignored", "ignored")])
def test_a_credit_naming_no_user_is_refused_or_ignored_as_its_source_says(db, no_user, outcome, status):
    result = apply(db, delivery("evt_1", user_id=None, customer="cus_1", no_user=no_user))
    assert (result["outcome"], result["change"]) == (outcome, None)
    assert result["problem"].startswith("no user: no data.object.metadata.user_id, and customer cus_1 is linked")
    assert db.execute("SELECT status FROM webhook_events").fetchone() == (status,)
    assert db.execute("SELECT count(*) FROM ignored_payments").fetchone() == (int(no_user == "ignore"),)
    assert journal(db) == []


def test_a_credit_that_would_overflow_the_balance_moves_nothing(db):
    db.execute("UPDATE user_balances SET balance_cents = 9223372036854775000 WHERE user_id = %s", [BOB])
    result = apply(db, delivery("evt_1", user_id=BOB))
    assert (result["outcome"], result["problem"]) == ("failed", "credit would overflow the balance")
    assert db.execute("SELECT count(*) FROM payments").fetchone() == (0,)


def test_a_credit_through_a_customers_link_names_the_customer(db):
    db.execute("INSERT INTO customer_links (source, customer_id, user_id, linked_by) VALUES ('default', 'cus_1', %s,"
               " 'test')", [BOB])
    assert apply(db, delivery("evt_1", user_id=None, customer="cus_1"))["change"] == "credit"
    assert db.execute("SELECT user_id, customer_id FROM payments").fetchone() == (BOB, "cus_1")


# -- link_session -----------------------------------------------------------------------

def link(event_id, user, customer="cus_1"):
    """A subscription Session's link of customer to user: no payment, no amount."""
    return delivery(event_id, kind="link", payment=None, amount=None, currency=None, user_id=user, customer=customer)


@pytest.mark.parametrize("user, customer, problem", [
    (BOB, "cus_1", None),  # linked to that user already: nothing to do
    (ALICE, "cus_1", f"customer cus_1 is linked to user {BOB} (by event evt_1, "),  # to another: never changed
    (UNKNOWN_USER, "cus_2", f"unknown user {UNKNOWN_USER}"),
])
def test_link_session_links_a_customer_once_and_never_changes_a_link(db, user, customer, problem):
    assert call(db, "link_session", link("evt_1", BOB)) == {"change": None, "balance_after": None, "problem": None,
                                                            "ignored": False, "mismatch": False}
    linked = call(db, "link_session", link("evt_2", user, customer))
    assert (linked["problem"] or "").startswith(problem or "") and bool(linked["problem"]) == bool(problem)
    assert db.execute("SELECT customer_id, user_id, linked_by FROM customer_links").fetchall() == \
        [("cus_1", BOB, "event evt_1")]
    assert journal(db) == []


def test_apply_event_of_a_link_moves_no_money_and_records_its_refusal(db):
    assert apply(db, link("evt_1", BOB))["outcome"] == "processed"
    refused = apply(db, link("evt_2", ALICE))
    assert refused["outcome"] == "failed" and "a link is never changed" in refused["problem"]
    assert db.execute("SELECT event_id, status FROM webhook_events ORDER BY id").fetchall() == \
        [("evt_1", "completed"), ("evt_2", "failed")]
    assert journal(db) == [] and db.execute("SELECT count(*) FROM payments").fetchone() == (0,)


# -- move_payment and debit_payment --------------------------------------------------

def test_a_refund_is_taken_once_then_given_back_once_when_it_fails(db):
    apply(db, delivery("evt_pay"))
    taken = apply(db, refund("evt_r1", "re_1", 300))
    assert (taken["change"], taken["balance_after"]) == ("refund", 1700)
    assert apply(db, refund("evt_r1b", "re_1", 300))["change"] is None  # seen applied already
    back = apply(db, refund("evt_r2", "re_1", 300, state="reversed"))
    assert (back["change"], back["balance_after"]) == ("refund_reversed", 2000)
    assert apply(db, refund("evt_r3", "re_1", 300))["change"] is None  # state only moves forward
    assert journal(db) == [("evt_pay", "credit", 1000), ("evt_r1", "refund", -300), ("evt_r2", "refund_reversed", 300)]


def test_a_refund_first_seen_reversed_never_moves(db):
    apply(db, delivery("evt_pay"))
    assert apply(db, refund("evt_r1", "re_1", 300, state="reversed"))["change"] is None
    assert apply(db, refund("evt_r2", "re_1", 300))["change"] is None
    assert balance(db) == 2000


def test_a_dispute_is_withdrawn_then_reinstated(db):
    apply(db, delivery("evt_pay"))
    dispute = delivery("evt_d1", kind="dispute", amount=1000, movement="dp_1", state="applied")
    assert apply(db, dispute)["change"] == "dispute_withdrawn"
    assert apply(db, {**dispute, "event_id": "evt_d2", "state": "reversed"})["change"] == "dispute_reinstated"
    assert balance(db) == 2000


def test_what_refunds_and_disputes_take_is_capped_at_the_payment(db):
    apply(db, delivery("evt_pay"))
    apply(db, refund("evt_r1", "re_1", 600))
    apply(db, delivery("evt_d1", kind="dispute", amount=1000, movement="dp_1", state="applied"))
    apply(db, delivery("evt_t1", kind="refunded_total", amount=900))  # a running total beyond the objects known
    assert db.execute("SELECT debited_cents, debit_due_cents FROM payment_accounts").fetchone() == (1000, 1000)
    assert balance(db) == 1000  # the credit of 1000, all of it taken back, never more


def test_a_running_total_takes_only_what_the_refund_objects_have_not(db):
    apply(db, delivery("evt_pay"))
    apply(db, refund("evt_r1", "re_1", 300))
    assert apply(db, delivery("evt_t1", kind="refunded_total", amount=300))["change"] is None  # the same refund
    assert apply(db, delivery("evt_t2", kind="refunded_total", amount=500))["change"] == "refund"
    assert apply(db, delivery("evt_t3", kind="refunded_total", amount=400))["change"] is None  # a late total
    assert balance(db) == 1500


@pytest.mark.parametrize("fields, problem", [
    (refund("evt_r", "re_1", 300, payment="pay_x"), "unknown payment pay_x"),
    ({**refund("evt_r", "re_1", 300), "currency": "eur"}, "refund in eur of payment pay_1, which was in usd"),
    (refund("evt_r", "re_1", 1001), "refund re_1 of 1001 cents is above payment pay_1's 1000 cents"),
    (delivery("evt_t", kind="refunded_total", amount=1001),
     "refunded total of 1001 cents is above payment pay_1's 1000 cents"),
])
def test_a_movement_the_rule_refuses_moves_nothing_and_says_why(db, fields, problem):
    apply(db, delivery("evt_pay"))
    result = apply(db, fields)
    assert (result["outcome"], result["problem"], result["change"]) == ("failed", problem, None)
    assert db.execute("SELECT status, last_error FROM webhook_events WHERE event_id = %s",
                      [fields["event_id"]]).fetchone() == ("failed", problem)
    assert balance(db) == 2000


def test_a_movement_announced_again_with_another_amount_is_a_mismatch(db):
    apply(db, delivery("evt_pay"))
    apply(db, refund("evt_r1", "re_1", 300))
    result = apply(db, refund("evt_r2", "re_1", 400))
    assert (result["outcome"], result["problem"]) == (
        "payment_mismatch", "refund re_1 was announced by event evt_r1 with another payment or amount")


def test_debit_payment_moves_nothing_when_the_due_did_not_change(db):
    apply(db, delivery("evt_pay"))
    payment = "(SELECT p FROM payments p WHERE payment_id = 'pay_1')"
    moved = db.cursor(row_factory=psycopg.rows.dict_row).execute(
        f"SELECT * FROM debit_payment({ROW}, {payment})", refund("evt_r", "re_1", 300)).fetchone()
    assert moved == {"change": None, "balance_after": None}


# -- complete_event -----------------------------------------------------------------

@pytest.mark.parametrize("problem, ignored, mismatch, change, outcome, status", [
    (None, False, False, "credit", "processed", "completed"),
    (None, False, False, "payment_duplicate", "duplicate", "completed"),
    ("why", False, False, None, "failed", "failed"),
    ("why", True, False, None, "ignored", "ignored"),
    ("why", False, True, None, "payment_mismatch", "failed"),
])
def test_complete_event_records_the_outcome_on_a_retried_row(db, problem, ignored, mismatch, change, outcome,
                                                             status):
    assert apply(db, delivery("evt_1", problem="before"))["outcome"] == "failed"
    row_id = db.execute("SELECT id FROM webhook_events").fetchone()[0]
    assert db.execute("SELECT complete_event(%s, false, %s, %s, %s, %s)",
                      [row_id, problem, ignored, mismatch, change]).fetchone() == (outcome,)
    assert db.execute("SELECT status, last_error FROM webhook_events").fetchone() == (status, problem)


def test_complete_event_completes_a_twin_that_disagreed_on_the_user_its_note_no_error(db):
    assert apply(db, delivery("evt_1", problem="before"))["outcome"] == "failed"
    row_id = db.execute("SELECT id FROM webhook_events").fetchone()[0]
    assert db.execute("SELECT complete_event(%s, false, %s, false, false, 'payment_user_disagreed')",
                      [row_id, "what disagreed"]).fetchone() == ("duplicate",)
    assert db.execute("SELECT status, last_error FROM webhook_events").fetchone() == ("completed", None)


# -- one payment, two connections --------------------------------------------------

def test_two_refunds_of_one_payment_at_once_are_serialised_by_the_payments_row(db):
    apply(db, delivery("evt_pay"))
    results = {}
    with psycopg.connect(db_url(db)) as first, psycopg.connect(db_url(db), autocommit=True) as second:
        assert apply(first, refund("evt_r1", "re_1", 300))["change"] == "refund"  # its transaction holds the row

        def other():
            results["second"] = apply(second, refund("evt_r2", "re_2", 500))

        thread = threading.Thread(target=other)
        thread.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                      ).fetchone()[0] == 1, timeout=10, what="the second refund waiting")
        first.commit()
        thread.join(timeout=10)
    assert (results["second"]["change"], results["second"]["balance_after"]) == ("refund", 1200)
    assert db.execute("SELECT debited_cents FROM payments").fetchone() == (800,)
    assert journal(db)[1:] == [("evt_r1", "refund", -300), ("evt_r2", "refund", -500)]


# -- the rule's edges ---------------------------------------------------------------

def test_a_reversal_that_would_overflow_the_balance_is_refused_and_moves_nothing(db):
    """Issue 38 (4): a refund's failure onto a balance that cannot hold it is a failed event (422), as a credit
    that would overflow is, not an error (500); its movement stays applied, so a retry may still apply it."""
    apply(db, delivery("evt_pay"))
    apply(db, refund("evt_r1", "re_1", 300))
    db.execute("UPDATE user_balances SET balance_cents = 9223372036854775807 - 100 WHERE user_id = %s", [ALICE])
    result = apply(db, refund("evt_r2", "re_1", 300, state="reversed"))
    assert (result["outcome"], result["problem"], result["change"]) == (
        "failed", "refund_reversed of 300 cents would take the balance of user "
                  f"{ALICE} past 9223372036854775807 cents", None)
    assert db.execute("SELECT state FROM movements").fetchone() == ("applied",)
    assert db.execute("SELECT debited_cents FROM payments").fetchone() == (300,)
    assert db.execute("SELECT status FROM webhook_events WHERE event_id = 'evt_r2'").fetchone() == ("failed",)


def test_a_dispute_above_its_payment_takes_the_payment(db):
    """Issue 38 (5): Stripe documents that a dispute's amount may differ from the charge's (a currency
    conversion); the rule's cap applies: the whole payment is taken, the dispute recorded at its amount."""
    apply(db, delivery("evt_pay"))
    dispute = delivery("evt_d1", kind="dispute", amount=1001, movement="dp_1", state="applied")
    result = apply(db, dispute)
    assert (result["outcome"], result["change"], result["balance_after"]) == ("processed", "dispute_withdrawn", 1000)
    assert db.execute("SELECT amount_cents FROM movements").fetchone() == (1001,)
    assert journal(db)[-1] == ("evt_d1", "dispute_withdrawn", -1000)
    back = apply(db, {**dispute, "event_id": "evt_d2", "state": "reversed"})
    assert (back["change"], back["balance_after"]) == ("dispute_reinstated", 2000)


# -- the application's functions (docs/operations.md, "The application's functions") ------------------------------

NEW_USER = "33333333-3333-4333-8333-333333333333"


def test_add_user_adds_once_with_its_opening_balance(db):
    assert db.execute("SELECT * FROM add_user(%s, 700)", [NEW_USER]).fetchone() == (True, 700)
    assert db.execute("SELECT * FROM add_user(%s, 5)", [NEW_USER]).fetchone() == (False, 700)  # left as it is
    assert balance(db, NEW_USER) == 700
    assert journal(db) == []  # an opening balance is where the journal starts


def test_link_customer_links_once_and_only_a_user_that_exists(db):
    first = db.execute("SELECT linked_at FROM link_customer('default', 'cus_1', %s, 'app')", [ALICE]).fetchone()[0]
    assert first is not None
    again = db.execute("SELECT linked_at FROM link_customer('default', 'cus_1', %s, 'app')", [BOB]).fetchone()[0]
    assert again is None  # linked before: the link stays Alice's
    assert db.execute("SELECT user_id::text FROM customer_links WHERE customer_id = 'cus_1'").fetchone() == (
        str(ALICE),)
    assert db.execute("SELECT linked_at FROM link_customer('default', 'cus_2', %s, 'app')",
                      [NEW_USER]).fetchone()[0] is None  # no such user: nothing linked
    assert db.execute("SELECT count(*) FROM customer_links").fetchone()[0] == 1


# -- read_when_fetched ------------------------------------------------------------------------

def test_read_when_fetched_is_true_of_the_thin_types_alone_as_the_python_rule_says(db):
    """money.sql's read_when_fetched and events.read_when_fetched agree on every type that moves money."""
    types = sorted(RULES)
    found = dict(db.execute("SELECT t, read_when_fetched(t) FROM unnest(%s::text[]) AS t", [types]).fetchall())
    assert found == {t: read_when_fetched(t) for t in types}
    assert found["v1.payment_intent.succeeded"] and not found["payment_intent.succeeded"]


@pytest.mark.parametrize("debit, change", [
    (refund("evt_r1", "re_1", 300), "refund"),
    (delivery("evt_r1", kind="dispute", amount=300, movement="dp_1", state="applied"), "dispute_withdrawn"),
    (delivery("evt_r1", kind="refunded_total", amount=300), "refund"),
])
def test_a_debit_that_would_take_the_balance_below_bigint_is_refused_and_moves_nothing(db, debit, change):
    """Issue 44: the debit side of the reversal's edge above. A refund or dispute onto a balance that cannot hold
    it is a failed event (422), not an error (500) on every retry; nothing of its movement is kept."""
    apply(db, delivery("evt_pay"))
    db.execute("UPDATE user_balances SET balance_cents = -9223372036854775808 + 100 WHERE user_id = %s", [ALICE])
    result = apply(db, debit)
    assert (result["outcome"], result["problem"], result["change"]) == (
        "failed", f"{change} of 300 cents would take the balance of user {ALICE} below -9223372036854775808 cents",
        None)
    assert db.execute("SELECT count(*) FROM movements").fetchone() == (0,)
    assert db.execute("SELECT debited_cents, refunded_cents FROM payments").fetchone() == (0, 0)
    assert db.execute("SELECT status FROM webhook_events WHERE event_id = 'evt_r1'").fetchone() == ("failed",)
    assert journal(db) == [("evt_pay", "credit", 1000)]
