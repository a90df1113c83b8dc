"""The PostgreSQL connection pool and the schema, with the `init-db` command."""

import os
import threading

import click
from flask import current_app
from flask.cli import with_appcontext
from psycopg_pool import ConnectionPool

from .config import DEFAULT_SCHEMA_PATH

_open_lock = threading.Lock()

# How often a running statement checks that its client is still connected
# (a poll on the socket: cheap). Well under LOCK_TTL_MS, so that a dead
# worker's transaction is gone before another delivery may take its lock.
CLIENT_CHECK_MS = 500


def init_app(app):
    config = app.config
    # open=False: the pool is opened lazily in the process that uses it, so
    # a gunicorn master never holds connections that its workers inherit.
    app.extensions["db_pool"] = ConnectionPool(
        config["DATABASE_URL"],
        min_size=1,
        max_size=config["PG_POOL_SIZE"],
        timeout=config["PG_POOL_TIMEOUT_MS"] / 1000,
        open=False,
        name="webhook-ledger",
        kwargs={
            "autocommit": True,  # transactions are explicit: conn.transaction()
            "connect_timeout": max(1, config["PG_POOL_TIMEOUT_MS"] // 1000),
            "application_name": "webhook-ledger",
            "options": (
                f"-c lock_timeout={config['PG_LOCK_TIMEOUT_MS']}"
                f" -c statement_timeout={config['PG_STATEMENT_TIMEOUT_MS']}"
                # A client that vanished mid-transaction frees its locks soon.
                f" -c idle_in_transaction_session_timeout={config['LOCK_TTL_MS']}"
                # A delivery's statements are sent in one go (ledger._apply_new):
                # a client that died while they wait on a lock gets them
                # rolled back, not committed after it is gone.
                f" -c client_connection_check_interval={CLIENT_CHECK_MS}"
            ),
        },
        configure=_name_connection,
    )
    app.cli.add_command(init_db_command)


def _name_connection(conn):
    # The worker's pid in pg_stat_activity tells an operator (and the crash
    # test) which gunicorn worker holds a backend.
    conn.execute("SELECT set_config('application_name', %s, false)", [f"webhook-ledger:{os.getpid()}"])


def get_pool(app):
    """Return the app's pool, opening it on first use in this process."""
    pool = app.extensions["db_pool"]
    if pool.closed:
        with _open_lock:
            if pool.closed:
                pool.open(wait=False)
    return pool


def apply_schema(conn, path=DEFAULT_SCHEMA_PATH):
    """Apply schema.sql; it is written to be safe to apply again."""
    conn.execute(path.read_text())


@click.command("init-db")
@with_appcontext
def init_db_command():
    """Create the tables (idempotent)."""
    path = current_app.config["SCHEMA_PATH"]
    with get_pool(current_app).connection() as conn:
        apply_schema(conn, path)
    click.echo(f"applied {path}")
