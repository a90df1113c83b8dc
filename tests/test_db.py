"""app/db.py and schema.sql: the schema is safe to apply twice, upgrades a
database created before sources; init-db applies it."""

import hashlib
from pathlib import Path

import psycopg
import pytest

from app.db import DEFAULT_SCHEMA_PATH, apply_schema

from .helpers import ALICE, OPENING, deliver, encode, payment, sources_config

# The schema before sources (76d09bb), kept as it was released.
BEFORE_SOURCES = Path(__file__).parent / "data" / "schema_before_sources.sql"


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


INSERT_EVENT = ("INSERT INTO webhook_events (source, event_id, event_type, payload, payload_sha256)"
                " VALUES (%s, 'e', 't', '{}', sha256(''))")


def test_event_id_is_unique_by_construction(db):
    db.execute(INSERT_EVENT, ["default"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["default"])


def test_the_unique_constraint_is_on_source_and_event_id(db):
    db.execute(INSERT_EVENT, ["default"])
    db.execute(INSERT_EVENT, ["billing"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["billing"])
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(INSERT_EVENT, ["Billing"])


def _unique_keys(conn, table):
    """The column lists of table's unique indexes, other than its primary key."""
    return sorted(tuple(row[0]) for row in conn.execute("""
        SELECT array_agg(a.attname::text ORDER BY k.ord)
        FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = %s::regclass AND i.indisunique AND NOT i.indisprimary
        GROUP BY i.indexrelid""", [table]))


def _columns(conn):
    return sorted(conn.execute("""SELECT table_name, column_name, data_type, is_nullable, column_default
                                  FROM information_schema.columns WHERE table_schema = 'public'""").fetchall())


def test_schema_upgrades_a_database_created_before_sources_and_applies_twice(make_app, config, db):
    fresh = _columns(db)
    db.execute("DROP TABLE ledger_credits, webhook_events, user_balances")
    db.execute(BEFORE_SOURCES.read_text())
    body = encode(payment("evt_old", cents=5))
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1005), (%s, 0)", list(OPENING))
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256, completed_at)"
               " VALUES ('evt_old', 'payment.succeeded', 'completed', %s, %s, now())",
               [body.decode(), hashlib.sha256(body).digest()])
    db.execute("INSERT INTO ledger_credits (event_id, user_id, amount_cents) VALUES ('evt_old', %s, 5)", [ALICE])

    app = make_app(sources_config(config, {"billing": None}))
    for _ in range(2):  # the documented upgrade step, safe to run twice
        result = app.test_cli_runner().invoke(args=["init-db"])
        assert result.exit_code == 0, result.output

    assert db.execute("SELECT source, event_id, status FROM webhook_events").fetchall() == \
        [("default", "evt_old", "completed")]
    assert db.execute("SELECT source, event_id FROM ledger_credits").fetchall() == [("default", "evt_old")]
    for table in ("webhook_events", "ledger_credits"):
        assert _unique_keys(db, table) == [("source", "event_id")], table
        assert db.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s",
                          [table, f"{table}_event_id_key"]).fetchone()[0] == 0, table
        # Applied twice, the new column's CHECK is there once.
        assert db.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass"
                          " AND pg_get_constraintdef(oid) LIKE '%%source ~%%'", [table]).fetchone()[0] == 1, table
    assert _columns(db) == fresh

    # The app on the upgraded database: the old event is the default source's,
    # its id is free on a named source.
    client = app.test_client()
    assert deliver(client, payment("evt_old", cents=5)).json["status"] == "duplicate"
    assert deliver(client, payment("evt_old", cents=5), source="billing").json["status"] == "processed"
    assert db.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [ALICE]).fetchone()[0] == 1010


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
