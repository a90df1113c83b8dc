"""What each event costs the one PostgreSQL writer (docs/performance.md): a new event's row is written once,
in its final state; a balance's update is HOT; the table keeps one copy of each event (its bytes), which the
view webhook_events_json reads as jsonb; and `events list` and `events purge` read the primary key, the
index they need. Real PostgreSQL, apply_event called as a delivery calls it."""

import hashlib
import json

import pytest

from app.commands.cli import LIST_EVENTS
from app.intake import events
from app.intake.events import DEFAULT_POLICY
from app.store import ledger, retention
from tests.helpers import balance, payment, payment_refunded

pytestmark = pytest.mark.core

TABLES = ("webhook_events", "payments", "ledger_journal", "user_balances", "movements")


def _apply(db, document):
    """apply_event in a transaction of db's; what it wrote there, per table: (inserted, updated, of which HOT)."""
    body = json.dumps(document).encode()
    event = events.parse(body)
    effect = events.effect_of(event, DEFAULT_POLICY)
    params = ledger.apply_event_params(event, effect, hashlib.sha256(body).digest(), DEFAULT_POLICY,
                                       ledger.Origin.DELIVERY)
    with db.transaction():
        before = _counts(db)  # what this session has not yet reported of earlier transactions, too
        outcome = db.execute(ledger.APPLY_EVENT, params).fetchone()[0]
        after = _counts(db)
    written = {name: tuple(a - b for a, b in zip(after[name], before[name], strict=True)) for name in TABLES}
    return outcome, {name: counts for name, counts in written.items() if any(counts)}


def _counts(db):
    return {name: (ins, upd, hot) for name, ins, upd, hot in db.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = ANY(%s)",
        [list(TABLES)])}


def _updated(written):
    """Of _apply's per-table counts, the tables it updated rows of."""
    return {name: counts for name, counts in written.items() if counts[1]}


def _inserted_only(written):
    """Of _apply's per-table counts, the tables it inserted rows into and updated none of."""
    return {name: counts for name, counts in written.items() if not counts[1]}


def _new_credit(db):
    return _apply(db, payment("evt_once", cents=300))


def _refund(db):
    """A payment of 300 cents, then the refund of 120 whose cost is returned."""
    _apply(db, payment("evt_paid", cents=300))
    return _apply(db, payment_refunded("pay_evt_paid", 120, event_id="evt_refunded"))


def test_a_new_credit_writes_each_row_once(db):
    outcome, written = _new_credit(db)
    assert outcome == "processed"
    assert _inserted_only(written) == {"webhook_events": (1, 0, 0), "payments": (1, 0, 0), "ledger_journal": (1, 0, 0)}
    assert db.execute("SELECT status, completed_at IS NOT NULL FROM webhook_events").fetchone() == ("completed", True)


def test_a_new_credits_balance_update_is_hot(db):
    _, written = _new_credit(db)
    assert _updated(written) == {"user_balances": (0, 1, 1)}
    assert balance(db) == 1300


def test_a_refunds_updates_of_its_payment_and_balance_are_hot(db):
    outcome, written = _refund(db)
    assert outcome == "processed"
    assert _updated(written) == {"payments": (0, 2, 2), "user_balances": (0, 1, 1)}
    assert balance(db) == 1180


def test_a_refund_inserts_its_event_and_journal_row_once(db):
    _, written = _refund(db)
    assert _inserted_only(written) == {"webhook_events": (1, 0, 0), "ledger_journal": (1, 0, 0)}


@pytest.mark.parametrize("document, outcome", [
    ({"id": "evt_other", "type": "customer.created", "data": {}}, "processed"),
    (payment("evt_bad", cents=0), "failed"),  # refused: a payment of nothing
], ids=["a-type-that-moves-no-money", "a-refused-one"])
def test_an_event_that_moves_no_money_is_one_insert(db, document, outcome):
    assert _apply(db, document) == (outcome, {"webhook_events": (1, 0, 0)})


def test_a_credit_that_fails_on_its_decision_is_recorded_failed_not_completed(db):
    """Inserted completed, then failed by what only the ledger knows (no such user): written twice, the rare path."""
    stranger = "00000000-0000-4000-8000-0000000000ff"
    outcome, written = _apply(db, payment("evt_stranger", user=stranger))
    assert outcome == "failed" and written == {"webhook_events": (1, 1, 0)}
    row = db.execute("SELECT status, completed_at, last_error FROM webhook_events").fetchone()
    assert row == ("failed", None, f"unknown user {stranger}")


def test_the_table_keeps_the_bytes_alone(db):
    _apply(db, payment("evt_json", cents=70))
    assert db.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'webhook_events'"
                      " AND data_type IN ('json', 'jsonb')").fetchall() == []


def test_the_view_reads_the_bytes_as_json(db):
    _apply(db, payment("evt_json", cents=70))
    assert db.execute("SELECT payload->'data'->>'amountCents' FROM webhook_events_json"
                      " WHERE event_id = 'evt_json'").fetchone()[0] == "70"


def _plan(db, query, params):
    return "\n".join(row[0] for row in db.execute(f"EXPLAIN {query}", params))


@pytest.fixture
def many_events(db):
    """20,000 stored events, one every 86.4 s over 20 days (off the day by half a step), analysed, so that
    the planner chooses as on a large table."""
    db.execute("""
        INSERT INTO webhook_events (source, event_id, event_type, body, payload_sha256, status, created_at)
        SELECT 'default', 'evt_' || n, 'payment.succeeded', '{}', sha256(n::text::bytea), 'completed',
               now() - make_interval(secs => (20000 - n) * 86.4 + 43.2)
        FROM generate_series(1, 20000) n""")
    db.execute("ANALYZE webhook_events")
    return db


def test_events_list_reads_the_newest_by_the_primary_key(many_events):
    params = {"sources": None, "statuses": None, "types": None, "since": None, "limit": 50}
    plan = _plan(many_events, LIST_EVENTS, params)
    assert "Index Scan Backward using webhook_events_pkey" in plan, plan
    rows = many_events.execute(LIST_EVENTS, params).fetchall()
    assert [r[1] for r in rows[:2]] == ["evt_20000", "evt_19999"] and len(rows) == 50


def test_purge_reads_oldest_first_by_the_primary_key(many_events):
    params = {"cutoff": None, "statuses": ["completed"], "source": None, "after": 0, "batch": 1000}
    plan = _plan(many_events, retention.NEXT_ROWS, params)
    assert "Index Scan using webhook_events_pkey" in plan, plan


def test_purge_stops_at_the_cutoff(many_events, app):
    result = app.test_cli_runner().invoke(args=["events", "purge", "--older-than", "10", "--force",
                                                "--batch-size", "1000"])
    # The progress lines go to stderr; what was done is stdout's one line.
    assert result.stdout.startswith("purged 10000 completed events received before "), result.output
    assert many_events.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 10000
    assert many_events.execute("SELECT count(*) FROM webhook_events WHERE created_at < now() - interval '10 days'"
                               ).fetchone()[0] == 0
