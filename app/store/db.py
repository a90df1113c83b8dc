"""The PostgreSQL connection pool, the transactions it runs, and the `init-db` command (app/store/schema.py).
A transaction's settings are set inside it, never for the session (docs/design.md, "Deployment")."""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import psycopg
from flask import Flask
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolTimeout

from ..core.errors import ConfigError
from ..settings import conninfo
from ..settings.config import DEFAULT_SCHEMA_PATH, Settings, check, from_env
from . import deadline
from .schema import migrate, other_currency, recorded_currency

if TYPE_CHECKING:
    from .schema import Applied

_open_lock = threading.Lock()

# A row of psycopg's namedtuple_row: its fields are its query's columns, which mypy cannot see.
NamedRow = Any

# How often a running statement checks that its client is still connected
# (a poll on the socket: cheap). Well under LOCK_TTL_MS, so that a dead
# worker's transaction is gone before another delivery may take its lock.
CLIENT_CHECK_MS = 500
# TCP settings of every connection (libpq parameters; DATABASE_URL may set
# its own). Without them a server that vanished without a reset (a failover,
# a dropped route) leaves a statement waiting for the kernel's default of
# two hours. A busy server still answers probes (its kernel does), so a slow
# statement is not cut.
TCP_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 11000,  # ms: keepalives_idle + interval x count
}


class Pool(ConnectionPool[deadline.Connection]):
    """psycopg_pool's pool, with the timeouts (ms) that each of its transactions sets."""
    # Its connections wait for an answer no longer than a pooler's queue, a statement and a margin (deadline.py):
    # a frozen server is a 503, not a hang.

    connect_error: psycopg.OperationalError | None = None  # why the pool's last connection failed, if it did

    def __init__(self, conninfo: str, timeouts: Mapping[str, int], **kwargs: Any) -> None:
        super().__init__(conninfo, connection_class=deadline.Connection, configure=self._configure, **kwargs)
        self.timeouts = timeouts
        self.deadline = self.deadline_under(timeouts["statement_timeout"])
        # one_query()'s first statement, built once: it runs before every delivery.
        self.set_timeouts = "SELECT " + ", ".join(
            f"set_config('{name}', '{int(ms)}', true)" for name, ms in timeouts.items()) + ";\n"

    def getconn(self, timeout: float | None = None) -> deadline.Connection:
        """psycopg_pool's, its PoolTimeout naming why connecting failed when it did (PostgreSQL down, say)."""
        try:
            return super().getconn(timeout)
        except PoolTimeout as exc:
            if self.connect_error is None:
                raise
            raise PoolTimeout(f"{exc}: {self.connect_error}") from None

    def _connect(self, timeout: float | None = None) -> deadline.Connection:
        """psycopg_pool's (private, 3.2): its last failure kept for getconn (tests/test_psycopg_guard.py)."""
        try:
            conn = super()._connect(timeout)
        except psycopg.OperationalError as exc:
            self.connect_error = exc
            raise
        self.connect_error = None
        return conn

    def deadline_under(self, statement_timeout_ms: int) -> float | None:
        """Its connections' deadline (seconds) under statement_timeout_ms: its own timeout is a pooler's queue's."""
        return deadline.seconds(self.timeout * 1000, statement_timeout_ms)

    def _configure(self, conn: deadline.Connection) -> None:
        conn.deadline = self.deadline  # first: the statement below is bounded too
        # The worker's pid in pg_stat_activity tells an operator (and the crash
        # test) which gunicorn worker holds a backend. Through PgBouncer it names
        # the server connection only until another client's transaction uses it.
        conn.execute("SELECT set_config('application_name', %s, false)", [f"webhook-ledger:{os.getpid()}"])


def init_app(app: Flask) -> None:
    conninfo.keep_out_of_logs()
    settings = Settings.of(app)
    given = conninfo_to_dict(settings.database_url)
    # open=False: the pool is opened lazily in the process that uses it, so
    # a gunicorn master never holds connections that its workers inherit.
    app.extensions["db_pool"] = Pool(
        settings.database_url,
        timeouts={
            "lock_timeout": settings.pg_lock_timeout_ms,
            "statement_timeout": settings.pg_statement_timeout_ms,
            # A client that vanished mid-transaction frees its locks soon.
            "idle_in_transaction_session_timeout": settings.lock_ttl_ms,
            # A delivery's statements are sent in one go (one_query):
            # a client that died while they wait on a lock gets them rolled
            # back, not committed after it is gone.
            "client_connection_check_interval": CLIENT_CHECK_MS,
        },
        min_size=1,
        max_size=settings.pg_pool_size,
        timeout=settings.pg_pool_timeout_ms / 1000,
        open=False,
        name="webhook-ledger",
        kwargs={
            "autocommit": True,  # transactions are explicit: transaction() below
            "connect_timeout": max(1, settings.pg_pool_timeout_ms // 1000),
            "application_name": "webhook-ledger",
            "prepare_threshold": settings.pg_prepare_threshold,
            **{name: value for name, value in TCP_SETTINGS.items() if name not in given},
        },
        # A connection that died while idle (a restarted server or pooler) is
        # replaced before it is handed out, not used for a delivery that
        # would then answer 503.
        check=_check_if_closed,
    )


def _check_if_closed(conn: deadline.Connection) -> None:
    """Ask a pooled connection whether it is alive (one empty query) only when its socket has something to say."""
    # An idle connection has nothing to read unless its server closed it (a restart, PgBouncer stopping, a terminated
    # backend) or sent a notice: a poll of the socket tells, with no round trip for the healthy ones.
    # poll(), not select(): select cannot watch a descriptor >= 1024
    # (FD_SETSIZE), which a host holding many connections hands out.
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


def get_pool(app: Flask) -> Pool:
    """Return the app's pool, opening it on first use in this process."""
    pool = pool_as_it_is(app)
    if pool.closed:
        with _open_lock:
            if pool.closed:
                pool.open(wait=False)
    return pool


def pool_as_it_is(app: Flask) -> Pool:
    """The app's pool, opened or not (get_pool opens it): for a look that must not open it (/metrics)."""
    pool: Pool = app.extensions["db_pool"]
    return pool


@contextmanager
def transaction(pool: Pool, read_only: bool = False, **timeouts: int) -> Iterator[deadline.Connection]:
    """A pooled connection inside one transaction with the pool's timeouts (timeouts overrides some, in ms, 0: none);
    commit, or roll back on error."""
    # BEGIN and the SET LOCALs travel as one simple-protocol message: the timeouts cost no round trip over a bare
    # BEGIN, and they end with the transaction, whatever pooler is in between.
    begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if read_only else "BEGIN"
    settings = sql.SQL("").join(
        sql.SQL("; SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(int(ms)))
        for name, ms in {**pool.timeouts, **timeouts}.items())
    statement_ms = {**pool.timeouts, **timeouts}["statement_timeout"]
    with pool.connection() as conn, statement_timeout(pool, conn, statement_ms):
        conn.execute(sql.SQL(begin) + settings)  # no parameters: one simple query
        try:
            yield conn
        except BaseException:
            if not conn.broken:  # a lost connection has nothing to roll back; the pool discards it
                with suppress(psycopg.Error):  # the body's exception is the one to see
                    conn.rollback()
            raise
        conn.commit()


@contextmanager
def statement_timeout(pool: Pool, conn: deadline.Connection, ms: int) -> Iterator[deadline.Connection]:
    """conn's client-side deadline (deadline.py) follows a statement timeout of ms (0: none), then the pool's again."""
    conn.deadline = pool.deadline_under(ms)
    try:
        yield conn
    finally:
        conn.deadline = pool.deadline


def one_query(pool: Pool, statement: str, params: Mapping[str, object] | Sequence[object]) -> TupleRow | None:
    """Run statement with the pool's timeouts in ONE message to the server (one implicit transaction); return its
    first row."""
    # One simple-protocol query, the parameters bound on the client: PostgreSQL commits it when it ends or rolls it
    # back whole, in one round trip, and nothing of it (its local timeouts included) outlives it, whatever pooler is
    # in between.
    with pool.connection() as conn:
        cursor = psycopg.ClientCursor(conn)
        cursor.execute(pool.set_timeouts + statement, params)
        cursor.nextset()
        return cursor.fetchone()


@contextmanager
def unavailable_in_one_line() -> Iterator[None]:
    """For a `flask` command: PostgreSQL unreachable, timed out or frozen ends it with one line (exit 1)."""
    pool_logger = logging.getLogger("psycopg.pool")
    level, pool_logger.level = pool_logger.level, logging.ERROR  # its retries' warnings: the cause is said below
    try:
        yield
    except psycopg.OperationalError as exc:
        reason = conninfo.redacted(f"{type(exc).__name__}: {exc}")
        raise click.ClickException(f"database unavailable: {reason}") from None
    finally:
        pool_logger.level = level


def apply_schema(conn: psycopg.Connection[Any], path: Path = DEFAULT_SCHEMA_PATH, currency: str = "usd") -> Applied:
    """Bring the database to the schema: path on an empty one, else the migrations it lacks (app/store/schema.py);
    return schema.Applied. Safe twice, and from two hosts at once."""
    # currency is the ledger's (LEDGER_CURRENCY), for a migration that needs it.
    return migrate(conn, path, currency)


# How long gunicorn's start waits for PostgreSQL to say the ledger's currency; past it, deliveries ask (release.py).
START_CONNECT_TIMEOUT_S = 2


def check_at_start() -> NoReturn:
    """check()'s exit, and EX_CONFIG when the database (if it answers now) records another currency than
    LEDGER_CURRENCY. gunicorn.conf.py runs it in a child process before any worker starts."""
    try:
        settings = from_env()
    except ConfigError:
        check()
    try:
        with psycopg.connect(settings.database_url, connect_timeout=START_CONNECT_TIMEOUT_S, autocommit=True) as conn:
            recorded = recorded_currency(conn)
    except psycopg.Error:  # unreachable, or no ledger yet: each process asks again before a delivery
        sys.exit(0)
    if recorded is not None and recorded != settings.ledger_currency:
        sys.stderr.write(ConfigError(other_currency(settings.ledger_currency, recorded)).format_message() + "\n")
        sys.exit(ConfigError.exit_code)
    sys.exit(0)
