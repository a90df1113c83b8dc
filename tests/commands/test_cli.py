"""app/commands/cli.py: `flask events list|show|replay|purge` and `flask ledger verify|adjust` on real PostgreSQL."""

import getpass
import os
import pty
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from psycopg.rows import namedtuple_row

from app.commands import base
from app.store.ledger import Entry
from devservers import ROOT, free_port
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import (
    ALICE,
    BOB,
    OPENING,
    UNKNOWN_USER,
    assert_ledger_consistent,
    balance,
    event_rows,
    payment,
    send,
    sources_config,
    stored_event_row,
)
from tests.providers.stripe.events import intent_succeeded

pytestmark = pytest.mark.core


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

def _three_events(client, db):
    """evt_a, completed three days ago; evt_b, failed; evt_c, completed with no balance effect."""
    send(client, payment("evt_a", cents=10))
    send(client, payment("evt_b", user=UNKNOWN_USER))  # unknown user: failed
    send(client, {"id": "evt_c", "type": "customer.created", "data": {}})
    _age(db, "evt_a", 3)


def test_list_shows_a_table_newest_first(client, db, run):
    _three_events(client, db)
    result = run("events", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["SOURCE", "EVENT", "ID", "TYPE"]
    assert [line.split()[:2] for line in lines[1:]] == [["default", eid] for eid in ("evt_c", "evt_b", "evt_a")]
    assert "unknown user" in lines[2]


def test_list_filters_by_each_option(client, db, run):
    _three_events(client, db)
    assert _ids(run("events", "list", "--status", "failed")) == ["evt_b"]
    assert _ids(run("events", "list", "--status", "failed", "--status", "completed", "--limit", "2")) == \
        ["evt_c", "evt_b"]
    assert _ids(run("events", "list", "--type", "payment.succeeded")) == ["evt_b", "evt_a"]
    yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    assert _ids(run("events", "list", "--since", yesterday)) == ["evt_c", "evt_b"]
    assert run("events", "list", "--status", "dismissed").output == "no events\n"


def _ids(result):
    assert result.exit_code == 0, result.output
    return [line.split()[1] for line in result.output.splitlines()[1:]]


def test_list_shows_the_last_error_whole_on_its_row(client, db, run):
    send(client, payment("evt_long", user=UNKNOWN_USER))
    send(client, payment("evt_short", user=UNKNOWN_USER))
    long_error = "unknown payment pi_" + "x" * 100 + ": its refund waits\nfor it"
    db.execute("UPDATE webhook_events SET last_error = %s WHERE event_id = 'evt_long'", [long_error])
    result = run("events", "list")
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert len(rows) == 2  # a newline in an error does not break its row
    long_row = next(row for row in rows if "evt_long" in row)
    assert long_row.endswith("unknown payment pi_" + "x" * 100 + ": its refund waits\\nfor it")
    assert header.index("LAST ERROR") == long_row.index("unknown payment") == rows[0].index("unknown ")


def test_list_refuses_an_unknown_status(run):
    result = run("events", "list", "--status", "done")
    assert result.exit_code == 2
    assert "done" in result.output


def test_show_prints_payload_status_attempts_error_and_times(client, db, run):
    event = payment("evt_show", user=UNKNOWN_USER, cents=77)
    send(client, event)
    send(client, event)
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
    assert send(client, event).status == 422
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
    assert send(client, event).json["status"] == "duplicate"
    assert balance(db, UNKNOWN_USER) == 700
    assert db.execute("SELECT count(*) FROM ledger_journal WHERE event_id = 'evt_replay'").fetchone()[0] == 1
    assert run("ledger", "verify").exit_code == 0
    assert_ledger_consistent(db)


def test_replay_all_failed_reports_each_event(client, db, run):
    send(client, payment("evt_f1", user=UNKNOWN_USER, cents=5))
    send(client, payment("evt_f2", user=BOB, cents=0))  # amount 0 stays unprocessable
    send(client, payment("evt_ok", cents=1))
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    result = run("events", "replay", "--all-failed")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "evt_f1: processed; now completed",
        "evt_f2: still failed: data.amountCents must be a positive integer",
        "replayed 2 failed events: 1 completed, 1 still failed",
    ]
    assert balance(db, UNKNOWN_USER) == 5 and balance(db, BOB) == 0 and balance(db) == 1001


def _failed_in_two_sources(make_app, config, db):
    """evt_here failed in the default source, evt_shop in the named source shop, both for a user not yet created."""
    client = make_app(sources_config(config, {"shop": "hmac-sha256"})).test_client()
    assert send(client, payment("evt_shop", user=UNKNOWN_USER), source="shop").status == 422
    assert send(client, payment("evt_here", user=UNKNOWN_USER)).status == 422
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    return stored_event_row(db, "evt_shop")


NOT_HERE = ("skipped 1 event of source 'shop', left as stored: its source is not configured in this shell "
            "(WEBHOOK_SOURCES, WEBHOOK_SECRET): evt_shop")


def test_replay_all_failed_skips_a_source_this_shell_does_not_configure_and_says_so(make_app, config, db, run):
    shop = _failed_in_two_sources(make_app, config, db)
    result = run("events", "replay", "--all-failed")  # a shell that serves the default source alone
    assert result.exit_code == 1
    assert result.output.splitlines() == ["evt_here: processed; now completed", NOT_HERE,
                                          "replayed 1 failed events: 1 completed, 0 still failed; skipped 1"]
    assert stored_event_row(db, "evt_shop") == shop  # its status, error, attempts and times as they were
    assert balance(db, UNKNOWN_USER) == 250


def test_replay_of_one_event_of_a_source_this_shell_does_not_configure_leaves_it(make_app, config, db, run):
    shop = _failed_in_two_sources(make_app, config, db)
    result = run("events", "replay", "evt_shop", "--source", "shop")
    assert (result.exit_code, result.output) == (1, NOT_HERE + "\n")
    assert stored_event_row(db, "evt_shop") == shop


def test_replay_of_many_events_off_a_terminal_prints_plain_progress_lines(client, db, run, monkeypatch):
    monkeypatch.setattr(base, "PROGRESS_EVERY", 2)
    for number in range(5):
        send(client, payment(f"evt_p{number}", user=UNKNOWN_USER, cents=1))
    result = run("events", "replay", "--all-failed")
    progress = [line for line in result.output.splitlines() if line.startswith("events replayed")]
    assert progress == ["events replayed: 2 of 5", "events replayed: 4 of 5"]


def test_verify_off_a_terminal_prints_plain_progress_lines(client, db, run, monkeypatch):
    monkeypatch.setattr(base, "PROGRESS_EVERY", 2)
    for number in range(5):
        send(client, payment(f"evt_v{number}", cents=1))
    result = run("ledger", "verify")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("stored events checked")]
    assert progress == ["stored events checked: 2 of 5", "stored events checked: 4 of 5"]


@pytest.mark.parametrize("scheme", ["stripe"])
def test_reconcile_off_a_terminal_prints_a_plain_progress_line_per_hundred_listed(make_app, config, db,
                                                                                 monkeypatch):
    monkeypatch.setattr(base, "PROGRESS_EVERY", 100)
    with StripeStandIn() as stand_in:
        an_hour_ago = int(time.time()) - 3600
        events = [intent_succeeded(f"pi_{number:03d}", cents=1) for number in range(250)]
        for evt in events:
            evt["created"] = an_hour_ago
        stand_in.add(*events)
        app = make_app({**config, "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url})
        result = app.test_cli_runner().invoke(args=["reconcile", "default"])
    assert result.exit_code == 0, result.output
    # A line once a page takes the count past each hundred: "events listed: 101" (a page is up to 100 events).
    progress = [line for line in result.output.splitlines() if line.startswith("events listed: ")]
    assert [int(line.removeprefix("events listed: ")) // 100 for line in progress] == [1, 2], result.output


def _on_a_terminal(config, *args):
    """`flask ARGS` with its stderr on a pseudo-terminal, as an operator runs it: (exit status, stdout, what the
    terminal showed)."""
    env = {"PATH": os.environ["PATH"], "COLUMNS": "120", **{name: str(value) for name, value in config.items()}}
    terminal, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "app", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=side, text=True)
    os.close(side)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # EIO: the command ended, its side of the terminal closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    out = proc.stdout.read()
    return proc.wait(120), out, shown.decode()


def test_verify_on_a_terminal_shows_a_bar_with_the_position_and_percentage_of_its_total(client, db, config):
    for number in range(250):
        send(client, payment(f"evt_t{number}", cents=1))
    status, out, shown = _on_a_terminal(config, "ledger", "verify")
    assert (status, out) == (0, "ledger consistent: 2 users, 250 stored events, 250 payments, 250 journal rows\n")
    assert re.search(r"stored events checked\s+\[#+-*\]\s+\d+/250\s+\d+%", shown), shown
    assert re.search(r"\[#+\]\s+250/250\s+100%", shown), shown


def test_purge_on_a_terminal_shows_a_bar_of_the_rows_to_go(client, db, config):
    for number in range(30):
        send(client, payment(f"evt_old{number}", cents=1))
        _age(db, f"evt_old{number}", 40)
    send(client, payment("evt_new", cents=1))
    status, out, shown = _on_a_terminal(config, "events", "purge", "--batch-size", "7")
    assert status == 0, out + shown
    assert out.startswith("purged 30 completed events received before "), out
    assert re.search(r"events purged\s+\[#+\]\s+30/30\s+100%", shown), shown


@pytest.mark.parametrize("scheme", ["stripe"])
def test_reconcile_on_a_terminal_counts_the_events_listed_in_place(config, db):
    with StripeStandIn() as stand_in:
        an_hour_ago = int(time.time()) - 3600
        events = [intent_succeeded(f"pi_{number:03d}", cents=1) for number in range(250)]
        for evt in events:
            evt["created"] = an_hour_ago
        stand_in.add(*events)
        status, out, shown = _on_a_terminal({**config, "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url},
                                            "reconcile", "default")
    assert status == 0, out + shown
    # Listed a page (up to 100) at a time, the count redrawn in place: no total to draw a bar to.
    assert re.findall(r"\revents listed: (\d+)", shown)[-1] == "250", shown
    assert "[" not in shown, shown


@pytest.mark.parametrize("args", [(), ("evt_x", "--all-failed")])
def test_replay_needs_one_event_or_all_failed(run, args):
    assert run("events", "replay", *args).exit_code == 2


def test_replay_of_an_unknown_event_fails(run, db):
    result = run("events", "replay", "evt_nope")
    assert (result.exit_code, result.output) == (1, "evt_nope: no such stored event\n")


# -- purge ------------------------------------------------------------------------

def _purge_old_events(client, db, run):
    """Five completed events and one failed, 40 days old, one completed now; purged two at a time."""
    for i in range(5):
        send(client, payment(f"evt_old_{i}", cents=10))
        _age(db, f"evt_old_{i}", 40)
    send(client, payment("evt_old_failed", user=UNKNOWN_USER))
    _age(db, "evt_old_failed", 40)
    send(client, payment("evt_recent", cents=10))
    result = run("events", "purge", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    return result


def test_purge_deletes_old_completed_events_in_batches(client, db, run):
    result = _purge_old_events(client, db, run)
    assert result.output.startswith("purged 5 completed events received before ")
    remaining = {r[0] for r in db.execute("SELECT event_id FROM webhook_events")}
    assert remaining == {"evt_old_failed", "evt_recent"}


def test_purge_keeps_the_ledger(client, db, run):
    _purge_old_events(client, db, run)
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone()[0] == 6
    assert run("ledger", "verify").exit_code == 0


def test_a_purged_event_resent_by_hand_is_not_credited_again(client, db, run, redis_client):
    _purge_old_events(client, db, run)
    redis_client.flushall()  # PostgreSQL, not a done marker, must answer
    assert send(client, payment("evt_old_3", cents=10)).json["status"] == "duplicate"
    assert balance(db) == 1060
    assert run("ledger", "verify").exit_code == 0


def test_purge_refuses_a_window_under_35_days_without_force(client, db, run):
    send(client, payment("evt_young", cents=10))
    _age(db, "evt_young", 10)
    result = run("events", "purge", "--older-than", "7")
    assert result.exit_code == 2
    assert "--force" in result.output
    assert event_rows(db) == 1
    assert run("events", "purge", "--older-than", "7", "--force").exit_code == 0
    assert event_rows(db) == 0


def test_purge_keeps_failed_events_unless_forced(client, db, run):
    send(client, payment("evt_old_failed", user=UNKNOWN_USER))
    _age(db, "evt_old_failed", 400)
    assert run("events", "purge").output.startswith("purged 0 completed events")
    assert run("events", "purge", "--include-failed").exit_code == 2
    result = run("events", "purge", "--include-failed", "--force")
    assert result.output.startswith("purged 1 completed and failed events")
    assert event_rows(db) == 0


# -- verify -----------------------------------------------------------------------

def test_verify_passes_on_a_consistent_ledger(client, db, run):
    send(client, payment(cents=10))
    send(client, payment(user=BOB, cents=20))
    send(client, payment(user=UNKNOWN_USER))
    result = run("ledger", "verify")
    assert result.exit_code == 0, result.output
    assert result.output == "ledger consistent: 2 users, 3 stored events, 2 payments, 2 journal rows\n"


def test_verify_names_the_user_whose_balance_is_corrupted(client, db, run):
    send(client, payment(cents=10))
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + 1 WHERE user_id = %s", [BOB])
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"balance of user {BOB}: 1 cents, expected 0 (opening 0 + journal 0)",
        "ledger INCONSISTENT: 1 problems (2 users, 1 stored events, 1 payments, 1 journal rows)",
    ]


@pytest.mark.parametrize("corruption, expected", [
    ("UPDATE webhook_events SET status = 'failed'", "journal row of event 'evt_v': the event is 'failed'"),
    ("DELETE FROM ledger_journal", "payment 'pay_evt_v': credited 0 times"),
    ("UPDATE ledger_journal SET amount_cents = 11", "completed event 'evt_v': credit of 11 cents"),
    ("ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_source_event_id_key;"
     " INSERT INTO webhook_events (event_id, event_type, status, body, payload_sha256, completed_at)"
     " SELECT event_id, event_type, status, body, payload_sha256, now() FROM webhook_events",
     "duplicated event id 'evt_v' of source 'default': stored 2 times"),
])
def test_verify_names_the_offending_event(client, db, run, corruption, expected):
    send(client, payment("evt_v", cents=10))
    db.execute(corruption)
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert expected in result.output


# -- adjust -----------------------------------------------------------------------

REASON = "pay_x credited twice: corrected by hand"


def _adjustments(db):
    return db.cursor(row_factory=namedtuple_row).execute(
        "SELECT id, user_id, amount_cents, reason, actor, source, event_id, payment_id, reference"
        " FROM ledger_journal WHERE kind = %s ORDER BY id", [Entry.ADJUSTMENT]).fetchall()


def _adjust_alice_by_250(run):
    result = run("ledger", "adjust", str(ALICE), "250", "--reason", REASON)
    assert result.exit_code == 0, result.output
    return result


def test_an_adjustment_is_journaled_with_its_reason_and_the_os_user(db, run):
    _adjust_alice_by_250(run)
    (row,) = _adjustments(db)
    assert (row.user_id, row.amount_cents, row.reason, row.actor) == (ALICE, 250, REASON, getpass.getuser())
    assert (row.source, row.event_id, row.payment_id, row.reference) == (None,) * 4
    assert balance(db, ALICE) == 1250


def test_an_adjustment_is_reported_in_one_line_naming_its_journal_row(db, run):
    result = _adjust_alice_by_250(run)
    (row,) = _adjustments(db)
    assert result.output == f"adjusted the balance of user {ALICE} by +250 cents to 1250 cents " \
                            f"(journal row {row.id}, by {getpass.getuser()})\n"


@pytest.mark.parametrize("args", [
    [str(ALICE), "-500", "--reason", REASON],
    ["--reason", REASON, str(ALICE), "-500"],
    ["--reason", REASON, "--", str(ALICE), "-500"],
    [str(ALICE), "--", "-500", "--reason", REASON],  # docs/operations.md's "`--` works too"
], ids=["before-the-options", "after-the-options", "after-a-double-dash", "a-double-dash-before-the-amount"])
def test_adjust_takes_a_negative_amount_wherever_it_is_written(db, run, args):
    result = run("ledger", "adjust", *args)
    assert result.exit_code == 0, result.output
    assert "by -500 cents to 500 cents" in result.output
    assert [row.amount_cents for row in _adjustments(db)] == [-500]
    assert balance(db, ALICE) == 500


def test_adjust_by_journals_who_made_it(db, run):
    result = run("ledger", "adjust", str(BOB), "100", "--reason", REASON, "--by", "ops:jane")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(", by ops:jane)\n")
    assert [row.actor for row in _adjustments(db)] == ["ops:jane"]


# What adjust refuses before it writes, and the message it says it in.
REFUSED = [
    pytest.param([ALICE, "0", "--reason", REASON], "an adjustment of 0 cents changes nothing", id="zero"),
    pytest.param([ALICE, "-5", "--reason", ""], "an adjustment needs a reason", id="no-reason"),
    pytest.param([ALICE, "-5", "--reason", " \t\n"], "an adjustment needs a reason", id="blank-reason"),
    pytest.param([ALICE, "-5", "--reason", "r" * 501], "the reason is 501 characters long, over 500",
                 id="long-reason"),
    pytest.param([ALICE, "-5", "--reason", REASON, "--by", ""],
                 "who made the adjustment must be named in 1 to 128 characters", id="nobody"),
    pytest.param([UNKNOWN_USER, "-5", "--reason", REASON], f"unknown user {UNKNOWN_USER}", id="unknown-user"),
    pytest.param([ALICE, str(2**63 - 1), "--reason", REASON],
                 f"an adjustment of {2**63 - 1} cents would overflow the balance of user {ALICE} (1000 cents)",
                 id="overflow"),
    pytest.param([ALICE, "-5", "--reason", REASON, "--payment", "pay_nope"],
                 "unknown payment pay_nope of source default", id="unknown-payment"),
    pytest.param([ALICE, "-5", "--reason", REASON, "--payment", "pay_evt_bob"],
                 f"payment pay_evt_bob was credited to user {BOB}, not to user {ALICE}", id="another-users-payment"),
]
# What click refuses as a usage error, before adjust runs.
MALFORMED = [
    pytest.param(["alice", "-5", "--reason", REASON], "Invalid value for 'USER_ID': 'alice' is not a valid UUID.",
                 id="user-not-a-uuid"),
    pytest.param([ALICE, "-5.00", "--reason", REASON], "Invalid value for 'CENTS': '-5.00' is not a valid integer",
                 id="cents-not-an-integer"),
    pytest.param([ALICE, str(2**63), "--reason", REASON],
                 "Invalid value for 'CENTS': 9223372036854775808 is not in the range", id="cents-beyond-bigint"),
    pytest.param([ALICE, "-5"], "Missing option '--reason'.", id="no-reason-option"),
    pytest.param([ALICE, "--reason", REASON], "Missing argument 'CENTS'.", id="no-cents"),
]


def _bob_paid(client):
    """Bob credited 40 cents by pay_evt_bob: a payment of another user than Alice's to adjust."""
    send(client, payment("evt_bob", user=BOB, cents=40))


@pytest.mark.parametrize("args, message", REFUSED)
def test_adjust_refuses_what_it_cannot_journal_in_one_line(client, db, run, args, message):
    _bob_paid(client)
    result = run("ledger", "adjust", *map(str, args))
    assert (result.exit_code, result.output) == (1, f"Error: {message}\n")


@pytest.mark.parametrize("args, message", MALFORMED)
def test_adjust_refuses_malformed_arguments_as_usage_errors(db, run, args, message):
    result = run("ledger", "adjust", *map(str, args))
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1].startswith(f"Error: {message}"), result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", [pytest.param(refusal.values[0], id=refusal.id) for refusal in REFUSED + MALFORMED])
def test_a_refused_adjustment_changes_nothing(client, db, run, args):
    _bob_paid(client)
    assert run("ledger", "adjust", *map(str, args)).exit_code != 0
    assert {user: balance(db, user) for user in OPENING} == {ALICE: 1000, BOB: 40}
    assert _adjustments(db) == []


def test_adjust_with_postgresql_unreachable_says_so_in_one_line(make_app, config):
    unreachable = {**config, "DATABASE_URL": f"postgresql://nobody@127.0.0.1:{free_port()}/ledger",
                   "PG_LOCK_TIMEOUT_MS": 100, "PG_STATEMENT_TIMEOUT_MS": 200, "PG_POOL_TIMEOUT_MS": 500}
    result = make_app(unreachable).test_cli_runner().invoke(args=["ledger", "adjust", str(ALICE), "-5",
                                                                  "--reason", REASON])
    assert result.exit_code == 1
    assert result.output.startswith("Error: database unavailable: ") and result.output.count("\n") == 1, \
        result.output


def test_a_command_with_postgresql_down_prints_the_cause_alone(config):
    """The pool's retries log nothing; the one line says why connecting fails, not only that the pool timed out."""
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": f"postgresql://nobody@127.0.0.1:{free_port()}/ledger"}
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", "events", "list"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith("Error: database unavailable: PoolTimeout: "), done.stderr
    assert "Connection refused" in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_verify_is_clean_after_adjustments_of_either_sign_and_spends(client, db, run):
    send(client, payment("evt_paid", user=BOB, cents=300))
    assert run("ledger", "adjust", str(BOB), "-120", "--reason", REASON).exit_code == 0
    assert run("ledger", "adjust", str(ALICE), "75", "--reason", REASON).exit_code == 0
    for _ in range(2):
        db.execute("SELECT spend(p_user => %s, p_cents => 100, p_reference => 'order-1')", [BOB])
    result = run("ledger", "verify")
    assert (result.exit_code, result.output) == \
        (0, "ledger consistent: 2 users, 1 stored events, 1 payments, 4 journal rows\n")
    assert (balance(db, ALICE), balance(db, BOB)) == (1075, 300 - 120 - 100)
    assert_ledger_consistent(db)


def _credited_twice(client, db):
    """A payment credited twice (a second credit journaled by hand): what an adjustment of it corrects."""
    send(client, payment("evt_v1", user=BOB, cents=50, paymentId="pay_v"))
    db.execute("INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)"
               " VALUES ('default', 'evt_v2', 'credit', 'pay_v', %s, 50)", [BOB])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + 50 WHERE user_id = %s", [BOB])


def test_a_payment_credited_twice_is_consistent_once_an_adjustment_of_it_takes_the_second_credit_back(
        client, db, run):
    _credited_twice(client, db)
    before = run("ledger", "verify")
    assert before.exit_code == 1
    assert "payment 'pay_v': credited 2 times: 100 cents in all, not its 50" in before.output
    result = run("ledger", "adjust", str(BOB), "-50", "--payment", "pay_v", "--reason", "pay_v credited twice")
    assert result.exit_code == 0, result.output
    assert result.output.endswith(", correcting payment pay_v)\n")
    after = run("ledger", "verify")
    assert (after.exit_code, after.output) == (0, "ledger consistent: 2 users, 1 stored events, 1 payments, "
                                                  "3 journal rows\n")
    assert balance(db, BOB) == 50


def test_an_adjustment_that_takes_back_more_than_the_second_credit_is_reported(client, db, run):
    _credited_twice(client, db)
    assert run("ledger", "adjust", str(BOB), "-60", "--payment", "pay_v", "--reason", "pay_v credited twice"
               ).exit_code == 0
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert "payment 'pay_v': credited 2 times and adjusted by -60 cents: 40 cents in all, not its 50" \
        in result.output


def test_an_adjustment_of_a_payment_does_not_hide_its_second_credit_to_another_user(client, db, run):
    send(client, payment("evt_v1", user=BOB, cents=50, paymentId="pay_v"))
    db.execute("INSERT INTO ledger_journal (source, event_id, kind, payment_id, user_id, amount_cents)"
               " VALUES ('default', 'evt_v2', 'credit', 'pay_v', %s, 50)", [ALICE])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + 50 WHERE user_id = %s", [ALICE])
    assert run("ledger", "adjust", str(BOB), "-50", "--payment", "pay_v", "--reason", "pay_v credited twice"
               ).exit_code == 0
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert f"payment 'pay_v': 1 journal rows debit or credit another user than {BOB}" in result.output


@pytest.mark.parametrize("corruption, expected", [
    ("UPDATE ledger_journal SET reason = NULL WHERE kind = 'adjustment'",
     "journal row {adjustment}: adjustment of -5 cents to user {ALICE} does not say what made it: an adjustment "
     "names its reason"),
    ("UPDATE ledger_journal SET source = 'default', payment_id = 'pay_x' WHERE kind = 'spend'",
     "journal row {spend}: spend of -7 cents to user {ALICE} does not say what made it: a spend names its "
     "reference, and no event"),
    ("UPDATE ledger_journal SET source = 'default', payment_id = 'pay_gone' WHERE kind = 'adjustment'",
     "journal row {adjustment} (adjustment): no payment 'pay_gone'"),
], ids=["adjustment-without-reason", "spend-of-a-payment", "adjustment-of-no-payment"])
def test_verify_names_an_adjustment_or_a_spend_it_cannot_account_for(db, run, corruption, expected):
    assert run("ledger", "adjust", str(ALICE), "-5", "--reason", REASON).exit_code == 0
    db.execute("SELECT spend(p_user => %s, p_cents => 7, p_reference => 'order-1')", [ALICE])
    ids = dict(db.execute("SELECT kind, id FROM ledger_journal").fetchall())
    db.execute("ALTER TABLE ledger_journal DROP CONSTRAINT ledger_journal_names_check")
    db.execute(corruption)
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert expected.format(ALICE=ALICE, **ids) in result.output, result.output
