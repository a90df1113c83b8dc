"""app/legacy.py: `flask ledger legacy-payments` and `flask ledger name-payment` on real PostgreSQL, on payments
filed as migration 002 filed a credit whose event was purged before the upgrade (the upgrades themselves:
tests/test_db.py)."""

import pytest

from .helpers import ALICE, BOB, balance, payment, send

pytestmark = pytest.mark.core


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()

    def invoke(*args):
        return runner.invoke(args=list(args))

    return invoke


def _filed_by_002(db, event_id, user=BOB, cents=300, source="default"):
    """A credit of a release before payments whose event was purged before 002 ran: filed under its event id,
    credited before 002 was recorded (this database's 002 is recorded at its creation)."""
    db.execute("INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id, created_at)"
               " VALUES (%s, %s, %s, %s, 'usd', %s, now() - interval '40 days')",
               [source, event_id, user, cents, event_id])
    db.execute("INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents, created_at)"
               " VALUES (%s, %s, 'credit', %s, %s, %s, now() - interval '40 days')",
               [source, event_id, event_id, user, cents])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + %s WHERE user_id = %s", [cents, user])


def _purged(db, event_id):
    db.execute("DELETE FROM webhook_events WHERE event_id = %s", [event_id])


def _refunded(event_id, payment_id, total):
    return {"id": event_id, "type": "payment.refunded", "data": {"paymentId": payment_id, "amountRefundedCents": total}}


def test_legacy_payments_lists_only_the_credits_of_a_release_before_payments_per_source(client, db, run):
    _filed_by_002(db, "evt_a")
    _filed_by_002(db, "evt_b", source="billing")
    # This release files a payment without data.paymentId under its event id too, by design: never legacy.
    assert send(client, payment("evt_own", paymentId=None)).json["status"] == "processed"
    _purged(db, "evt_own")
    listed = run("ledger", "legacy-payments")
    assert listed.exit_code == 0, listed.output
    rows = [line.split()[:5] for line in listed.output.splitlines()[1:3]]
    assert rows == [["default", "evt_a", str(BOB), "300", "usd"], ["billing", "evt_b", str(BOB), "300", "usd"]]
    assert "its event is no longer stored" in listed.output and "evt_own" not in listed.output
    only = run("ledger", "legacy-payments", "--source", "billing").output.splitlines()
    assert [line.split()[:2] for line in only[1:-1]] == [["billing", "evt_b"]], only

    named = run("ledger", "name-payment", "evt_b", "pi_b", "--source", "billing")
    assert named.exit_code == 0, named.output
    assert db.execute("SELECT source, payment_id, event_id FROM payments WHERE user_id = %s ORDER BY source",
                      [BOB]).fetchall() == [("billing", "pi_b", "evt_b"), ("default", "evt_a", "evt_a")]
    assert "evt_b" not in run("ledger", "legacy-payments").output


def _named_with_a_refund_waiting(client, db, run):
    """evt_a filed by 002, refunded 80 cents by pay_a (422: unknown), then named pay_a: name-payment's lines."""
    _filed_by_002(db, "evt_a")
    waiting = send(client, _refunded("evt_r1", "pay_a", 80))
    assert (waiting.status, waiting.json["message"]) == (422, "unknown payment pay_a")
    return run("ledger", "name-payment", "evt_a", "pay_a").output.splitlines()


def test_naming_files_the_credit_under_the_new_id(client, db, run):
    named = _named_with_a_refund_waiting(client, db, run)
    assert named[0] == f"payment 'evt_a' (300 cents to {BOB}, credited by event 'evt_a') is now payment 'pay_a'"
    assert db.execute("SELECT event_id, kind, payment_id, amount_cents FROM ledger_journal WHERE kind = 'credit'"
                      ).fetchall() == [("evt_a", "credit", "pay_a", 300)]
    assert db.execute("SELECT payment_id, event_id FROM payments").fetchall() == [("pay_a", "evt_a")]


def test_naming_replays_the_refunds_that_waited_for_it(client, db, run):
    named = _named_with_a_refund_waiting(client, db, run)
    assert named[1:] == ["replayed 1 failed events that waited for payment 'pay_a':",
                         "  evt_r1: processed; now completed"]
    assert db.execute("SELECT event_id, kind, payment_id, amount_cents FROM ledger_journal WHERE kind = 'refund'"
                      ).fetchall() == [("evt_r1", "refund", "pay_a", -80)]


def test_a_refund_by_the_new_id_is_applied_after_the_naming(client, db, run):
    _named_with_a_refund_waiting(client, db, run)
    assert send(client, _refunded("evt_r2", "pay_a", 120)).json["status"] == "processed"
    assert db.execute("SELECT event_id, kind, payment_id, amount_cents FROM ledger_journal WHERE user_id = %s"
                      " ORDER BY id", [BOB]).fetchall() == [
        ("evt_a", "credit", "pay_a", 300), ("evt_r1", "refund", "pay_a", -80), ("evt_r2", "refund", "pay_a", -40)]
    assert db.execute("SELECT payment_id, event_id, refunded_cents, debited_cents FROM payments").fetchall() == [
        ("pay_a", "evt_a", 120, 120)]
    assert balance(db, BOB) == 300 - 120
    verified = run("ledger", "verify")
    assert verified.exit_code == 0, verified.output


@pytest.fixture
def named_payments(client, db):
    """evt_a and evt_refunded filed by 002 (evt_refunded refunded under that id), evt_taken's payment
    pay_evt_taken credited, evt_stored and evt_new filed under their event ids, evt_new's event purged."""
    _filed_by_002(db, "evt_a")
    _filed_by_002(db, "evt_refunded")
    assert send(client, _refunded("evt_r", "evt_refunded", 10)).json["status"] == "processed"
    for stored in ("evt_taken", "evt_stored", "evt_new"):
        paid = payment(stored, user=ALICE, cents=5) if stored == "evt_taken" else payment(stored, paymentId=None)
        assert send(client, paid).json["status"] == "processed"
    _purged(db, "evt_new")


REFUSED_NAMINGS = pytest.mark.parametrize("event_id, payment_id, error", [
    ("evt_missing", "pi_x", "no payment of source 'default' is filed under the id of event 'evt_missing'"),
    ("evt_a", "", "PAYMENT_ID must be 1 to 128 characters that PostgreSQL can store"),
    ("evt_a", "p" * 129, "PAYMENT_ID must be 1 to 128 characters that PostgreSQL can store"),
    ("evt_a", "evt_a", "payment 'evt_a' is filed under that id already"),
    ("evt_a", "pay_evt_taken", "payment 'pay_evt_taken' of source 'default' exists already, credited by event "
                               "'evt_taken'"),
    ("evt_stored", "pi_x", "event 'evt_stored' of source 'default' is stored, and its bytes name payment "
                           "'evt_stored': only a payment whose event is gone can be named"),
    ("evt_new", "pi_x", "payment 'evt_new' of source 'default' was credited by a release that files a payment "
                        "without data.paymentId under its event's id: it is not a legacy payment"),
    # Its sender refunded it by its event id: that is the id it knows it by.
    ("evt_refunded", "pi_x", "payment 'evt_refunded' of source 'default' has refunds or disputes under that id, so "
                             "its sender knows it by it: it is not renamed"),
])


@REFUSED_NAMINGS
def test_name_payment_refuses_in_one_line(named_payments, run, event_id, payment_id, error):
    refused = run("ledger", "name-payment", event_id, payment_id)
    assert (refused.exit_code, refused.output) == (1, f"Error: {error}\n")


@REFUSED_NAMINGS
def test_a_refused_name_payment_changes_nothing(named_payments, db, run, event_id, payment_id, error):
    before = db.execute("SELECT * FROM payments ORDER BY source, payment_id").fetchall()
    run("ledger", "name-payment", event_id, payment_id)
    assert db.execute("SELECT * FROM payments ORDER BY source, payment_id").fetchall() == before


@pytest.mark.parametrize("args", [("legacy-payments",), ("name-payment", "evt_a", "pi_a")])
def test_the_commands_say_in_one_line_that_the_database_is_unavailable(make_app, config, args):
    app = make_app({**config, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nothing", "PG_POOL_TIMEOUT_MS": 1000})
    result = app.test_cli_runner().invoke(args=["ledger", *args])
    assert result.exit_code == 1
    assert result.output.startswith("Error: database unavailable: ") and result.output.count("\n") == 1, result.output
