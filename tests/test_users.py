"""app/commands/users.py: `flask users add|show|list` on real PostgreSQL (`users link` is in test_links.py)."""

import uuid

import pytest

from .helpers import ALICE, BOB, OPENING, payment, payment_refunded, send

pytestmark = pytest.mark.core

CAROL = uuid.UUID("44444444-4444-4444-8444-444444444444")


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def test_add_creates_a_user_with_its_opening_balance_once(run, db):
    added = run("users", "add", str(CAROL), "--opening", "1500")
    assert added.output == f"added user {CAROL} with an opening balance of 1500 cents\n"
    assert run("users", "add", str(CAROL), "--opening", "1500").exit_code == 0  # the same: nothing changed
    other = run("users", "add", str(CAROL), "--opening", "20")
    assert other.exit_code == 1 and "opening balance of 1500 cents, not 20" in other.output
    assert db.execute("SELECT balance_cents, opening_balance_cents FROM user_balances WHERE user_id = %s",
                      [CAROL]).fetchone() == (1500, 1500)


def test_add_opens_a_balance_at_zero_by_default(run, db):
    assert run("users", "add", str(CAROL)).exit_code == 0
    assert db.execute("SELECT opening_balance_cents FROM user_balances WHERE user_id = %s", [CAROL]).fetchone() == (0,)


def test_add_refuses_an_id_that_is_not_a_uuid(run, db):
    assert run("users", "add", "carol").exit_code == 2
    assert db.execute("SELECT count(*) FROM user_balances").fetchone()[0] == len(OPENING)


def test_show_prints_balance_opening_and_each_movement_with_its_event(client, run):
    send(client, payment("evt_paid", user=BOB, cents=400, paymentId="pay_1"))
    send(client, payment_refunded("pay_1", 150, event_id="evt_refunded"))
    run("ledger", "adjust", str(BOB), "25", "--reason", "goodwill", "--by", "ana")
    shown = run("users", "show", str(BOB))
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[1] == f"balance:    {OPENING[BOB] + 400 - 150 + 25} cents"
    assert lines[2].startswith(f"opening:    {OPENING[BOB]} cents")
    assert lines[3] == "journal:    3 rows, +275 cents"
    assert lines[4].split() == ["WHEN", "(UTC)", "KIND", "CENTS", "MOVEMENT", "MADE", "BY"]
    assert lines[5].split()[2:] == ["credit", "+400", "pay_1", "event", "evt_paid", "(payment.succeeded)"]
    assert lines[6].split()[2:] == ["refund", "-150", "pay_1", "event", "evt_refunded", "(payment.refunded)"]
    assert lines[7].split()[2:] == ["adjustment", "+25", "-", "ana:", "goodwill"]


def test_show_of_an_unknown_user_says_how_to_create_it(run):
    shown = run("users", "show", str(CAROL))
    assert shown.exit_code == 1 and f"flask users add {CAROL}" in shown.output


def test_list_shows_every_user_with_balance_and_journal_rows(client, run):
    send(client, payment(user=ALICE, cents=10))
    listed = run("users", "list").output.splitlines()
    assert listed[0].split() == ["USER", "BALANCE", "OPENING", "JOURNAL", "ROWS", "CREATED", "(UTC)"]
    rows = {line.split()[0]: line.split()[1:4] for line in listed[1:]}
    assert rows == {str(ALICE): [str(OPENING[ALICE] + 10), str(OPENING[ALICE]), "1"],
                    str(BOB): [str(OPENING[BOB]), str(OPENING[BOB]), "0"]}
