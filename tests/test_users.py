"""app/commands/users.py: `flask users add|show|list` on real PostgreSQL (`users link` is in test_links.py)."""

import uuid

import pytest

from app.core.vocabulary import minor_unit_name

from .helpers import ALICE, BOB, OPENING, payment, payment_refunded, record_currency, send

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


@pytest.mark.parametrize(("currency", "unit"), [("usd", "cents"), ("inr", "paise"), ("gbp", "pence"), ("jpy", "yen"),
                                               ("kwd", "minor units of KWD")])
def test_amounts_are_printed_in_the_ledgers_minor_unit_by_its_name(run, db, currency, unit):
    record_currency(db, currency)
    added = run("users", "add", str(CAROL), "--opening", "1500")
    adjusted = run("ledger", "adjust", str(CAROL), "--", "-20", "--reason", "rounding", "--by", "ana")
    shown = run("users", "show", str(CAROL))
    assert added.output == f"added user {CAROL} with an opening balance of 1500 {unit}\n"
    assert f"by -20 {unit} to 1480 {unit} " in adjusted.output, adjusted.output
    assert shown.output.splitlines()[1:4] == [f"balance:    1480 {unit}", f"opening:    1500 {unit}, created "
                                              f"{shown.output.splitlines()[2].rsplit('created ', 1)[1]}",
                                              f"journal:    1 rows, -20 {unit}"]
    assert shown.output.splitlines()[4].split()[3] == unit.split()[0].upper()
    assert minor_unit_name(currency.upper()) == unit
