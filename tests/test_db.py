"""app/db.py and schema.sql: the schema is safe to apply twice; init-db applies it."""

import psycopg
import pytest

from app.db import DEFAULT_SCHEMA_PATH, apply_schema

from .helpers import ALICE, OPENING


def test_schema_applies_twice_without_error(db):
    apply_schema(db)
    apply_schema(db)
    tables = {r[0] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
    assert tables == {"user_balances", "webhook_events", "ledger_credits"}
    assert db.execute("SELECT count(*) FROM user_balances").fetchone()[0] == 2  # data kept


def test_opening_balance_is_the_balance_at_insert(db):
    assert db.execute("SELECT opening_balance_cents FROM user_balances WHERE user_id = %s",
                      [ALICE]).fetchone()[0] == OPENING[ALICE]


def test_schema_has_no_psql_meta_commands():
    assert not any(line.lstrip().startswith("\\") for line in DEFAULT_SCHEMA_PATH.read_text().splitlines())


def test_event_id_is_unique_by_construction(db):
    insert = ("INSERT INTO webhook_events (event_id, event_type, payload, payload_sha256)"
              " VALUES ('e', 't', '{}', sha256(''))")
    db.execute(insert)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(insert)


@pytest.mark.parametrize("column, value", [("event_id", ""), ("event_id", "e" * 129),
                                           ("event_type", "t" * 65), ("status", "done")])
def test_schema_checks_lengths_and_statuses(db, column, value):
    row = {"event_id": "e", "event_type": "t", "status": "completed", column: value}
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256) "
                   "VALUES (%(event_id)s, %(event_type)s, %(status)s, '{}', sha256(''))", row)


def test_init_db_command_applies_the_schema(app, db):
    db.execute("DROP TABLE webhook_events")
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    assert "applied" in result.output
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 0
