"""app/commands/users.py: `flask users add|show|list` on real PostgreSQL (`users link` is in test_links.py)."""

import uuid

import pytest

from app.core.vocabulary import minor_unit_name
from tests.application import call, hold
from tests.helpers import ALICE, BOB, OPENING, payment, payment_refunded, record_currency, send

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
    assert lines[2] == f"available:  {OPENING[BOB] + 400 - 150 + 25} cents (nothing held)"
    assert lines[3].startswith(f"opening:    {OPENING[BOB]} cents")
    assert lines[4] == "journal:    3 rows, +275 cents"
    assert lines[5].split() == ["WHEN", "(UTC)", "KIND", "CENTS", "MOVEMENT", "MADE", "BY"]
    assert lines[6].split()[2:] == ["credit", "+400", "pay_1", "event", "evt_paid", "(payment.succeeded)"]
    assert lines[7].split()[2:] == ["refund", "-150", "pay_1", "event", "evt_refunded", "(payment.refunded)"]
    assert lines[8].split()[2:] == ["adjustment", "+25", "-", "ana:", "goodwill"]


def test_show_prints_the_available_balance_each_active_hold_and_give_backs(run, db):
    hold(db, ALICE, 300, "job-1")
    hold(db, ALICE, 200, "job-2")
    call(db, "capture_hold", reference="job-2", cents=150)
    hold(db, ALICE, 100, "job-3")
    db.execute("UPDATE holds SET expires_at = now() - interval '1 second' WHERE reference = 'job-3'")  # time passed
    call(db, "give_back", reference="job-2")
    lines = run("users", "show", str(ALICE)).output.splitlines()
    assert lines[1:3] == ["balance:    1000 cents", "available:  700 cents (300 cents held by 1 holds)"]
    assert lines[3].startswith("hold:       job-1, 300 cents until ")
    assert lines[-2].split()[2:] == ["spend", "-150", "-", "spend", "job-2"]
    assert lines[-1].split()[2:] == ["give_back", "+150", "-", "give", "back", "job-2"]


def test_tidy_holds_releases_the_expired_ones(run, db):
    hold(db, ALICE, 300, "job-1")
    hold(db, ALICE, 200, "job-2")
    db.execute("UPDATE holds SET expires_at = now() - interval '1 second' WHERE reference = 'job-2'")  # time passed
    assert run("users", "tidy-holds").output == "released 1 expired holds\n"
    assert db.execute("SELECT reference, state FROM holds ORDER BY 1").fetchall() == [("job-1", "held"),
                                                                                      ("job-2", "released")]


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
    lines = {line.split(":", 1)[0]: line for line in shown.output.splitlines()[:6]}
    assert lines["balance"] == f"balance:    1480 {unit}"
    assert lines["available"] == f"available:  1480 {unit} (nothing held)"
    assert lines["opening"].startswith(f"opening:    1500 {unit}, created ")
    assert lines["journal"] == f"journal:    1 rows, -20 {unit}"
    assert shown.output.splitlines()[5].split()[3] == unit.split()[0].upper()
    assert minor_unit_name(currency.upper()) == unit


def test_add_gives_the_user_the_applications_key_and_show_finds_it_by_that_key(run, db):
    added = run("users", "add", str(CAROL), "--key", "4217")
    assert added.exit_code == 0, added.output
    assert added.output.splitlines()[0] == f"user {CAROL} has the key 4217"
    assert run("users", "show", "4217").output.splitlines()[0] == f"user:       {CAROL} (key 4217)"
    taken = run("users", "add", str(BOB), "--key", "4217")
    assert taken.exit_code == 1 and f"key 4217 is user {CAROL}'s, not user {BOB}'s: nothing changed" in taken.output
    assert run("users", "show", "4218").output == "Error: no user has the key 4218 (nor is it a UUID)\n"
