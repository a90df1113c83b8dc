"""The ledger follows the payment: one payment announced by several events is
credited once, and refunds debit by running total, in any order. Stripe's
events are built and signed by stripe-python; real PostgreSQL, Redis and
gunicorn."""

import logging
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from app.store.outcome import Outcome
from tests.providers.stripe.events import charge_refunded, intent_succeeded, send_stripe, stripe_signed

from .helpers import (
    ALICE,
    BOB,
    assert_ledger_consistent,
    balance,
    payment,
    payment_refunded,
    record_currency,
    samples,
    send,
    stored_event_row,
)

pytestmark = pytest.mark.core

STRIPE = pytest.mark.parametrize("scheme", ["stripe"])


def _payment(db, payment_id):
    """The payment's row, {column: value}."""
    return db.cursor(row_factory=dict_row).execute(
        "SELECT user_id, amount_cents, refunded_cents FROM payments WHERE payment_id = %s", [payment_id]).fetchone()


def _journal(db):
    """The journal's rows in order, each {column: value}."""
    return db.cursor(row_factory=dict_row).execute(
        "SELECT kind, payment_id, user_id, amount_cents FROM ledger_journal ORDER BY id").fetchall()


def _metrics(client):
    return samples(client.get("/metrics").get_data(as_text=True))


# -- a payment is credited once ------------------------------------------------

@STRIPE
def test_two_stripe_events_for_one_payment_intent_credit_once(client, db):
    first, second = intent_succeeded("pi_twice"), intent_succeeded("pi_twice")
    assert first.id != second.id
    assert send_stripe(client, first).json == {"status": "processed", "event_id": first.id}
    assert send_stripe(client, second).json == {"status": "duplicate", "event_id": second.id}
    assert balance(db) == 1250
    assert _payment(db, "pi_twice") == {"user_id": ALICE, "amount_cents": 250, "refunded_cents": 0}
    assert _journal(db) == [{"kind": "credit", "payment_id": "pi_twice", "user_id": ALICE, "amount_cents": 250}]
    # Both events are recorded, and both completed: the second announced a payment already credited.
    stored = stored_event_row(db, second.id)
    assert stored.status == "completed" and stored.last_error is None
    counted = _metrics(client)
    assert counted[("webhook_ledger_payments_credited_total", (("source", "default"),))] == 1
    assert counted[("webhook_ledger_payment_duplicates_total", (("source", "default"),))] == 1
    assert_ledger_consistent(db)


def _named_otherwise(client, change):
    """pi_clash credited (250 cents to Alice), then announced again with change: (that event, its answer)."""
    assert send_stripe(client, intent_succeeded("pi_clash")).json["status"] == "processed"
    other = intent_succeeded("pi_clash", **change)
    return other, send_stripe(client, other)


# The same payment with another amount or user: a payment_mismatch.
MISMATCHES = pytest.mark.parametrize("change", [{"cents": 999}, {"user": BOB}], ids=["amount", "user"])


@STRIPE
@MISMATCHES
def test_the_same_payment_named_otherwise_is_409_payment_mismatch(client, db, change):
    other, response = _named_otherwise(client, change)
    assert (response.status, response.json["error"], response.json["event_id"]) == (409, "payment_mismatch", other.id)
    assert "pi_clash" in response.json["message"]
    # The provider's retry of it is refused alike.
    assert send_stripe(client, other).status == 409


@STRIPE
@MISMATCHES
def test_a_payment_mismatch_is_recorded(client, db, change):
    other, _ = _named_otherwise(client, change)
    stored = stored_event_row(db, other.id)
    assert stored.status == "failed" and "pi_clash" in stored.last_error
    assert _metrics(client)[("webhook_ledger_payment_mismatches_total", (("source", "default"),))] == 1


@STRIPE
def test_the_same_payment_in_a_currency_not_the_ledgers_is_422(client, db):
    # refused before any payment is looked at
    _, response = _named_otherwise(client, {"currency": "eur"})
    assert response.status == 422


@STRIPE
@pytest.mark.parametrize("change", [{"cents": 999}, {"user": BOB}, {"currency": "eur"}],
                         ids=["amount", "user", "currency"])
def test_the_same_payment_named_otherwise_is_not_credited(client, db, change):
    other, _ = _named_otherwise(client, change)
    send_stripe(client, other)  # the provider's retry
    assert (balance(db), balance(db, BOB)) == (1250, 0)
    assert _journal(db) == [{"kind": "credit", "payment_id": "pi_clash", "user_id": ALICE, "amount_cents": 250}]
    assert_ledger_consistent(db)


def test_events_sharing_a_payment_id_credit_once(client, db):
    assert send(client, payment("evt_a", cents=100, paymentId="pay_1")).json["status"] == "processed"
    assert send(client, payment("evt_b", cents=100, paymentId="pay_1")).json["status"] == "duplicate"
    assert balance(db) == 1100
    assert [row["payment_id"] for row in _journal(db)] == ["pay_1"]
    assert_ledger_consistent(db)


def test_events_without_a_payment_id_each_credit(client, db):
    assert send(client, payment("evt_c", cents=100, paymentId=None)).json["status"] == "processed"
    assert send(client, payment("evt_d", cents=100, paymentId=None)).json["status"] == "processed"
    assert balance(db) == 1200
    assert [row["payment_id"] for row in _journal(db)] == ["evt_c", "evt_d"]
    assert_ledger_consistent(db)


@pytest.mark.parametrize("payment_id", [7, "", "p" * 256, "pay\u0000"])
def test_a_payment_id_that_cannot_name_a_payment_is_422(client, db, payment_id):
    response = send(client, payment("evt_bad_pid", paymentId=payment_id))
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert "data.paymentId" in response.json["message"]
    assert balance(db) == 1000


@STRIPE
@pytest.mark.parametrize("events", [2, 8])
def test_concurrent_events_for_one_payment_intent_credit_once(gunicorn, db, events):
    server = gunicorn(workers=2, threads=4)
    deliveries = [stripe_signed(intent_succeeded("pi_burst", cents=400)) for _ in range(events)]
    barrier = threading.Barrier(events)

    def send_one(delivery):
        barrier.wait()
        return send(server.base, *delivery)

    with ThreadPoolExecutor(events) as pool:
        answers = list(pool.map(send_one, deliveries))
    outcomes = Counter((status, body["status"]) for status, body, _ in answers)
    assert outcomes == {(200, "processed"): 1, (200, "duplicate"): events - 1}, outcomes
    assert balance(db) == 1400
    assert _journal(db) == [{"kind": "credit", "payment_id": "pi_burst", "user_id": ALICE, "amount_cents": 400}]
    assert_ledger_consistent(db)


@STRIPE
def test_events_for_one_payment_on_two_hosts_with_redis_flushed_midway_credit_once(gunicorn, db, redis_client):
    hosts = [gunicorn(workers=2, threads=4), gunicorn(workers=1, threads=4)]
    deliveries = [stripe_signed(intent_succeeded("pi_hosts", user=BOB, cents=700)) for _ in range(12)]

    def send_one(i):
        if i == 6:
            redis_client.flushall()
        return send(hosts[i % 2].base, *deliveries[i])

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send_one, range(12)))
    # And each delivery once more, as a provider retrying after a timeout would.
    answers += [send(hosts[i % 2].base, *deliveries[i]) for i in range(12)]
    outcomes = Counter((status, body["status"]) for status, body, _ in answers)
    assert outcomes[(200, "processed")] == 1, outcomes
    assert set(outcomes) <= {(200, "processed"), (200, "duplicate"), (409, "in_progress")}, outcomes
    assert balance(db, BOB) == 700
    assert_ledger_consistent(db)


# -- refunds debit by running total -----------------------------------------------

@pytest.mark.parametrize("totals", [[100, 250], [250, 100], [100, 100, 100], [60, 200, 60, 120, 200]],
                         ids=["in-order", "out-of-order", "repeated", "mixed"])
def test_refunds_debit_the_highest_total_once_whatever_their_order(client, db, totals):
    send(client, payment("evt_paid", cents=250, paymentId="pay_r"))
    for total in totals:
        response = send(client, payment_refunded("pay_r", total))
        assert response.json["status"] == "processed"
    assert balance(db) == 1000 + 250 - max(totals)
    assert _payment(db, "pay_r") == {"user_id": ALICE, "amount_cents": 250, "refunded_cents": max(totals)}
    debits = [row["amount_cents"] for row in _journal(db) if row["kind"] == "refund"]
    assert sum(debits) == -max(totals) and all(cents < 0 for cents in debits)
    assert_ledger_consistent(db)


@STRIPE
def test_a_stripe_charge_refunded_debits_the_payment_intents_user(client, db):
    send_stripe(client, intent_succeeded("pi_refund", user=BOB, cents=500))
    assert send_stripe(client, charge_refunded("pi_refund", 200, cents=500)).json["status"] == "processed"
    assert send_stripe(client, charge_refunded("pi_refund", 500, cents=500)).json["status"] == "processed"
    assert send_stripe(client, charge_refunded("pi_refund", 200, cents=500)).json["status"] == "processed"
    assert balance(db, BOB) == 0
    assert _payment(db, "pi_refund") == {"user_id": BOB, "amount_cents": 500, "refunded_cents": 500}
    assert _metrics(client)[("webhook_ledger_refunds_applied_total", (("source", "default"),))] == 2
    assert_ledger_consistent(db)


REFUSED_REFUNDS = pytest.mark.parametrize("refund, reason", [
    (payment_refunded("pay_x", 251), "above payment pay_x's 250 cents"),
    (payment_refunded("pay_x", 100, currency="eur"), "refund in eur of payment pay_x, which was in usd"),
    (payment_refunded("pay_x", 0), "data.amountRefundedCents must be a positive integer"),
    (payment_refunded("pay_x", 1.5), "data.amountRefundedCents must be a positive integer"),
    (payment_refunded(None, 100), "data.paymentId must be a payment id"),
])
def _refused_refund(client, refund):
    """pay_x credited (250 cents to Alice), then refund sent: its answer."""
    send(client, payment("evt_x", cents=250, paymentId="pay_x"))
    return send(client, refund)


@REFUSED_REFUNDS
def test_a_refund_above_its_payment_or_malformed_is_422_recorded_as_failed(client, db, refund, reason):
    response = _refused_refund(client, refund)
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert reason in response.json["message"]
    assert stored_event_row(db, refund["id"]).status == "failed"


@REFUSED_REFUNDS
def test_a_refund_above_its_payment_or_malformed_debits_nothing(client, db, refund, reason):
    _refused_refund(client, refund)
    assert balance(db) == 1250
    assert_ledger_consistent(db)


@STRIPE
def test_a_refund_in_another_currency_than_its_payment_is_422(make_app, config, db):
    client = make_app({**config, "LEDGER_CURRENCY": "eur"}).test_client()
    record_currency(db, "eur")  # a ledger in euros holding a payment in dollars (written here, as no rule would)
    db.execute("INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id)"
               " VALUES ('default', 'pi_usd', %s, 300, 'usd', 'evt_old')", [ALICE])
    db.execute("INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)"
               " VALUES ('default', 'evt_old', 'credit', 'pi_usd', %s, 300)", [ALICE])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + 300 WHERE user_id = %s", [ALICE])
    response = send_stripe(client, charge_refunded("pi_usd", 100, currency="eur", cents=300))
    assert response.status == 422
    assert "refund in eur of payment pi_usd, which was in usd" in response.json["message"]
    assert balance(db) == 1300


def test_a_refund_before_its_payment_is_422_then_applied_by_the_retry(client, db, run_cli):
    refund, retried = payment_refunded("pay_late", 100), payment_refunded("pay_late", 150)
    for event in (refund, retried):
        response = send(client, event)
        assert (response.status, response.json["message"]) == (422, "unknown payment pay_late")
        stored = stored_event_row(db, event["id"])
        assert stored.status == "failed" and stored.last_error == "unknown payment pay_late"
    send(client, payment("evt_late_paid", cents=200, paymentId="pay_late"))
    # The provider's retry of one, `flask events replay` of the other.
    assert send(client, refund).json["status"] == "processed"
    result = run_cli("events", "replay", retried["id"])
    assert result.exit_code == 0, result.output
    assert balance(db) == 1000 + 200 - 150
    assert _payment(db, "pay_late") == {"user_id": ALICE, "amount_cents": 200, "refunded_cents": 150}
    assert_ledger_consistent(db)


@pytest.mark.parametrize("order", ["refunds-first", "interleaved"])
def test_concurrent_refund_totals_debit_the_highest_once(gunicorn, db, order):
    server = gunicorn(workers=2, threads=4)

    def send_one(event):
        return send(server.base, event)

    assert send_one(payment("evt_cc", user=BOB, cents=900, paymentId="pay_cc")).json["status"] == "processed"
    totals = [100, 900, 300, 300, 800, 50, 900, 10]
    refunds = [payment_refunded("pay_cc", total) for total in totals]
    with ThreadPoolExecutor(len(refunds)) as pool:
        answers = list(pool.map(send_one, refunds if order == "refunds-first" else refunds[::-1]))
    assert {status for status, _, _ in answers} <= {200, 503}, answers
    for event, (status, _, _) in zip(refunds, answers, strict=True):
        if status == 503:  # a lock wait beyond lock_timeout: the provider retries
            assert send_one(event).status == 200
    assert balance(db, BOB) == 0
    assert_ledger_consistent(db)


CAROL = uuid.UUID("44444444-4444-4444-8444-444444444444")


def _refunded_after_she_spent_it(client, db):
    """Carol credited 300 cents, which she spent, then refunded them all: the refund's answer."""
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [CAROL])
    send(client, payment("evt_carol", user=CAROL, cents=300, paymentId="pay_carol"))
    db.execute("UPDATE user_balances SET balance_cents = 0, opening_balance_cents = -300 WHERE user_id = %s",
               [CAROL])  # she spent it (outside the ledger's journal, as an opening balance)
    return send(client, payment_refunded("pay_carol", 300))


def test_a_refund_may_take_a_balance_below_zero(client, db):
    assert _refunded_after_she_spent_it(client, db).json["status"] == "processed"
    assert balance(db, CAROL) == -300


def test_a_balance_taken_below_zero_is_counted(client, db):
    _refunded_after_she_spent_it(client, db)
    assert _metrics(client)[("webhook_ledger_balances_below_zero_total", (("source", "default"),))] == 1


def test_verify_reports_a_balance_below_zero_without_failing(client, db, run_cli):
    _refunded_after_she_spent_it(client, db)
    result = run_cli("ledger", "verify")
    assert result.exit_code == 0, result.output
    assert f"balance of user {CAROL} is below zero: -300 cents" in result.output
    assert "1 balances below zero" in result.output


def test_the_delivery_line_names_the_payment_and_the_change(client, db, caplog):
    caplog.set_level(logging.INFO, logger="app.receiver.webhooks")
    send(client, payment("evt_logged", cents=10, paymentId="pay_logged"))
    send(client, payment_refunded("pay_logged", 4))
    lines = [r for r in caplog.records if r.getMessage() == "delivery"]
    assert [(r.payment_id, r.change, r.outcome) for r in lines] == \
        [("pay_logged", "credit", Outcome.PROCESSED), ("pay_logged", "refund", Outcome.PROCESSED)]


def _paid_and_refunded(client):
    send(client, payment("evt_v1", cents=50, paymentId="pay_v"))
    send(client, payment_refunded("pay_v", 20))


def test_verify_reports_a_payment_credited_twice(client, db, run_cli):
    _paid_and_refunded(client)
    db.execute("INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)"
               " VALUES ('default', 'evt_forged', 'credit', 'pay_v', %s, 50)", [ALICE])
    result = run_cli("ledger", "verify")
    assert result.exit_code == 1
    assert "payment 'pay_v': credited 2 times" in result.output


def test_verify_reports_refunds_that_do_not_add_up(client, db, run_cli):
    _paid_and_refunded(client)
    db.execute("UPDATE payments SET refunded_cents = 30")
    result = run_cli("ledger", "verify")
    assert result.exit_code == 1
    assert "payment 'pay_v': 20 cents debited, its refunds and disputes make 30 due" in result.output


# -- any interleaving -----------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_for_any_interleaving_the_balance_is_opening_plus_amount_minus_the_highest_refunded_total(client, db, data):
    payment_id = f"pay_{uuid.uuid4().hex}"
    amount = data.draw(st.integers(1, 10_000), label="amount")
    announcements = [payment(f"evt_{uuid.uuid4().hex}", user=BOB, cents=amount, paymentId=payment_id)
                     for _ in range(data.draw(st.integers(1, 3), label="announcements"))]
    refunds = [payment_refunded(payment_id, total)
               for total in data.draw(st.lists(st.integers(1, amount), max_size=5), label="totals")]
    events = announcements + refunds
    # Each event delivered at least once, duplicates and reorders included.
    sent = data.draw(st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=6))))
    before = balance(db, BOB)
    for event in sent:
        assert send(client, event).status in (200, 422)
    for event in events:  # the provider retries what was refused (a refund before its payment)
        assert send(client, event).status == 200
    highest = max((r["data"]["amountRefundedCents"] for r in refunds), default=0)
    assert balance(db, BOB) - before == amount - highest
    assert_ledger_consistent(db)


@pytest.fixture
def run_cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))
