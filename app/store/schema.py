"""The schema, versioned: what `flask init-db` runs before it recomputes the stored effects
(docs/deploying.md, "Upgrading the schema")."""

import hashlib
from functools import cache
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
# The money rule's row: the sha256 of the money.sql applied last, and when that text was first applied.
RECORD_MONEY = RECORD + (" ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = now()"
                         " WHERE schema_migrations.sha256 <> EXCLUDED.sha256")
# A migration's earlier text, never released, that a database may have recorded: accepted as the file's own where
# what it did is read as what the file does. 005's before `DROP TYPE IF EXISTS` (it stopped on the database of the
# commit tagged 1.0.0, which never made the type) and before the journal was left append-only: it rewrote the moved
# payments' journal rows to their keys in the account, which ledger_journal_keyed reads as they are (012 finds no
# row of a bare key to journal a move for). docs/deploying.md.
SUPERSEDED = {
    "005_connect_accounts.sql": {bytes.fromhex("369d737f05d8be96fb786c743596603f8979480224f8f7003e62919925f04d65")},
}
NO_SCHEMA = "the database has no schema: run `flask init-db`"
BEFORE_1_0 = (f"this database was made by a build before release {BASELINE}, which {BASELINE} does not upgrade: "
              "nothing was changed (docs/deploying.md, \"From a build before 1.0.0\")")


class SchemaError(RuntimeError):
    """The database does not fit this release's schema and migrations: nothing was changed."""


def newer(names: list[str]) -> str:
    """Why a database that records migrations this release has not is not at this release (init-db's too)."""
    return (f"the database is newer than this release: it has migrations that this release has not: {', '.join(names)}"
            " (deploy that release, or restore)")


class Applied(NamedTuple):
    created: bool  # the database was empty: schema.sql made it whole
    ran: list[str]  # the names of the migrations that ran, in order


def migrate(conn: psycopg.Connection[Any], schema_path: Path, currency: str) -> Applied:
    """Bring conn's database to schema_path's schema (the migrations beside it), under the lock, in one transaction;
    return what was done, or raise SchemaError, changing nothing, for a database this release cannot bring there."""
    # The migrations are the folder `migrations` beside schema_path, the rule its `money.sql`; currency is
    # LEDGER_CURRENCY, which a migration may read as `webhook_ledger.currency`. What a migration added NOT VALID is
    # validated after its transaction.
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
            _run(conn, schema_path.name, schema)
            conn.execute(RECORD, [BASELINE, hashlib.sha256(schema).digest(), False])
            for name in files:
                conn.execute(RECORD, [name, sha256[name], False])
            recorded = {BASELINE: b"", **sha256}
            created = True
        recorded.pop(BASELINE)
        recorded.pop(MONEY, None)
        unknown = sorted(set(recorded) - set(files))
        if unknown:
            raise SchemaError(newer(unknown))
        changed = _changed(recorded, sha256)
        if changed:
            raise SchemaError(f"migrations changed since they were applied: {', '.join(changed)}")
        ran = [name for name in files if name not in recorded]
        for name in ran:
            _run(conn, name, files[name])
            conn.execute(RECORD, [name, sha256[name], True])
        money = (schema_path.parent / MONEY).read_bytes()
        _run(conn, MONEY, money)
        conn.execute(RECORD_MONEY, [MONEY, hashlib.sha256(money).digest(), True])  # what why_not_at_release reads
        _record_currency(conn, currency)
    _validate_constraints(conn)
    return Applied(created, ran)


def _changed(recorded: dict[str, Any], sha256: dict[str, bytes]) -> list[str]:
    """The names of the recorded migrations whose file is not the text recorded (nor one it supersedes), sorted."""
    return sorted(name for name in recorded
                  if bytes(recorded[name]) != sha256[name] and bytes(recorded[name]) not in SUPERSEDED.get(name, ()))


def _run(conn: psycopg.Connection[Any], name: str, text: bytes) -> None:
    """Execute a migration's or the money rule's text; SchemaError, in one line naming it, when PostgreSQL refuses
    it (the transaction then ends, changing nothing). PostgreSQL unreachable or timed out is not the file's fault:
    that error goes on (the command says it in one line too)."""
    try:
        conn.execute(text.decode())
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise SchemaError(f"{name} failed, nothing was changed: {one_line(exc)}") from None


def one_line(exc: psycopg.Error) -> str:
    """PostgreSQL's error on one line: its SQLSTATE and primary message (its detail and context lines left out)."""
    message = exc.diag.message_primary or next(iter(str(exc).splitlines()), "")
    return f"{exc.sqlstate or type(exc).__name__}: {' '.join(message.split())}"


# The CHECKs and foreign keys a migration added NOT VALID (or an init-db stopped before it validated).
NOT_VALIDATED = """
    SELECT conrelid::regclass::text, conname FROM pg_constraint
    WHERE NOT convalidated AND connamespace = 'public'::regnamespace ORDER BY 1, 2
"""


def _validate_constraints(conn: psycopg.Connection[Any]) -> None:
    """Validate, after migrate's commit and each in its own transaction, what a migration added NOT VALID: a scan
    under a SHARE UPDATE EXCLUSIVE lock, which blocks neither reads nor writes (migrate's transaction, holding the
    table's ACCESS EXCLUSIVE lock, would block both for the scan)."""
    with conn.transaction():
        pending = conn.execute(NOT_VALIDATED).fetchall()
    for table, name in pending:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(sql.Identifier(table),
                                                                                    sql.Identifier(name)))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise SchemaError(f"the migrations are applied, but constraint {name} of {table} does not hold for every "
                              f"row: {one_line(exc)}") from None


def other_currency(configured: str, recorded: str) -> str:
    """Why LEDGER_CURRENCY cannot be configured when the ledger records another, naming the two fixes."""
    return (f"LEDGER_CURRENCY is {configured}, but this ledger is in {recorded} (recorded by its first init-db): set "
            f"LEDGER_CURRENCY={recorded}, or move a ledger where nothing has moved with `flask ledger set-currency "
            f"{configured}` (docs/operations.md)")


def _record_currency(conn: psycopg.Connection[Any], currency: str) -> None:
    """Record currency as the ledger's when none is; SchemaError when another is, or a credited payment's is."""
    recorded = recorded_currency(conn)
    if recorded is None:
        other = conn.execute("SELECT currency FROM payments WHERE currency <> %s LIMIT 1", [currency]).fetchone()
        if other is not None:
            raise SchemaError(other_currency(currency, other[0]))
        conn.execute("INSERT INTO ledger_currency (currency) VALUES (%s)", [currency])
    elif recorded != currency:
        raise SchemaError(other_currency(currency, recorded))


def recorded_currency(conn: psycopg.Connection[Any]) -> str | None:
    """The ledger's currency, as its first init-db recorded it (None: not yet)."""
    row = conn.execute("SELECT currency FROM ledger_currency").fetchone()
    return None if row is None else str(row[0])


def set_currency(conn: psycopg.Connection[Any], currency: str) -> str:
    """Make currency the ledger's and return the one it was in; SchemaError when a payment or a journal row exists.

    Credits wait for the transaction (payments is locked against inserts), so none lands between check and change.
    """
    with conn.transaction():
        conn.execute("LOCK TABLE payments, ledger_journal IN SHARE MODE")
        moved = _value(conn, "SELECT EXISTS (SELECT FROM payments) OR EXISTS (SELECT FROM ledger_journal)")
        recorded = recorded_currency(conn)
        if moved and recorded != currency:
            raise SchemaError(f"money has moved in this ledger (in {recorded}): its currency cannot change; nothing "
                              "was changed")
        conn.execute("INSERT INTO ledger_currency (currency) VALUES (%s)"
                     " ON CONFLICT (one) DO UPDATE SET currency = EXCLUDED.currency, recorded_at = now()", [currency])
    return recorded or currency


def why_not_at_release(conn: psycopg.Connection[Any], schema_path: Path) -> str | None:
    """None when conn's database is at the release of schema_path's files, else why not, in one line naming the fix.

    One query (conn in autocommit: a database without schema_migrations is an error, caught).
    """
    try:
        tables, names, digests = conn.execute(
            "SELECT to_regclass('webhook_events') IS NOT NULL, array_agg(name), array_agg(sha256)"
            " FROM schema_migrations").fetchone() or (False, None, None)
    except psycopg.errors.UndefinedTable:
        tables, names, digests = _value(conn, "SELECT to_regclass('webhook_events') IS NOT NULL"), None, None
    recorded = {name: bytes(digest) for name, digest in zip(names or [], digests or [], strict=True)}
    if not recorded:
        return BEFORE_1_0 if tables else NO_SCHEMA
    if BASELINE not in recorded:
        return BEFORE_1_0
    files, money = _release(schema_path)
    money_recorded = recorded.pop(MONEY, None)
    recorded.pop(BASELINE)
    unknown = sorted(set(recorded) - set(files))
    if unknown:
        return newer(unknown)
    changed = _changed(recorded, files)
    if changed:
        return f"migrations changed since they were applied: {', '.join(changed)}: deploy the release that applied them"
    missing = sorted(set(files) - set(recorded))
    if missing:
        return f"migrations of this release not applied: {', '.join(missing)}: run `flask init-db`"
    if money_recorded is None:
        return f"the money rule ({MONEY}) is not applied: run `flask init-db`"
    if money_recorded != money:
        return f"the money rule ({MONEY}) applied is another release's: run this release's `flask init-db`"
    return None


@cache
def _release(schema_path: Path) -> tuple[dict[str, bytes], bytes]:
    """The sha256 of each migration beside schema_path, by name, and of its money.sql: read once per process."""
    files = sorted((schema_path.parent / "migrations").glob("*.sql"))
    return ({path.name: hashlib.sha256(path.read_bytes()).digest() for path in files},
            hashlib.sha256((schema_path.parent / MONEY).read_bytes()).digest())


def _value(conn: psycopg.Connection[Any], query: str) -> Any:
    """The one value of a query that returns one row (a SELECT without FROM)."""
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]
