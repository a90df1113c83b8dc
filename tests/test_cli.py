"""app/cli.py: `flask events list|show|replay|purge` and `flask ledger verify` on real PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest

from .helpers import (
    BOB,
    UNKNOWN_USER,
    assert_ledger_consistent,
    balance,
    deliver,
    event_rows,
    payment,
    stored_event_row,
)


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()

    def invoke(*args):
        return runner.invoke(args=list(args))

    return invoke


def _age(db, event_id, days):
    db.execute("UPDATE webhook_events SET created_at = now() - make_interval(days => %s) WHERE event_id = %s",
               [days, event_id])


# -- list and show ------------------------------------------------------------

def test_list_shows_a_table_newest_first_and_filters(client, db, run):
    deliver(client, payment("evt_a", cents=10))
    deliver(client, payment("evt_b", user=UNKNOWN_USER))  # unknown user: failed
    deliver(client, {"id": "evt_c", "type": "customer.created", "data": {}})
    _age(db, "evt_a", 3)

    result = run("events", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["SOURCE", "EVENT", "ID", "TYPE"]
    assert [line.split()[:2] for line in lines[1:]] == [["default", eid] for eid in ("evt_c", "evt_b", "evt_a")]
    assert "unknown user" in lines[2]

    assert _ids(run("events", "list", "--status", "failed")) == ["evt_b"]
    assert _ids(run("events", "list", "--status", "failed", "--status", "completed", "--limit", "2")) == \
        ["evt_c", "evt_b"]
    assert _ids(run("events", "list", "--type", "payment.succeeded")) == ["evt_b", "evt_a"]
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    assert _ids(run("events", "list", "--since", yesterday)) == ["evt_c", "evt_b"]
    assert run("events", "list", "--status", "processing").output == "no events\n"


def _ids(result):
    assert result.exit_code == 0, result.output
    return [line.split()[1] for line in result.output.splitlines()[1:]]


def test_list_refuses_an_unknown_status(run):
    result = run("events", "list", "--status", "done")
    assert result.exit_code == 2
    assert "done" in result.output


def test_show_prints_payload_status_attempts_error_and_times(client, db, run):
    event = payment("evt_show", user=UNKNOWN_USER, cents=77)
    deliver(client, event)
    deliver(client, event)
    result = run("events", "show", "evt_show")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "status:         failed" in out
    assert "attempts:       2" in out
    assert f"last error:     unknown user {UNKNOWN_USER}" in out
    assert '"amountCents": 77' in out  # the stored payload, pretty-printed
    assert "received:       20" in out and "completed:      -" in out
    assert "balance change: -" in out


def test_show_of_an_unknown_event_fails(run):
    result = run("events", "show", "evt_nope")
    assert result.exit_code == 1
    assert "no stored event 'evt_nope'" in result.output


# -- replay ---------------------------------------------------------------------

def test_replayed_failed_event_converges_to_completed_exactly_once(client, db, run):
    event = payment("evt_replay", user=UNKNOWN_USER, cents=700)
    assert deliver(client, event).status_code == 422
    result = run("events", "replay", "evt_replay")
    assert result.exit_code == 1
    assert "still failed: unknown user" in result.output
    stored = stored_event_row(db, "evt_replay")
    assert stored.status == "failed" and stored.attempts == 2

    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    result = run("events", "replay", "evt_replay")
    assert result.exit_code == 0, result.output
    assert result.output == "evt_replay: processed; now completed\n"
    stored = stored_event_row(db, "evt_replay")
    assert stored.status == "completed" and stored.attempts == 3
    assert balance(db, UNKNOWN_USER) == 700

    # Replaying again, and the provider's own retry, change nothing.
    result = run("events", "replay", "evt_replay")
    assert (result.exit_code, result.output) == (0, "evt_replay: already completed; nothing changed\n")
    assert deliver(client, event).json["status"] == "duplicate"
    assert balance(db, UNKNOWN_USER) == 700
    assert db.execute("SELECT count(*) FROM ledger_journal WHERE event_id = 'evt_replay'").fetchone()[0] == 1
    assert run("ledger", "verify").exit_code == 0
    assert_ledger_consistent(db)


def test_replay_all_failed_reports_each_event(client, db, run):
    deliver(client, payment("evt_f1", user=UNKNOWN_USER, cents=5))
    deliver(client, payment("evt_f2", user=BOB, cents=0))  # amount 0 stays unprocessable
    deliver(client, payment("evt_ok", cents=1))
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    result = run("events", "replay", "--all-failed")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "evt_f1: processed; now completed",
        "evt_f2: still failed: data.amountCents must be a positive integer",
        "replayed 2 failed events: 1 completed, 1 still failed",
    ]
    assert balance(db, UNKNOWN_USER) == 5 and balance(db, BOB) == 0 and balance(db) == 1001


@pytest.mark.parametrize("args", [(), ("evt_x", "--all-failed")])
def test_replay_needs_one_event_or_all_failed(run, args):
    assert run("events", "replay", *args).exit_code == 2


def test_replay_of_an_unknown_event_fails(run, db):
    result = run("events", "replay", "evt_nope")
    assert (result.exit_code, result.output) == (1, "evt_nope: no such stored event\n")


# -- purge ------------------------------------------------------------------------

def test_purge_deletes_old_completed_events_in_batches_and_keeps_the_ledger(client, db, run):
    for i in range(5):
        deliver(client, payment(f"evt_old_{i}", cents=10))
        _age(db, f"evt_old_{i}", 40)
    deliver(client, payment("evt_old_failed", user=UNKNOWN_USER))
    _age(db, "evt_old_failed", 40)
    deliver(client, payment("evt_recent", cents=10))

    result = run("events", "purge", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("purged 5 completed events received before ")
    remaining = {r[0] for r in db.execute("SELECT event_id FROM webhook_events")}
    assert remaining == {"evt_old_failed", "evt_recent"}
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone()[0] == 6
    assert run("ledger", "verify").exit_code == 0

    # The provider resends a purged event by hand: its credit is not repeated.
    assert deliver(client, payment("evt_old_3", cents=10)).json["status"] == "duplicate"
    assert balance(db) == 1060
    assert run("ledger", "verify").exit_code == 0


def test_purge_refuses_a_window_under_35_days_without_force(client, db, run):
    deliver(client, payment("evt_young", cents=10))
    _age(db, "evt_young", 10)
    result = run("events", "purge", "--older-than", "7")
    assert result.exit_code == 2
    assert "--force" in result.output
    assert event_rows(db) == 1
    assert run("events", "purge", "--older-than", "7", "--force").exit_code == 0
    assert event_rows(db) == 0


def test_purge_keeps_failed_events_unless_forced(client, db, run):
    deliver(client, payment("evt_old_failed", user=UNKNOWN_USER))
    _age(db, "evt_old_failed", 400)
    assert run("events", "purge").output.startswith("purged 0 completed events")
    assert run("events", "purge", "--include-failed").exit_code == 2
    result = run("events", "purge", "--include-failed", "--force")
    assert result.output.startswith("purged 1 completed and failed events")
    assert event_rows(db) == 0


# -- verify -----------------------------------------------------------------------

def test_verify_passes_on_a_consistent_ledger(client, db, run):
    deliver(client, payment(cents=10))
    deliver(client, payment(user=BOB, cents=20))
    deliver(client, payment(user=UNKNOWN_USER))
    result = run("ledger", "verify")
    assert result.exit_code == 0, result.output
    assert result.output == "ledger consistent: 2 users, 3 stored events, 2 payments, 2 journal rows\n"


def test_verify_fails_on_a_corrupted_balance_and_names_the_user(client, db, run):
    deliver(client, payment(cents=10))
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + 1 WHERE user_id = %s", [BOB])
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"balance of user {BOB}: 1 cents, expected 0 (opening 0 + journal 0)",
        "ledger INCONSISTENT: 1 problems (2 users, 1 stored events, 1 payments, 1 journal rows)",
    ]


@pytest.mark.parametrize("corruption, expected", [
    ("UPDATE webhook_events SET status = 'processing'", "stuck event 'evt_v': 'processing' since"),
    ("UPDATE webhook_events SET status = 'failed'", "journal row of event 'evt_v': the event is 'failed'"),
    ("DELETE FROM ledger_journal", "payment 'pay_evt_v': credited 0 times"),
    ("UPDATE ledger_journal SET amount_cents = 11", "completed event 'evt_v': credit of 11 cents"),
    ("ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_source_event_id_key;"
     " INSERT INTO webhook_events (event_id, event_type, status, body, payload, payload_sha256, completed_at)"
     " SELECT event_id, event_type, status, body, payload, payload_sha256, now() FROM webhook_events",
     "duplicated event id 'evt_v' of source 'default': stored 2 times"),
])
def test_verify_names_the_offending_event(client, db, run, corruption, expected):
    deliver(client, payment("evt_v", cents=10))
    db.execute(corruption)
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert expected in result.output
