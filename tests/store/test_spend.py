"""money.sql's spend, called as the application calls it (named arguments, one statement): it takes a user's
credit once per reference, journaled, so that balance = opening + journal holds and `flask ledger verify`
stays clean; it refuses, changing nothing, what it cannot spend; and a spend then a refund leaves a balance
below zero that verify lists without failing. Real PostgreSQL."""

import contextlib
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.rows import namedtuple_row

from app.store.ledger import Entry, SpendOutcome
from tests.helpers import (
    ALICE,
    BOB,
    UNKNOWN_USER,
    assert_ledger_consistent,
    balance,
    db_url,
    payment,
    payment_refunded,
    send,
)

pytestmark = pytest.mark.core


def spend(conn, user, cents, reference, **options):
    """SELECT * FROM spend(...) with named arguments (options: allow_negative), as the application calls it."""
    named = "".join(f", p_{name} => %({name})s" for name in options)
    return conn.cursor(row_factory=namedtuple_row).execute(
        f"SELECT * FROM spend(p_user => %(user)s, p_cents => %(cents)s, p_reference => %(reference)s{named})",
        {"user": user, "cents": cents, "reference": reference, **options}).fetchone()


def _spends(db):
    return db.cursor(row_factory=namedtuple_row).execute(
        "SELECT id, user_id, amount_cents, reference, source, event_id, payment_id, reason, actor"
        " FROM ledger_journal WHERE kind = %s ORDER BY id", [Entry.SPEND]).fetchall()


def test_a_spend_takes_its_amount_journaled_with_its_reference(db):
    spent = spend(db, ALICE, 300, "order-1")
    assert (spent.outcome, spent.balance_cents) == (SpendOutcome.SPENT, 1000 - 300)
    assert balance(db, ALICE) == 700
    (row,) = _spends(db)
    assert row.id == spent.journal_id
    assert (row.user_id, row.amount_cents, row.reference) == (ALICE, -300, "order-1")
    assert (row.source, row.event_id, row.payment_id, row.reason, row.actor) == (None,) * 5
    assert_ledger_consistent(db)


def test_a_second_spend_with_the_same_reference_returns_the_first(db):
    first = spend(db, ALICE, 300, "order-1")
    again = spend(db, ALICE, 300, "order-1")
    assert again.outcome == SpendOutcome.DUPLICATE
    assert (again.journal_id, again.spent_at, again.balance_cents) == (first.journal_id, first.spent_at, 700)


def test_a_second_spend_with_the_same_reference_changes_nothing(db):
    spend(db, ALICE, 300, "order-1")
    spend(db, ALICE, 300, "order-1")
    assert balance(db, ALICE) == 700
    assert len(_spends(db)) == 1
    assert_ledger_consistent(db)


@pytest.mark.parametrize("user, cents", [(ALICE, 301), (BOB, 300)], ids=["another-amount", "another-user"])
def test_the_same_reference_with_another_amount_or_user_is_refused(db, user, cents):
    first = spend(db, ALICE, 300, "order-1")
    with pytest.raises(psycopg.errors.UniqueViolation,
                       match=f"reference order-1 was spent by journal row {first.journal_id} with another user"):
        spend(db, user, cents, "order-1")


def test_a_spend_below_zero_is_refused(db):
    with pytest.raises(psycopg.errors.CheckViolation, match=f"the balance of user {ALICE} is 1000 cents: spending "
                                                            "1001 would take it below zero"):
        spend(db, ALICE, 1001, "order-1")


def test_a_refused_spend_records_nothing_so_its_reference_can_spend_later(db):
    with pytest.raises(psycopg.errors.CheckViolation):
        spend(db, BOB, 100, "order-1")
    db.execute("SELECT adjust(p_user => %s, p_cents => 100, p_reason => 'top-up', p_actor => 'test')", [BOB])
    assert spend(db, BOB, 100, "order-1").outcome == SpendOutcome.SPENT
    assert balance(db, BOB) == 0
    assert_ledger_consistent(db)


def test_a_spend_allowed_below_zero_takes_the_balance_below_zero(db):
    spent = spend(db, BOB, 200, "order-1", allow_negative=True)
    assert (spent.outcome, spent.balance_cents) == (SpendOutcome.SPENT, -200)
    assert balance(db, BOB) == -200
    assert_ledger_consistent(db)


def test_a_spend_beyond_bigints_range_is_refused(db):
    spend(db, ALICE, 2**63 - 1, "order-1", allow_negative=True)
    with pytest.raises(psycopg.errors.NumericValueOutOfRange, match="spending 2000 cents would overflow the balance"):
        spend(db, ALICE, 2000, "order-2", allow_negative=True)


# Refused for its arguments alone, on a fresh database: (user, cents, reference, error, message).
REFUSED_ARGUMENTS = {
    "zero": (ALICE, 0, "order-1", psycopg.errors.InvalidParameterValue,
             "a spend of 0 cents: the amount must be positive"),
    "negative": (ALICE, -5, "order-1", psycopg.errors.InvalidParameterValue,
                 "a spend of -5 cents: the amount must be positive"),
    "no-amount": (ALICE, None, "order-1", psycopg.errors.InvalidParameterValue, "a spend of NULL cents"),
    "empty-reference": (ALICE, 5, "", psycopg.errors.InvalidParameterValue, "reference must be 1 to 128 characters"),
    "long-reference": (ALICE, 5, "r" * 129, psycopg.errors.InvalidParameterValue,
                       "reference must be 1 to 128 characters"),
    "no-reference": (ALICE, 5, None, psycopg.errors.InvalidParameterValue, "reference must be 1 to 128 characters"),
    "unknown-user": (UNKNOWN_USER, 5, "order-1", psycopg.errors.NoDataFound, f"unknown user {UNKNOWN_USER}"),
}


@pytest.mark.parametrize("user, cents, reference, error, message", REFUSED_ARGUMENTS.values(), ids=REFUSED_ARGUMENTS)
def test_a_spend_is_refused_with_its_sqlstate(db, user, cents, reference, error, message):
    with pytest.raises(error, match=message):
        spend(db, user, cents, reference)


# Every refusal above: the spends made before it, then the refused one, each (user, cents, reference, options).
REFUSALS = {
    "another-amount": ([(ALICE, 300, "order-1", {})], (ALICE, 301, "order-1", {})),
    "another-user": ([(ALICE, 300, "order-1", {})], (BOB, 300, "order-1", {})),
    "below-zero": ([], (ALICE, 1001, "order-1", {})),
    "beyond-bigints-range": ([(ALICE, 2**63 - 1, "order-1", {"allow_negative": True})],
                             (ALICE, 2000, "order-2", {"allow_negative": True})),
    **{name: ([], (user, cents, reference, {})) for name, (user, cents, reference, _, _) in REFUSED_ARGUMENTS.items()},
}


def _state(db):
    """Every balance and every spend's journal row."""
    balances = db.execute("SELECT user_id, balance_cents FROM user_balances ORDER BY user_id").fetchall()
    return balances, _spends(db)


@pytest.mark.parametrize("made, refused", REFUSALS.values(), ids=REFUSALS)
def test_a_refused_spend_changes_nothing(db, made, refused):
    for user, cents, reference, options in made:
        spend(db, user, cents, reference, **options)
    before = _state(db)
    user, cents, reference, options = refused
    with contextlib.suppress(psycopg.Error):  # that it is refused, and how, is the tests' above
        spend(db, user, cents, reference, **options)
    assert _state(db) == before


def test_concurrent_spends_of_one_reference_spend_once(db):
    def spend_alone(_):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            return spend(conn, ALICE, 300, "order-1").outcome

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(spend_alone, range(8)))
    assert outcomes == [SpendOutcome.DUPLICATE] * 7 + [SpendOutcome.SPENT]
    assert balance(db, ALICE) == 700
    assert_ledger_consistent(db)


def test_concurrent_spends_never_take_a_balance_below_zero(db):
    def spend_alone(n):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            try:
                return spend(conn, ALICE, 300, f"order-{n}").outcome
            except psycopg.errors.CheckViolation:
                return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(spend_alone, range(8)))
    assert outcomes == ["refused"] * 5 + [SpendOutcome.SPENT] * 3
    assert balance(db, ALICE) == 1000 - 900
    assert_ledger_consistent(db)


def test_a_refund_after_the_credit_was_spent_leaves_a_balance_below_zero_that_verify_lists(client, db, app):
    send(client, payment("evt_paid", user=BOB, cents=300, paymentId="pay_b"))
    assert spend(db, BOB, 300, "order-1").balance_cents == 0
    assert send(client, payment_refunded("pay_b", 300)).json["status"] == "processed"
    assert balance(db, BOB) == -300
    result = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"balance of user {BOB} is below zero: -300 cents",
        "ledger consistent: 2 users, 2 stored events, 1 payments, 3 journal rows; 1 balances below zero"]
    assert_ledger_consistent(db)
