"""app/db.py and schema.sql: the schema is safe to apply twice; init-db applies it."""

import psycopg
import pytest

from psycopg.types.json import Jsonb

from app import verify
from app.db import SCHEMA_PATH, apply_schema

from .conftest import ALICE, OPENING


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


# The schema of the first release: no payload hash, no opening balance, no journal.
FIRST_RELEASE = """
    CREATE TABLE user_balances (user_id UUID PRIMARY KEY, balance_cents BIGINT NOT NULL DEFAULT 0,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(), updated_at TIMESTAMPTZ NOT NULL DEFAULT now());
    CREATE TABLE webhook_events (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id TEXT NOT NULL UNIQUE, event_type TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'processing',
        payload JSONB NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, last_error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(), updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        completed_at TIMESTAMPTZ);
"""


def test_schema_upgrades_a_first_release_database(db):
    db.execute("DROP TABLE webhook_events, ledger_credits, user_balances")
    db.execute(FIRST_RELEASE)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1250)", [ALICE])
    payment = {"id": "evt_old", "type": "payment.succeeded", "data": {"userId": str(ALICE), "amountCents": 250}}
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, completed_at) "
               "VALUES ('evt_old', 'payment.succeeded', 'completed', %s, now())", [Jsonb(payment)])
    apply_schema(db)
    apply_schema(db)
    assert db.execute("SELECT opening_balance_cents FROM user_balances").fetchone()[0] == 1000
    assert db.execute("SELECT event_id, amount_cents FROM ledger_credits").fetchall() == [("evt_old", 250)]
    assert verify.check(db)[0] == []


def test_schema_has_no_psql_meta_commands():
    assert not any(line.lstrip().startswith("\\") for line in SCHEMA_PATH.read_text().splitlines())


def test_event_id_is_unique_by_construction(db):
    insert = "INSERT INTO webhook_events (event_id, event_type, payload) VALUES ('e', 't', '{}')"
    db.execute(insert)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(insert)


@pytest.mark.parametrize("column, value", [("event_id", ""), ("event_id", "e" * 129),
                                           ("event_type", "t" * 65), ("status", "done")])
def test_schema_checks_lengths_and_statuses(db, column, value):
    row = {"event_id": "e", "event_type": "t", "status": "completed", column: value}
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload) "
                   "VALUES (%(event_id)s, %(event_type)s, %(status)s, '{}')", row)


def test_init_db_command_applies_the_schema(app, db):
    db.execute("DROP TABLE webhook_events")
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    assert "applied" in result.output
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 0
