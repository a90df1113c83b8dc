"""The schema, versioned: what `flask init-db` runs before it recomputes the stored effects.

schema.sql is the current schema's tables, whole. An empty database gets it,
and every file of migrations/ is recorded as included. A database created by
an earlier release gets the migrations it lacks, in the order of their names
(`NNN_what.sql`; `001a_...` sorts between 001 and 002, and a database that
has 002 gets it last). Then, either way and on every run, money.sql (the money
rule: functions and a view, all replaced) is applied whole, so that a rule
change is one file's diff and no migration. `schema_migrations` records each: its name, its file's
SHA-256, whether it ran here or the schema had it already, and when. A
database made before that table existed is told by its tables (RELEASES) and
recorded at its release first.

All of it is ONE transaction that first takes an advisory lock: two hosts
running init-db at once apply each migration once (the second waits, then
finds them recorded), and a migration that fails leaves the database as it
was, at a version the running release knows. The lock is transaction-level,
so it holds behind PgBouncer in transaction mode too and ends with the
transaction whatever happens to the client.
"""

import hashlib
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

# pg_advisory_xact_lock's key: init-db's, used by no other lock of the app.
LOCK_KEY = 0x77656268_6F6F6B21  # "webhook!" in ASCII
RECORDS = """
    CREATE TABLE IF NOT EXISTS schema_migrations (
        name       TEXT PRIMARY KEY,
        sha256     BYTEA NOT NULL,
        ran        BOOLEAN NOT NULL,  -- false: the database had it already (schema.sql, or an earlier release)
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""
# The releases from before schema_migrations, newest first: a query that
# tells a database made (or upgraded in place) by it, and the migrations
# its schema had already (not 001a: it creates a table none of them had).
RELEASES = [
    ("SELECT to_regclass('ledger_journal') IS NOT NULL",  # payments
     ["001_sources.sql", "002_payments.sql"]),
    ("SELECT to_regclass('ledger_credits') IS NOT NULL AND EXISTS (SELECT FROM pg_attribute"  # sources
     " WHERE attrelid = 'webhook_events'::regclass AND attname = 'source' AND NOT attisdropped)",
     ["001_sources.sql"]),
    ("SELECT to_regclass('ledger_credits') IS NOT NULL", []),  # the first
]
# The money rule, beside schema.sql: applied after the tables, every time.
MONEY = "money.sql"
RECORD = "INSERT INTO schema_migrations (name, sha256, ran) VALUES (%s, %s, %s)"


class SchemaError(RuntimeError):
    """The database's recorded migrations do not fit this release's files: nothing was changed."""


class Applied(NamedTuple):
    created: bool  # the database was empty: schema.sql made it whole
    ran: list[str]  # the names of the migrations that ran, in order


def migrate(conn: psycopg.Connection[Any], schema_path: Path, currency: str) -> Applied:
    """Bring conn's database to schema_path's schema, under the lock, in one transaction; return what was done.

    The migrations are the folder `migrations` beside schema_path, the rule
    its `money.sql`. currency
    is the ledger's (LEDGER_CURRENCY), which a migration may read as
    `webhook_ledger.currency`. Raises SchemaError, changing nothing, when the
    database records a migration that is not in the folder (it is newer than
    this release) or whose file has changed since.
    """
    files = {path.name: path.read_bytes() for path in sorted((schema_path.parent / "migrations").glob("*.sql"))}
    sha256 = {name: hashlib.sha256(text).digest() for name, text in files.items()}
    created = False
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])  # first: a second host waits here
        conn.execute(sql.SQL("SELECT set_config('webhook_ledger.currency', {}, true)").format(sql.Literal(currency)))
        conn.execute(RECORDS)
        recorded = dict(conn.execute("SELECT name, sha256 FROM schema_migrations").fetchall())
        if not recorded:
            had = _release(conn)
            if had is None:  # an empty database
                conn.execute(schema_path.read_text())
                had, created = list(files), True
            for name in had:
                conn.execute(RECORD, [name, sha256[name], False])
                recorded[name] = sha256[name]
        unknown = sorted(set(recorded) - set(files))
        if unknown:
            raise SchemaError(f"the database has migrations that this release has not: {', '.join(unknown)}")
        changed = sorted(name for name in recorded if bytes(recorded[name]) != sha256[name])
        if changed:
            raise SchemaError(f"migrations changed since they were applied: {', '.join(changed)}")
        ran = [name for name in files if name not in recorded]
        for name in ran:
            conn.execute(files[name].decode())
            conn.execute(RECORD, [name, sha256[name], True])
        conn.execute((schema_path.parent / MONEY).read_text())
    return Applied(created, ran)


def _release(conn: psycopg.Connection[Any]) -> list[str] | None:
    """The migrations the schema of a database made before schema_migrations had; None if it is empty."""
    if _value(conn, "SELECT to_regclass('webhook_events')") is None:
        return None
    for query, had in RELEASES:
        if _value(conn, query):
            return had
    raise SchemaError("webhook_events exists, but no release's schema is recognised: nothing was changed")


def _value(conn: psycopg.Connection[Any], query: str) -> Any:
    """The one value of a query that returns one row (a SELECT without FROM)."""
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]
