"""Statements (money.sql's balance_at and statement, `flask users statement`): a user's balance at a time and the
movements of a period, from the journal; a statement's opening plus its rows is its closing, its rows are exactly
the user's journal rows of the period, and consecutive periods share no row. Real PostgreSQL."""

import csv
import io
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.application import call, hold
from tests.helpers import ALICE, BOB, OPENING, payment, payment_refunded, send

pytestmark = pytest.mark.core


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _at(db, when):
    return db.execute("SELECT balance_cents FROM balance_at(p_user => %s, p_at => %s)", [ALICE, when]).fetchone()[0]


def _statement(db, since, until, user=ALICE):
    return db.execute("SELECT id, amount_cents, balance_after_cents FROM statement(p_user => %s, p_from => %s,"
                      " p_to => %s)", [user, since, until]).fetchall()


def _journal(db, since, until, user=ALICE):
    return db.execute("SELECT id, amount_cents FROM ledger_journal WHERE user_id = %s AND created_at >= %s"
                      " AND created_at < %s ORDER BY id", [user, since, until]).fetchall()


def _backdate(db, journal_id, when):
    """The journal row was written at when (as if long ago: the owner's write, for the test's calendar)."""
    db.execute("UPDATE ledger_journal SET created_at = %s WHERE id = %s", [when, journal_id])


JAN, FEB, MAR = (datetime(2026, month, 1, tzinfo=UTC) for month in (1, 2, 3))


@pytest.fixture
def months(client, db):
    """ALICE's movements over January and February: a credit, a spend, a refund, a capture, a give-back."""
    moves = []
    send(client, payment("evt_paid", user=ALICE, cents=800, paymentId="pay_1"))
    moves.append(JAN + timedelta(days=2))
    call(db, "spend", user=ALICE, cents=300, reference="order-1")
    moves.append(JAN + timedelta(days=20))
    send(client, payment_refunded("pay_1", 200, event_id="evt_refunded"))
    moves.append(FEB + timedelta(hours=1))
    hold(db, ALICE, 400, "job-1")
    call(db, "capture_hold", reference="job-1", cents=150)
    moves.append(FEB + timedelta(days=10))
    call(db, "give_back", reference="order-1")
    moves.append(MAR - timedelta(microseconds=1))
    ids = [row[0] for row in db.execute("SELECT id FROM ledger_journal WHERE user_id = %s ORDER BY id", [ALICE])]
    for journal_id, when in zip(ids, moves, strict=True):
        _backdate(db, journal_id, when)
    return ids


def test_a_statement_is_the_users_journal_rows_of_the_period_with_the_balance_each_left(db, months):
    rows = _statement(db, FEB, MAR)
    assert [(i, cents) for i, cents, _ in rows] == _journal(db, FEB, MAR) == [
        (months[2], -200), (months[3], -150), (months[4], 300)]
    opening = _at(db, FEB)
    assert opening == OPENING[ALICE] + 800 - 300
    assert [after for _, _, after in rows] == [opening - 200, opening - 350, opening - 50]
    assert _at(db, MAR) == opening + sum(cents for _, cents, _ in rows)


def test_consecutive_statements_share_no_row_and_chain_their_balances(db, months):
    january, february = _statement(db, JAN, FEB), _statement(db, FEB, MAR)
    assert {r[0] for r in january} | {r[0] for r in february} == set(months)
    assert not {r[0] for r in january} & {r[0] for r in february}
    assert january[-1][2] == _at(db, FEB) == february[0][2] - february[0][1]
    assert _at(db, JAN) == OPENING[ALICE]


def test_the_balance_now_is_the_balance_at_any_time_after_the_last_row(db, months):
    assert _at(db, datetime.now(UTC) + timedelta(days=1)) == \
        db.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [ALICE]).fetchone()[0]


def test_a_statement_of_an_unknown_user_or_a_backwards_period_is_refused(db):
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown user"):
        _statement(db, JAN, FEB, user="33333333-3333-4333-8333-333333333333")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="ends before it starts"):
        _statement(db, FEB, JAN)


def test_the_command_prints_opening_closing_and_each_row(run, db, months):
    printed = run("users", "statement", str(ALICE), "--from", "2026-02-01", "--to", "2026-03-01")
    assert printed.exit_code == 0, printed.output
    lines = printed.output.splitlines()
    opening = OPENING[ALICE] + 500
    assert lines[:4] == [f"user:       {ALICE}", "period:     2026-02-01 00:00:00Z to 2026-03-01 00:00:00Z",
                         f"opening:    {opening} cents", f"closing:    {opening - 50} cents (3 rows, -50 cents)"]
    assert [line.split()[2:4] for line in lines[5:]] == [["refund", "-200"], ["spend", "-150"], ["give_back", "+300"]]


def test_the_commands_csv_is_one_row_per_journal_row_adding_up_to_the_closing_balance(run, db, months):
    printed = run("users", "statement", str(ALICE), "--from", "2026-01-01", "--to", "2026-03-01", "--csv")
    assert printed.exit_code == 0, printed.output
    rows = list(csv.DictReader(io.StringIO(printed.output)))
    assert [int(r["id"]) for r in rows] == months
    assert [r["kind"] for r in rows] == ["credit", "spend", "refund", "spend", "give_back"]
    assert rows[0]["created_at"] == "2026-01-03T00:00:00+00:00"
    assert (rows[3]["reference"], rows[2]["event_id"], rows[2]["payment_id"]) == ("job-1", "evt_refunded", "pay_1")
    assert OPENING[ALICE] + sum(int(r["amount_cents"]) for r in rows) == int(rows[-1]["balance_after_cents"]) == \
        _at(db, MAR)


def test_the_command_names_the_user_by_its_key(run, db, months):
    call(db, "add_user_key", key="4217", user=ALICE)
    printed = run("users", "statement", "4217", "--from", "2026-02-01", "--to", "2026-03-01").output.splitlines()
    assert printed[0] == f"user:       {ALICE} (key 4217)"


def test_the_command_refuses_a_backwards_period_and_an_unknown_user(run):
    assert run("users", "statement", str(BOB), "--from", "2026-02-01", "--to", "2026-01-01").exit_code == 2
    assert "no user has the key nobody" in run("users", "statement", "nobody", "--from", "2026-01-01").output
