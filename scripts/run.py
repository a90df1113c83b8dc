"""`make run`: the service on http://127.0.0.1:8000 (or $PORT), ready to be sent
a signed webhook.

With DATABASE_URL and REDIS_URL both set, those servers are used. Otherwise a
private PostgreSQL cluster (kept in .run/ between runs) and a redis-server are
started on free loopback ports. Either way the schema is applied, a demo user
is created, gunicorn runs with the committed gunicorn.conf.py, its logs on
our terminal, and .run/env holds every setting it runs with, for `flask`
commands in another terminal (`. .run/env`). MAKE_RUN_DIR names another folder
than .run/ for all of it (devservers/run_dir.py). Ctrl-C, SIGTERM or SIGHUP stops everything this script started,
and nothing else; so does gunicorn exiting, or a start that fails half way.
"""

import os
import sys
from pathlib import Path

# devservers (the throwaway servers) is test tooling, not installed with the
# app: the scripts import it from the checkout they belong to.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.settings.config import ConfigError, from_env
from app.store.db import apply_schema
from app.store.schema import SchemaError
from devservers import Gunicorn
from devservers.background import shown
from devservers.demo import DEMO_USER, add_demo_user, banner, check_settings, write_env
from devservers.run_dir import RUN_DIR, start_servers
from devservers.supervise import Failed, logger, port_free, say, supervise

log = logger("run")


def main():
    return supervise(run, log)


def run(cleanup):
    port = os.environ["PORT"] = os.environ.get("PORT") or "8000"
    host, http_port = parse_bind(os.environ.get("BIND") or f"127.0.0.1:{port}")
    if not port_free(host, http_port):
        raise Failed(f"port {http_port} on {host} is already in use (another `make run`?); "
                     "stop that, or run with PORT=<another port>")
    secret_from_env = check_settings(log)
    external = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    if external:
        log("using DATABASE_URL and REDIS_URL from the environment (they are not stopped on exit)")
    else:
        if os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"):
            log("only one of DATABASE_URL / REDIS_URL is set: ignoring it, starting private servers for both")
        start_servers(cleanup, log)
    try:
        config = from_env()
    except ConfigError as exc:
        raise Failed(f"configuration: {exc}") from None
    event_id, balance = prepare_database(config)

    # One folder for gunicorn's workers and the `flask` commands of the banner's
    # export block: what a replay applies reaches /metrics (docs/operations.md).
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(RUN_DIR / "metrics"))
    # For `flask` commands in another terminal: every setting this service runs with (docs/operations.md).
    # Written before gunicorn answers, so that a terminal that sees it answering reads this run's settings.
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    env_file = write_env(RUN_DIR / "env", config, f"http://{url_host}:{http_port}")
    log(f"starting gunicorn on {host}:{http_port}")
    server = Gunicorn({}, workers=None, threads=None, log_path="-", port=http_port, host=url_host)
    cleanup.callback(stop_gunicorn, server)
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        raise Failed(f"gunicorn did not come up ({exc}); see its log above") from None
    say(banner(server.base, event_id, balance, config, secret_from_env, external, env_file))

    status = server.proc.wait()
    status = 128 - status if status < 0 else status
    log(f"gunicorn exited with status {status}")
    return status


def parse_bind(bind):
    """(host, port) of a host:port BIND, as gunicorn.conf.py binds it; an empty host is every address."""
    host, colon, port = bind.rpartition(":")
    if not colon or bind.startswith("unix:") or not port.isdigit():
        raise Failed(f"BIND must be host:port for make run, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def prepare_database(config):
    """Apply the schema and create the demo user; return the next demo event id and its balance."""
    log("applying the schema")
    try:
        with psycopg.connect(config.database_url, autocommit=True, connect_timeout=10) as conn:
            apply_schema(conn, config.schema_path, config.policy.currency)
            add_demo_user(conn)
            # The first evt_demo_N this database has not seen, so that the printed
            # command answers "processed" once, then "duplicate", on every start.
            (number,) = conn.execute(
                "SELECT coalesce(max(substring(event_id FROM '^evt_demo_([0-9]{1,9})$')::int), 0) + 1"
                " FROM webhook_events WHERE event_id ~ '^evt_demo_[0-9]{1,9}$'").fetchone()
            (balance,) = conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s",
                                      [DEMO_USER]).fetchone()
    except psycopg.Error as exc:
        raise Failed(f"preparing the database: {exc}") from None
    except SchemaError as exc:  # another LEDGER_CURRENCY than the kept cluster's, say
        raise Failed(f"preparing the database: {exc} (make run's own cluster is kept in {RUN_DIR}: with make run "
                     f"stopped, `rm -rf {shown(RUN_DIR / 'pg')}` starts an empty one)") from None
    log(f"demo user {DEMO_USER} exists, balance {balance} cents")
    return f"evt_demo_{number}", balance


def stop_gunicorn(server):
    if server.proc and server.proc.poll() is None:
        log(f"stopping gunicorn (pid {server.proc.pid})")
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
