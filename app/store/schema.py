"""The schema, versioned: what `flask init-db` runs before it recomputes the stored effects
(docs/deploying.md, "Upgrading the schema")."""

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
        ran        BOOLEAN NOT NULL,  -- false: schema.sql had it already
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""
# The first release: the row that says schema.sql made the database (its sha256: the schema.sql that did).
BASELINE = "1.0.0"
# The money rule, beside schema.sql: applied after the tables, every time.
MONEY = "money.sql"
RECORD = "INSERT INTO schema_migrations (name, sha256, ran) VALUES (%s, %s, %s)"
BEFORE_1_0 = (f"this database was made by a build before release {BASELINE}, which {BASELINE} does not upgrade: "
              "nothing was changed (docs/deploying.md, \"From a build before 1.0.0\")")


class SchemaError(RuntimeError):
    """The database does not fit this release's schema and migrations: nothing was changed."""


class Applied(NamedTuple):
    created: bool  # the database was empty: schema.sql made it whole
    ran: list[str]  # the names of the migrations that ran, in order


def migrate(conn: psycopg.Connection[Any], schema_path: Path, currency: str) -> Applied:
    """Bring conn's database to schema_path's schema, under the lock, in one transaction; return what was done.

    The migrations are the folder `migrations` beside schema_path, the rule its `money.sql`; currency is
    LEDGER_CURRENCY, which a migration may read as `webhook_ledger.currency`. Raises SchemaError, changing
    nothing, on a database this release does not know how to bring to its schema.
    """
    files = {path.name: path.read_bytes() for path in sorted((schema_path.parent / "migrations").glob("*.sql"))}
    sha256 = {name: hashlib.sha256(text).digest() for name, text in files.items()}
    created = False
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])  # first: a second host waits here
        conn.execute(sql.SQL("SELECT set_config('webhook_ledger.currency', {}, true)").format(sql.Literal(currency)))
        tables = _value(conn, "SELECT to_regclass('webhook_events') IS NOT NULL")
        conn.execute(RECORDS)
        recorded = dict(conn.execute("SELECT name, sha256 FROM schema_migrations").fetchall())
        if not recorded and tables or recorded and BASELINE not in recorded:
            raise SchemaError(BEFORE_1_0)
        if not recorded:  # an empty database
            schema = schema_path.read_bytes()
            conn.execute(schema.decode())
            conn.execute(RECORD, [BASELINE, hashlib.sha256(schema).digest(), False])
            for name in files:
                conn.execute(RECORD, [name, sha256[name], False])
            recorded = {BASELINE: b"", **sha256}
            created = True
        recorded.pop(BASELINE)
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


def _value(conn: psycopg.Connection[Any], query: str) -> Any:
    """The one value of a query that returns one row (a SELECT without FROM)."""
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]
