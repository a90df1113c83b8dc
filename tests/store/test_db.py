"""app/store/db.py, app/store/schema.py, schema.sql and migrations/: init-db creates the schema, refuses a database of
a build before 1.0.0, brings one of 1.0.0 to a later release's schema, is a no-op the second time and safe from two
hosts at once;
every transaction carries its timeouts (so they hold through PgBouncer), connections have
TCP keepalives, prepared statements can be switched off, and a connection that died in the pool is not handed
out."""

import gc
import hashlib
import json
import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, namedtuple_row

from app.receiver import release
from app.store import schema
from app.store.db import DEFAULT_SCHEMA_PATH, TCP_SETTINGS, apply_schema, get_pool, transaction
from app.store.deadline import MARGIN_MS
from app.store.schema import BASELINE, BEFORE_1_0, LOCK_KEY, MONEY, SchemaError, newer, other_currency
from devservers import ROOT, free_port, wait_until
from tests.helpers import (
    ALICE,
    BOB,
    OPENING,
    balance,
    before_012,
    db_url,
    event_rows,
    payment,
    send,
)
from tests.providers.stripe.events import refund

pytestmark = pytest.mark.core

CURRENCY = "001_ledger_currency.sql"  # the first migration after 1.0.0

TABLES = ("holds", "user_keys", "ledger_journal",
          "payments", "webhook_events", "user_balances", "schema_migrations", "ledger_currency",
          "reconcile_watermarks", "reconcile_runs", "customer_links", "ignored_payments", "payment_users")


# This release's migrations: a database schema.sql made records each as not run.
MIGRATIONS = sorted(path.name for path in (DEFAULT_SCHEMA_PATH.parent / "migrations").glob("*.sql"))
RELEASED = [(name, False) for name in MIGRATIONS]  # this release's: an empty database gets them from schema.sql


def _release(*more):
    """schema_migrations' (name, ran) rows of a database schema.sql made, and more, in name order."""
    return sorted([(BASELINE, False), (MONEY, True), *((name, False) for name in MIGRATIONS), *more])


def _recorded(conn):
    return conn.execute("SELECT name, ran FROM schema_migrations ORDER BY name").fetchall()


def test_schema_applies_twice_without_error(db):
    assert apply_schema(db) == (False, [])
    assert apply_schema(db) == (False, [])
    tables = {r[0] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
    assert tables == {"user_balances", "webhook_events", "payments", "movements", "ledger_journal",
                      "schema_migrations", "payment_accounts", "webhook_events_json",
                      "reconcile_runs", "reconcile_watermarks", "customer_links", "ignored_payments",
                      "ledger_currency", "payment_users", "ledger_journal_keyed", "audit_runs", "audit_breaks",
                      "holds", "user_available", "user_keys", "waiting_notifications"}
    assert db.execute("SELECT count(*) FROM user_balances").fetchone()[0] == 2  # data kept
    # an empty database got schema.sql: release 1.0.0 and this release's migrations, none run; and the money
    # rule, each time
    assert _recorded(db) == _release()


def test_opening_balance_is_the_balance_at_insert(db):
    assert db.execute("SELECT opening_balance_cents FROM user_balances WHERE user_id = %s",
                      [ALICE]).fetchone()[0] == OPENING[ALICE]


@pytest.mark.unit
def test_schema_has_no_psql_meta_commands():
    assert not any(line.lstrip().startswith("\\") for line in DEFAULT_SCHEMA_PATH.read_text().splitlines())


INSERT_EVENT = ("INSERT INTO webhook_events (source, event_id, event_type, status, body, payload_sha256)"
                " VALUES (%s, 'e', 't', 'completed', '{}', sha256('{}'))")


def test_event_id_is_unique_by_construction(db):
    db.execute(INSERT_EVENT, ["default"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["default"])


def test_the_unique_constraint_is_on_source_and_event_id(db):
    db.execute(INSERT_EVENT, ["default"])
    db.execute(INSERT_EVENT, ["billing"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["billing"])


def test_a_source_named_in_capitals_is_refused(db):
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


# What a schema is made of, to compare a database made by schema.sql with one that migrations upgraded.
CATALOG = {
    "columns": """SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity
                  FROM information_schema.columns WHERE table_schema = 'public'""",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                      WHERE connamespace = 'public'::regnamespace""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
}


def _catalog(conn):
    return {part: sorted(conn.execute(query).fetchall()) for part, query in CATALOG.items()}


def _differences(conn, fresh):
    """What conn's schema has that fresh (a _catalog) has not, and the other way round."""
    now = _catalog(conn)
    return [f"{which} {part}: {item}" for part in CATALOG
            for which, items in (("only upgraded", set(now[part]) - set(fresh[part])),
                                 ("only fresh", set(fresh[part]) - set(now[part])))
            for item in sorted(items, key=str)]


def _drop_schema(db):
    """Empty db of what init-db made: the views, the tables and the functions (every overload)."""
    db.execute("DROP TYPE ledger_delivery CASCADE")  # first: the rule's steps that take it, and a table's type
    db.execute("DROP FUNCTION lock_hold")  # it returns a holds row
    db.execute("DROP VIEW payment_accounts, webhook_events_json, ledger_journal_keyed, user_available")
    db.execute(f"DROP TABLE movements, {', '.join(TABLES)}")
    for (function,) in db.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE proname IN"
                                  " ('apply_event', 'adjust', 'spend', 'event_json')"
                                  " AND pronamespace = 'public'::regnamespace").fetchall():
        db.execute(f"DROP FUNCTION {function}")



@pytest.mark.parametrize("column, value", [("event_id", ""), ("event_id", "e" * 256),
                                           ("event_type", "t" * 65), ("status", "done"),
                                           ("status", "processing")])
def test_schema_checks_lengths_and_statuses(db, column, value):
    row = {"event_id": "e", "event_type": "t", "status": "completed", column: value}
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO webhook_events (event_id, event_type, status, body, payload_sha256) "
                   "VALUES (%(event_id)s, %(event_type)s, %(status)s, '{}', sha256('{}'))", row)


INSERT_JOURNAL = ("INSERT INTO ledger_journal (kind, amount_cents, source, event_id, payment_id, movement_id,"
                  " reference, reason, actor, user_id) VALUES (%(kind)s, %(amount_cents)s, %(source)s, %(event_id)s,"
                  " %(payment_id)s, %(movement_id)s, %(reference)s, %(reason)s, %(actor)s, %(user_id)s)")
ADJUSTMENT = {"kind": "adjustment", "amount_cents": -5, "source": None, "event_id": None, "payment_id": None,
              "movement_id": None, "reference": None, "reason": "why", "actor": "who", "user_id": ALICE}
SPEND = {**ADJUSTMENT, "kind": "spend", "reason": None, "actor": None, "reference": "order-1"}


@pytest.mark.parametrize("row", [
    {**ADJUSTMENT, "amount_cents": 0},
    {**ADJUSTMENT, "reason": None},
    {**ADJUSTMENT, "reason": " \n"},
    {**ADJUSTMENT, "actor": None},
    {**ADJUSTMENT, "event_id": "evt_1", "source": "default"},
    {**ADJUSTMENT, "payment_id": "pay_1"},  # a payment is named with its source
    {**ADJUSTMENT, "reference": "order-1"},
    {**SPEND, "amount_cents": 5},
    {**SPEND, "reference": None},
    {**SPEND, "reference": "r" * 129},
    {**SPEND, "source": "default", "payment_id": "pay_1"},
    {**SPEND, "reason": "why"},
    {**ADJUSTMENT, "kind": "credit", "amount_cents": 5},  # an event's row names its event and payment
], ids=["adjustment-of-0", "adjustment-without-reason", "adjustment-with-a-blank-reason", "adjustment-by-nobody",
        "adjustment-of-an-event", "adjustment-of-a-payment-without-source", "adjustment-with-a-reference",
        "spend-that-credits", "spend-without-reference", "spend-with-a-long-reference", "spend-of-a-payment",
        "spend-with-a-reason", "credit-of-no-event"])
def test_the_journal_refuses_a_row_that_does_not_say_what_made_it(db, row):
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(INSERT_JOURNAL, row)


def test_a_spends_reference_is_unique_by_construction(db):
    db.execute(INSERT_JOURNAL, SPEND)
    db.execute(INSERT_JOURNAL, {**ADJUSTMENT, "amount_cents": 5})  # adjustments have no reference
    db.execute(INSERT_JOURNAL, {**ADJUSTMENT, "amount_cents": 5})
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_JOURNAL, {**SPEND, "user_id": BOB})



def _init_db_in_an_empty_database(app, db):
    """init-db once in db emptied of every object; the fresh schema's catalog and what init-db answered."""
    fresh = _catalog(db)
    _drop_schema(db)
    return fresh, app.test_cli_runner().invoke(args=["init-db"])


def _migrations_recorded(db):
    return db.cursor(row_factory=namedtuple_row).execute(
        "SELECT name, sha256, ran, applied_at FROM schema_migrations ORDER BY name").fetchall()


def test_init_db_creates_the_schema_in_an_empty_database(app, db):
    fresh, first = _init_db_in_an_empty_database(app, db)
    assert first.exit_code == 0, first.output
    assert first.output == f"created the schema from {DEFAULT_SCHEMA_PATH}\n"
    assert _differences(db, fresh) == []
    recorded = _migrations_recorded(db)
    assert [(row.name, row.ran) for row in recorded] == _release()
    recorded = [row for row in recorded if row.name in (BASELINE, MONEY)]
    assert bytes(recorded[0].sha256) == hashlib.sha256(DEFAULT_SCHEMA_PATH.read_bytes()).digest()
    assert bytes(recorded[1].sha256) == hashlib.sha256((DEFAULT_SCHEMA_PATH.parent / MONEY).read_bytes()).digest()


def test_init_db_a_second_time_changes_nothing(app, db):
    fresh, _ = _init_db_in_an_empty_database(app, db)
    recorded = _migrations_recorded(db)
    second = app.test_cli_runner().invoke(args=["init-db"])
    assert (second.exit_code, second.output) == (0, "schema up to date: no migration to apply\n")
    assert _migrations_recorded(db) == recorded
    assert _differences(db, fresh) == []


# A database a build before 1.0.0 made: recorded by its schema_migrations (001_sources.sql ... 010_fetched.sql,
# no 1.0.0), or, older still, with tables and no schema_migrations at all.
def _recorded_by_a_build_before_1_0(db):
    db.execute("DELETE FROM schema_migrations")
    db.execute("INSERT INTO schema_migrations (name, sha256, ran) VALUES ('001_sources.sql', sha256(''), false),"
               " ('010_fetched.sql', sha256(''), true)")


def _made_before_schema_migrations(db):
    db.execute("DROP TABLE schema_migrations")


@pytest.mark.parametrize("made", [_recorded_by_a_build_before_1_0, _made_before_schema_migrations])
def test_init_db_on_a_database_of_a_build_before_1_0_stops_with_one_line_and_changes_nothing(app, db, made):
    send(app.test_client(), payment("evt_kept", cents=5))  # before: on that database, deliveries answer 503
    made(db)
    before = _catalog(db), event_rows(db), balance(db)
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 1
    assert result.output == f"Error: {BEFORE_1_0}\n"
    assert (_catalog(db), event_rows(db), balance(db)) == before


# A release after 1.0.0, as its files would be: a migration that adds a column, and the same column in schema.sql.
NOTE_MIGRATION = "ALTER TABLE payments ADD COLUMN note TEXT CHECK (char_length(note) <= 200);\n"


def _a_later_release(tmp_path, *migrations):
    """schema.sql, money.sql and migrations/ of a later release in tmp_path: this release's migrations and
    migrations (name, text), and 901's column in its schema.sql. The path of its schema.sql."""
    tmp_path.mkdir(exist_ok=True)
    schema = DEFAULT_SCHEMA_PATH.read_text()
    column = "    customer_id    TEXT,\n"
    assert column in schema
    (tmp_path / "schema.sql").write_text(
        schema.replace(column, column + "    note           TEXT CHECK (char_length(note) <= 200),\n"))
    shutil.copy(DEFAULT_SCHEMA_PATH.parent / "money.sql", tmp_path / "money.sql")
    shutil.copytree(DEFAULT_SCHEMA_PATH.parent / "migrations", tmp_path / "migrations")  # this release's
    for name, text in migrations:
        (tmp_path / "migrations" / name).write_text(text)
    return tmp_path / "schema.sql"


def test_a_1_0_database_migrated_to_a_later_release_has_that_releases_fresh_schema(db, tmp_path):
    later = _a_later_release(tmp_path, ("901_note.sql", NOTE_MIGRATION))
    _drop_schema(db)
    assert apply_schema(db, later) == (True, [])  # a fresh database of the later release
    fresh = _catalog(db)
    assert _recorded(db) == _release(("901_note.sql", False))
    _drop_schema(db)
    assert apply_schema(db) == (True, [])  # 1.0.0's
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 7)", [ALICE])
    assert apply_schema(db, later) == (False, ["901_note.sql"])
    assert _differences(db, fresh) == []
    assert _recorded(db) == _release(("901_note.sql", True))
    assert balance(db) == 7  # rows kept
    assert apply_schema(db, later) == (False, [])


def test_two_init_dbs_at_once_apply_each_migration_once(db, tmp_path):
    """As two hosts deploying together: both wait for the advisory lock, one migrates, the other finds it done."""
    later = _a_later_release(tmp_path, ("901_note.sql", NOTE_MIGRATION))
    results, errors = [], []

    def init_db():
        try:
            with psycopg.connect(db_url(db), autocommit=True) as conn:
                results.append(apply_schema(conn, later))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with psycopg.connect(db_url(db)) as holder:  # holds init-db's lock until both wait for it
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        threads = [threading.Thread(target=init_db) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                      " AND NOT granted").fetchone()[0] == 2, timeout=10, what="two waiting init-dbs")
        holder.rollback()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert sorted(results) == [(False, []), (False, ["901_note.sql"])]
    assert _recorded(db) == _release(("901_note.sql", True))


def _with_a_changed_migration(db, tmp_path):
    """db migrated by a later release's 001, then the files of one whose 001 was edited after its release and
    with a 002 after it."""
    apply_schema(db, _a_later_release(tmp_path / "then", ("901_note.sql", NOTE_MIGRATION)))
    return _a_later_release(tmp_path / "now", ("901_note.sql", NOTE_MIGRATION + "-- edited after its release\n"),
                            ("902_later.sql", "CREATE TABLE later (id int);\n"))


def test_a_migration_changed_since_it_was_applied_stops_init_db(db, tmp_path):
    with pytest.raises(SchemaError, match="migrations changed since they were applied: 901_note.sql"):
        apply_schema(db, _with_a_changed_migration(db, tmp_path))


def test_init_db_stopped_by_a_changed_migration_changes_nothing(db, tmp_path):
    schema = _with_a_changed_migration(db, tmp_path)
    with pytest.raises(SchemaError):
        apply_schema(db, schema)
    assert db.execute("SELECT to_regclass('later')").fetchone()[0] is None
    assert _recorded(db) == _release(("901_note.sql", True))


def test_a_migration_postgresql_refuses_stops_init_db_in_one_line_naming_it_and_changes_nothing(make_app, config, db,
                                                                                                 tmp_path):
    later = _a_later_release(tmp_path, ("901_note.sql", NOTE_MIGRATION),
                             ("902_broken.sql", "DROP TYPE no_such_type CASCADE;\n"))
    before = _catalog(db)
    result = make_app({**config, "SCHEMA_PATH": str(later)}).test_cli_runner().invoke(args=["init-db"])
    assert (result.exit_code, type(result.exception)) == (1, SystemExit)  # a ClickException's exit, not a traceback
    assert result.output == ('Error: 902_broken.sql failed, nothing was changed: 42704: type "no_such_type" does not'
                             ' exist\n')
    assert _catalog(db) == before and _recorded(db) == _release()


def test_a_database_that_ran_005s_text_before_if_exists_is_at_this_release(app, db):
    """005's text before `DROP TYPE IF EXISTS` (unreleased; schema.SUPERSEDED) did the same wherever it ran."""
    previous, = schema.SUPERSEDED["005_connect_accounts.sql"]
    db.execute("UPDATE schema_migrations SET sha256 = %s WHERE name = '005_connect_accounts.sql'", [previous])
    assert apply_schema(db) == (False, [])
    assert schema.why_not_at_release(db, DEFAULT_SCHEMA_PATH) is None
    db.execute("UPDATE schema_migrations SET sha256 = sha256('another') WHERE name = '005_connect_accounts.sql'")
    with pytest.raises(SchemaError, match="migrations changed since they were applied: 005_connect_accounts.sql"):
        apply_schema(db)


def test_a_database_newer_than_the_release_stops_init_db(app, db):
    db.execute("INSERT INTO schema_migrations (name, sha256, ran) VALUES ('999_later.sql', sha256(''), true)")
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 1
    assert result.output == f"Error: {newer(['999_later.sql'])}\n"


# -- the ledger's currency, recorded by the first init-db ---------------------------------------------------------

def _currency(db):
    return db.execute("SELECT currency FROM ledger_currency").fetchone()[0]


# 007's CHECKs as 006 left them: ids and keys of 1 to 128 characters, reconciled accounts acct_ and 1 to 123 more.
AT_006 = {
    "webhook_events": {"webhook_events_event_id_check": "char_length(event_id) BETWEEN 1 AND 128"},
    "payments": {"payments_payment_id_check": "char_length(payment_id) BETWEEN 1 AND 128"},
    "movements": {"movements_movement_id_check": "char_length(movement_id) BETWEEN 1 AND 128"},
    "ledger_journal": {"ledger_journal_event_id_check": "char_length(event_id) BETWEEN 1 AND 128",
                       "ledger_journal_payment_id_check": "char_length(payment_id) BETWEEN 1 AND 128"},
    "customer_links": {"customer_links_customer_id_check": "char_length(customer_id) BETWEEN 1 AND 128"},
    "payment_users": {"payment_users_payment_id_check": "char_length(payment_id) BETWEEN 1 AND 128"},
    "reconcile_runs": {"reconcile_runs_account_check": "account = '' OR account ~ '^acct_[A-Za-z0-9]{1,123}$'"},
    "reconcile_watermarks": {
        "reconcile_watermarks_account_check": "account = '' OR account ~ '^acct_[A-Za-z0-9]{1,123}$'"},
}


def _before_009(db):
    """db as the migrations before 009 left it: no holds (nor the view and function that read them), no user keys, a
    spend's reference unique across the journal, effect version 8, and 009 not recorded (the journal's CHECKs that
    allow a give-back are 012's)."""
    db.execute("DROP VIEW user_available")
    db.execute("DROP FUNCTION lock_hold")
    db.execute("DROP TABLE holds, user_keys")
    db.execute("DROP INDEX ledger_journal_reference_key")
    db.execute("CREATE UNIQUE INDEX ledger_journal_reference_key ON ledger_journal (reference)"
               " WHERE reference IS NOT NULL")
    db.execute("ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 8")
    db.execute("DELETE FROM schema_migrations WHERE name = '009_application_side.sql'")


def test_a_database_before_009_migrated_keeps_its_spends_and_takes_holds_and_give_backs(app, db):
    """The tables come out as schema.sql makes them, a spend made before is still one, and a hold and a give-back of
    it apply."""
    fresh = _catalog(db)
    db.execute("SELECT spend(p_user => %s, p_cents => 100, p_reference => 'order-1')", [ALICE])
    _before_009(db)
    journal = db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()

    assert apply_schema(db) == (False, ["009_application_side.sql"])

    assert _differences(db, fresh) == []
    assert db.execute("SELECT conname FROM pg_constraint WHERE NOT convalidated").fetchall() == []
    assert db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall() == journal
    assert db.execute("SELECT outcome FROM give_back(p_reference => 'order-1')").fetchone() == ("given_back",)
    assert db.execute("SELECT outcome FROM place_hold(p_user => %s, p_cents => 5, p_reference => 'job-1',"
                      " p_expires_at => now() + interval '1 hour')", [ALICE]).fetchone() == ("held",)
    assert balance(db) == OPENING[ALICE]
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output


def _as_006_made_it(db):
    """db as migration 006 left it: 007's CHECKs at 128 characters, effect version 7, and 007 not recorded."""
    _before_009(db)
    for table, checks in AT_006.items():
        db.execute(f"ALTER TABLE {table} " + ", ".join(f"DROP CONSTRAINT {name}, ADD CONSTRAINT {name} CHECK ({check})"
                                                      for name, check in checks.items()))
    db.execute("ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 7")
    db.execute("DELETE FROM schema_migrations WHERE name = '007_longer_ids.sql'")


def _as_1_0_made_it(db):
    """db as release 1.0.0 made it: neither migration since (no ledger_currency, no journal xid) nor their records."""
    before_012(db)
    _as_006_made_it(db)
    db.execute("DROP TABLE ledger_currency")
    db.execute("DROP TRIGGER ledger_journal_notify ON ledger_journal")
    db.execute("DROP FUNCTION ledger_journal_notify()")
    db.execute("ALTER TABLE ledger_journal DROP COLUMN xid")  # its index with it
    db.execute("ALTER TABLE webhook_events ALTER COLUMN effect_version SET DEFAULT 5")
    db.execute("DROP INDEX reconcile_runs_source_idx")  # 006: reconcile's runs and watermarks of one account
    db.execute("ALTER TABLE reconcile_watermarks DROP CONSTRAINT reconcile_watermarks_pkey, DROP COLUMN account,"
               " ADD PRIMARY KEY (source)")
    db.execute("ALTER TABLE reconcile_runs DROP COLUMN account")
    db.execute("CREATE INDEX reconcile_runs_source_idx ON reconcile_runs (source, status, finished_at)")
    db.execute("DROP TABLE audit_breaks, audit_runs")  # 010: flask audit's runs and breaks
    db.execute("DELETE FROM schema_migrations WHERE name ~ '^[0-9]{3}_'")


def test_a_006_database_migrated_to_007_keeps_its_rows_and_takes_ids_of_255_characters(app, db):
    """The constraints come out as schema.sql makes them (007 adds the big tables' NOT VALID, init-db validates them
    after its commit), the ledger verifies, and ids of 128 to 255 characters refused before are taken."""
    fresh = _catalog(db)
    client, runner = app.test_client(), app.test_cli_runner()
    assert send(client, payment("evt_before", cents=300, paymentId="pay_before")).json["status"] == "processed"
    relayed = json.loads(str(refund("re_before", "pay_before", 50)))  # a Stripe refund, relayed: a movement
    assert send(client, relayed).json["status"] == "processed"
    assert runner.invoke(args=["users", "link", "default", "cus_before", str(BOB), "--by", "ops"]).exit_code == 0
    rows = {table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in (
        "webhook_events", "payments", "movements", "ledger_journal", "customer_links", "user_balances")}
    _as_006_made_it(db)
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO customer_links (source, customer_id, user_id, linked_by) VALUES ('default', %s, %s,"
                   " 'ops')", ["c" * 129, ALICE])

    assert apply_schema(db) == (False, ["007_longer_ids.sql", "009_application_side.sql"])

    assert _differences(db, fresh) == []
    assert db.execute("SELECT conname FROM pg_constraint WHERE NOT convalidated").fetchall() == []
    assert {table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in rows} == rows
    assert send(client, payment("e" * 255, cents=5, paymentId="p" * 255)).json["status"] == "processed"
    assert send(client, payment("e" * 256, cents=5)).status == 400
    assert balance(db) == OPENING[ALICE] + 300 - 50 + 5
    verified = runner.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output


def test_ledger_verify_on_a_database_not_yet_upgraded_says_to_run_init_db_in_one_line(app, db):
    """Issue 44: it said `ledger INCONSISTENT` for what init-db changes; it refuses as other commands do (exit 1)."""
    client, runner = app.test_client(), app.test_cli_runner()
    assert send(client, payment("evt_before", cents=300)).json["status"] == "processed"
    _as_1_0_made_it(db)
    verified = runner.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 1
    assert verified.output.count("\n") == 1 and "INCONSISTENT" not in verified.output
    assert verified.output.startswith("Error: the ledger cannot be checked: migrations of this release not applied: ")
    assert verified.output.endswith(": run `flask init-db`\n")
    assert runner.invoke(args=["init-db"]).exit_code == 0
    verified = runner.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0 and "ledger consistent" in verified.output, verified.output


def test_a_constraint_left_not_valid_is_validated_by_the_next_init_db(app, db):
    """As when init-db stopped between its commit and the validation (the constraint enforced on new rows only)."""
    db.execute("ALTER TABLE payments DROP CONSTRAINT payments_payment_id_check,"
               " ADD CONSTRAINT payments_payment_id_check CHECK (char_length(payment_id) BETWEEN 1 AND 511) NOT VALID")
    assert apply_schema(db) == (False, [])
    assert db.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'payments_payment_id_check'"
                      ).fetchone() == (True,)


def test_a_database_before_012_migrated_has_the_fresh_schema_and_its_journal_rows_as_they_were(app, db):
    fresh = _catalog(db)
    send(app.test_client(), payment("evt_before_012", cents=300))
    rows = db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall()
    before_012(db)
    assert apply_schema(db) == (False, ["012_journal_payment_moves.sql"])
    assert _differences(db, fresh) == []
    assert db.execute("SELECT conname FROM pg_constraint WHERE NOT convalidated").fetchall() == []
    assert db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall() == rows  # no payment moved: none added


def test_init_db_records_the_ledger_currency(app, db):
    fresh, first = _init_db_in_an_empty_database(app, db)
    assert first.exit_code == 0, first.output
    assert _currency(db) == "usd"


def test_init_db_under_another_currency_stops_with_one_line_and_changes_nothing(make_app, config, db):
    send(make_app(config).test_client(), payment("evt_usd", cents=5))
    before = _catalog(db), _migrations_recorded(db), balance(db)
    result = make_app({**config, "LEDGER_CURRENCY": "EUR"}).test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 1
    assert result.output == f"Error: {other_currency('eur', 'usd')}\n"
    assert (_catalog(db), _migrations_recorded(db), balance(db), _currency(db)) == (*before, "usd")


def test_a_1_0_database_records_its_currency_when_migrated(db):
    fresh = _catalog(db)
    _as_1_0_made_it(db)
    db.execute("INSERT INTO ledger_journal (kind, user_id, amount_cents, reason, actor)"
               " VALUES ('adjustment', %s, 5, 'kept', 'test')", [ALICE])
    assert apply_schema(db, currency="inr") == (False, [name for name, _ in RELEASED])
    assert _differences(db, fresh) == []
    assert _currency(db) == "inr"
    assert db.execute("SELECT xid::text FROM ledger_journal WHERE reason = 'kept'").fetchone() == ("1",)


def test_a_1_0_database_whose_payments_are_in_another_currency_is_not_migrated(app, db):
    send(app.test_client(), payment("evt_usd", cents=5))
    _as_1_0_made_it(db)
    with pytest.raises(SchemaError, match="LEDGER_CURRENCY is eur, but this ledger is in usd"):
        apply_schema(db, currency="eur")
    assert db.execute("SELECT to_regclass('ledger_currency')").fetchone()[0] is None  # nothing changed
    assert apply_schema(db, currency="usd") == (False, [name for name, _ in RELEASED])


def test_set_currency_moves_a_ledger_where_nothing_moved(app, db):
    result = app.test_cli_runner().invoke(args=["ledger", "set-currency", "EUR"])
    assert (result.exit_code, result.output) == (
        0, "the ledger's currency is eur (it was usd): start the service with LEDGER_CURRENCY=eur\n")
    assert _currency(db) == "eur"


@pytest.mark.parametrize("currency", ["EUR", "usd"])
def test_set_currency_refuses_a_ledger_where_money_moved(app, db, currency):
    send(app.test_client(), payment("evt_moved", cents=5))
    result = app.test_cli_runner().invoke(args=["ledger", "set-currency", currency])
    if currency == "usd":  # the same currency: nothing to change
        assert result.exit_code == 0, result.output
    else:
        assert (result.exit_code, result.output) == (
            1, "Error: money has moved in this ledger (in usd): its currency cannot change; nothing was changed\n")
    assert _currency(db) == "usd"


def test_set_currency_refuses_what_is_not_a_currency(app, db):
    result = app.test_cli_runner().invoke(args=["ledger", "set-currency", "euro"])
    assert result.exit_code == 2
    assert "CURRENCY must be a three-letter ISO 4217 currency code" in result.output
    assert _currency(db) == "usd"


@pytest.mark.parametrize("command", [["events", "replay", "--all-failed"], ["reconcile", "default"]])
def test_a_command_that_applies_events_refuses_another_currency(make_app, config, db, command):
    settings = {"LEDGER_CURRENCY": "eur", "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": "rk_test_x"}
    result = make_app({**config, **settings}).test_cli_runner().invoke(args=command)
    assert (result.exit_code, result.output) == (78, f"Error: configuration error: {other_currency('eur', 'usd')}\n")


def test_gunicorn_does_not_start_under_another_currency_than_the_ledgers(db, redis_server, tmp_path):
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url,
           "WEBHOOK_SECRET": "whsec-currency-test", "LEDGER_CURRENCY": "eur", "PORT": str(free_port()),
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "wsgi:app"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert done.returncode == os.EX_CONFIG, done.stdout
    named = [line for line in done.stdout.splitlines() if "configuration error" in line]
    assert len(named) == 1 and other_currency("eur", "usd") in named[0].replace('\\"', '"'), done.stdout
    assert "Booting worker" not in done.stdout


def test_another_currency_is_not_ready_and_deliveries_wait(make_app, config, db, caplog):
    client = make_app({**config, "LEDGER_CURRENCY": "eur"}).test_client()
    status, answer, headers = send(client, payment("evt_eur", cents=5, currency="eur"))
    assert (status, answer["error"], int(headers["Retry-After"])) == (503, "unavailable", 1)
    assert "LEDGER_CURRENCY" not in answer["message"]  # the sender is not told our settings
    assert event_rows(db) == 0
    ready = client.get("/ready")
    assert (ready.status_code, ready.json["postgres"]) == (503, "another_currency")
    assert ready.json["postgres_reason"] == other_currency("eur", "usd")
    assert any(other_currency("eur", "usd") in r.getMessage() for r in caplog.records if r.name == release.__name__)


# -- a database not at this release: /ready and deliveries say so, until init-db ------------------------------

def _without_the_money_rule(db):
    """db as `psql -f schema.sql` leaves it beside the records of 1.0.0: the tables, and no money.sql applied."""
    db.execute("DROP TYPE ledger_delivery CASCADE")  # apply_event and its steps, which take it
    db.execute("DROP VIEW payment_accounts")
    db.execute("DELETE FROM schema_migrations WHERE name = 'money.sql'")


def test_a_database_without_the_money_rule_is_not_ready_until_init_db(app, db, monkeypatch, caplog):
    monkeypatch.setattr(release, "RECHECK_SECONDS", 0.2)
    _without_the_money_rule(db)
    client = app.test_client()
    status, answer, headers = send(client, payment("evt_not_ready", cents=5))  # the process's first: it asks
    assert (status, answer["error"], int(headers["Retry-After"])) == (503, "unavailable", 1)
    assert event_rows(db) == 0
    ready = client.get("/ready")
    assert (ready.status_code, ready.json["status"]) == (503, "unavailable")
    assert "flask init-db" in ready.json["postgres_reason"]
    assert client.get("/health").status_code == 200  # touches no dependency

    assert app.test_cli_runner().invoke(args=["init-db"]).exit_code == 0
    time.sleep(0.3)  # the process's remembered answer expires
    assert send(client, payment("evt_not_ready", cents=5)).json["status"] == "processed"
    assert client.get("/ready").json == {"status": "ok", "postgres": "ok", "redis": "ok"}
    assert balance(db) == OPENING[ALICE] + 5
    found = [r.getMessage() for r in caplog.records if r.name == release.__name__ and r.levelno == logging.WARNING]
    assert len(found) == 2, found  # once when found not at this release, once when it is again: not per request
    assert "flask init-db" in found[0]


def test_a_database_newer_than_the_release_is_not_ready(app, db):
    db.execute("INSERT INTO schema_migrations (name, sha256, ran) VALUES ('999_later.sql', sha256(''), true)")
    client = app.test_client()
    ready = client.get("/ready")
    assert ready.status_code == 503
    assert ready.json["postgres_reason"].startswith("the database is newer than this release: ")
    assert "999_later.sql" in ready.json["postgres_reason"]
    assert send(client, payment("evt_newer")).status == 503
    assert event_rows(db) == 0


def test_new_migrations_run_once_in_order(db, tmp_path):
    schema = _a_later_release(tmp_path, ("901_note.sql", NOTE_MIGRATION),
                              ("902_first.sql", "CREATE TABLE later (id int);\n"),
                              ("903_second.sql", "INSERT INTO later VALUES (1);\n"))
    assert apply_schema(db, schema) == (False, ["901_note.sql", "902_first.sql", "903_second.sql"])
    assert apply_schema(db, schema) == (False, [])
    assert db.execute("SELECT * FROM later").fetchall() == [(1,)]


# -- settings that hold through a transaction pooler (PgBouncer) --------------

def _settings(conn):
    """The session's three timeouts, by name."""
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT current_setting('lock_timeout') AS lock_timeout,"
        " current_setting('statement_timeout') AS statement_timeout,"
        " current_setting('idle_in_transaction_session_timeout') AS idle").fetchone()


def test_timeouts_hold_inside_each_transaction(app):
    pool = get_pool(app)
    with transaction(pool) as conn:
        # From PG_LOCK_TIMEOUT_MS, PG_STATEMENT_TIMEOUT_MS and LOCK_TTL_MS.
        assert _settings(conn) == {"lock_timeout": "1s", "statement_timeout": "2s", "idle": "10s"}
        assert conn.info.transaction_status == TransactionStatus.INTRANS
    with transaction(pool, read_only=True, statement_timeout=0) as conn:
        assert _settings(conn) == {"lock_timeout": "1s", "statement_timeout": "0", "idle": "10s"}
        assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
        assert conn.execute("SHOW transaction_read_only").fetchone()[0] == "on"


def test_timeouts_end_with_their_transaction(app):
    pool = get_pool(app)
    with transaction(pool):
        pass
    with pool.connection() as conn:  # the same session afterwards: nothing left behind for the next client
        assert _settings(conn) == {"lock_timeout": "0", "statement_timeout": "0", "idle": "0"}


def test_the_ledger_transaction_runs_with_the_timeouts(make_app, config, db):
    """Seen from inside the app's own transaction, by a trigger on its INSERT."""
    db.execute("""
        CREATE TABLE seen (lock_timeout text, statement_timeout text, idle text);
        CREATE FUNCTION note_settings() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO seen VALUES (current_setting('lock_timeout'), current_setting('statement_timeout'),
                                     current_setting('idle_in_transaction_session_timeout'));
            RETURN NEW; END $$;
        CREATE TRIGGER note_settings AFTER INSERT ON webhook_events FOR EACH ROW EXECUTE FUNCTION note_settings();
    """)
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 1234, "PG_STATEMENT_TIMEOUT_MS": 2345,
                       "LOCK_TTL_MS": 6789}).test_client()
    assert send(client, payment("evt_settings")).json["status"] == "processed"
    assert db.cursor(row_factory=dict_row).execute("SELECT * FROM seen").fetchall() == [
        {"lock_timeout": "1234ms", "statement_timeout": "2345ms", "idle": "6789ms"}]


def test_a_session_never_gets_the_timeouts_as_a_startup_option(app):
    """PgBouncer refuses the `options` startup parameter; the app sends none."""
    pool = get_pool(app)
    with pool.connection() as conn:
        assert "options" not in conn.info.get_parameters()
        assert conn.execute("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'").fetchone()[0] == "0"


def _prepared_statements_after_deliveries(make_app, config, threshold):
    app = make_app({**config, "PG_POOL_SIZE": 1, "PG_PREPARE_THRESHOLD": threshold})
    client = app.test_client()
    pool = get_pool(app)
    for n in range(8):  # past psycopg's default threshold (5)
        assert send(client, payment(f"evt_prepare_{threshold}_{n}")).json["status"] == "processed"
        with transaction(pool) as conn:  # a parameterised statement, as the CLI's and replay's are
            conn.execute("SELECT count(*) FROM webhook_events WHERE source = %s", ["default"])
    with pool.connection() as conn:  # the pool's one connection, which ran them
        return conn.execute("SELECT name FROM pg_prepared_statements").fetchall()


def test_prepare_threshold_off_prepares_nothing(make_app, config, db):
    assert _prepared_statements_after_deliveries(make_app, config, "off") == []
    # The default prepares the repeated parameterised statement, never a delivery's (one simple query).
    assert len(_prepared_statements_after_deliveries(make_app, config, "5")) == 1


def test_every_connection_has_tcp_keepalives_and_a_user_timeout(app):
    with get_pool(app).connection() as conn:
        params = conn.info.get_parameters()
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))  # what libpq set on the socket itself
        try:
            applied = (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        finally:
            sock.close()  # the duplicate descriptor only
    assert {name: params[name] for name in TCP_SETTINGS} == {name: str(v) for name, v in TCP_SETTINGS.items()}
    assert applied == (1, 5, 2, 3, 11000)


def test_database_url_parameters_override_the_tcp_defaults(make_app, config):
    app = make_app({**config, "DATABASE_URL": config["DATABASE_URL"] + "?keepalives_idle=30&tcp_user_timeout=60000"})
    with get_pool(app).connection() as conn:
        params = conn.info.get_parameters()
    assert (params["keepalives_idle"], params["tcp_user_timeout"], params["keepalives_count"]) == ("30", "60000", "3")


def test_connections_killed_while_pooled_cost_no_503(make_app, config, db):
    """As after a server or PgBouncer restart: the pool checks a connection before handing it out."""
    app = make_app({**config, "PG_POOL_SIZE": 2})
    client = app.test_client()
    assert send(client, payment("evt_before_kill")).json["status"] == "processed"
    # With a timeout, pg_terminate_backend returns once the backend has exited (its socket closed), as after a
    # restart; without, it returns when the signal is sent, and a delivery could still catch the backend alive.
    killed = db.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name LIKE 'webhook-ledger:%%'").fetchall()
    assert killed and all(ok for ok, in killed)
    answers = [send(client, payment(f"evt_after_kill_{n}")).status for n in range(3)]
    assert answers == [200, 200, 200]


def test_a_pooled_connection_whose_descriptor_is_past_1024_is_used(make_app, config):
    """select() cannot watch a descriptor >= 1024 (FD_SETSIZE): a host holding many connections has such ones."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 1100
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE's hard limit ({hard}) is under {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    # A socket an earlier test left to the collector, closed later, would free a low descriptor for the pool.
    gc.collect()
    filler = []  # the lowest free descriptor is always the next one: fill up to 1023
    try:
        while len(filler) < needed and (fd := os.open(os.devnull, os.O_RDONLY)) < 1024:
            filler.append(fd)
        os.close(fd)
        app = make_app({**config, "PG_POOL_SIZE": 1})
        answer = send(app.test_client(), payment("evt_high_descriptor"))
        with get_pool(app).connection() as conn:
            assert conn.pgconn.socket >= 1024
        assert (answer.status, answer.json["status"]) == (200, "processed")
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_psycopgs_log_lines_hold_no_value_of_the_database_url(make_app, config, db, caplog):
    """libpq quotes the role, database or host it failed on, and psycopg_pool logs it on every attempt."""
    url = f"postgresql://s3cret-role:s3cret-password@{db.info.host}:{db.info.port}/s3cret-database"
    app = make_app({**config, "DATABASE_URL": url, "PG_POOL_TIMEOUT_MS": 1000})
    with caplog.at_level(logging.INFO, logger="psycopg"):
        assert app.test_client().get("/ready").status_code == 503
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("psycopg")]
    assert any("error connecting" in line and "does not exist" in line for line in lines), lines
    assert [line for line in lines if "s3cret" in line or "\n" in line] == []


def test_the_client_deadline_is_a_backstop_behind_the_statement_timeout(make_app, config):
    """A running server cancels a long statement itself (a clean error); a transaction without a statement
    timeout (`flask ledger verify`'s) is not cut by the client either."""
    pool = get_pool(make_app({**config, "PG_STATEMENT_TIMEOUT_MS": 200, "PG_LOCK_TIMEOUT_MS": 100,
                              "PG_POOL_TIMEOUT_MS": 300}))
    bound = (300 + 200 + MARGIN_MS) / 1000  # a pooler's queue (PG_POOL_TIMEOUT_MS), the statement, the margin
    with pytest.raises(psycopg.errors.QueryCanceled), transaction(pool) as conn:
        conn.execute("SELECT pg_sleep(%s)", [bound + 1])
    with transaction(pool, statement_timeout=0) as conn:
        conn.execute("SELECT pg_sleep(%s)", [bound + 0.3])
    with pool.connection() as conn:
        assert conn.deadline == bound  # the pool's again
