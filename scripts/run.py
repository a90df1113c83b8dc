"""`make run`: the service on http://127.0.0.1:8000 (or $PORT), ready to be sent
a signed webhook.

With DATABASE_URL and REDIS_URL both set, those servers are used. Otherwise a
private PostgreSQL cluster (kept in .run/ between runs) and a redis-server are
started on free loopback ports. Either way the schema is applied, a demo user
is created, and gunicorn runs with the committed gunicorn.conf.py, its logs on
our terminal. Ctrl-C, SIGTERM or SIGHUP stops everything this script started,
and nothing else; so does gunicorn exiting, or a start that fails half way.
"""

import contextlib
import fcntl
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# devservers (the throwaway servers) is test tooling, not installed with the
# app: the scripts import it from the checkout they belong to.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.config import ConfigError, from_env
from app.db import apply_schema
from app.signature import sign
from devservers import Gunicorn, Postgres, Redis, children

RUN_DIR = Path(__file__).resolve().parent.parent / ".run"
DEMO_USER = "00000000-0000-4000-8000-000000000001"
DEMO_SECRET = "dev-secret-change-me"
DB_NAME = "webhook_ledger"
# A Unix socket's path is limited to ~107 bytes: a deep checkout's goes to /tmp.
MAX_SOCKET_DIR = 80
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Failed(Exception):
    """Start-up cannot go on; the message says why and what to do."""


class Stopped(Exception):
    """A signal asked us to stop; we exit with 128 + its number, as a shell does."""


def say(text, fd=1):
    # os.write, unbuffered: a terminal that is gone (a Ctrl-C'd `| tee`, a
    # hung-up tty) must not stop the clean-up, nor leave output to flush at exit.
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def log(message):
    say(f"run: {message}\n", fd=2)


def stop_on_signal(signum, frame):
    for sig in STOP_SIGNALS:  # a second Ctrl-C must not interrupt the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def main():
    return supervise(run, log)


def supervise(run, log):
    """Run run(cleanup) until it returns, fails or a signal stops it; return the exit status.

    Each server's stop is pushed on cleanup as it starts; they run in reverse
    on the way out, whatever the way out is.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop_on_signal)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(stop_stray_children)
        try:
            return run(cleanup)
        except Stopped as stop:
            return 128 + stop.args[0]
        except Failed as failure:
            log(f"error: {failure}")
            return 1
        finally:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)


def check_settings(log):
    """Use the demo secret unless WEBHOOK_SECRET is set, and check the settings before anything starts.

    Return whether the secret came from the environment.
    """
    secret_from_env = bool(os.environ.get("WEBHOOK_SECRET"))
    if not secret_from_env:
        os.environ["WEBHOOK_SECRET"] = DEMO_SECRET
        log(f"WEBHOOK_SECRET is not set: using the DEMO secret '{DEMO_SECRET}' (never use it in production)")
    try:  # the servers' URLs are known later
        from_env({**os.environ, "DATABASE_URL": "postgresql://localhost/later", "REDIS_URL": "redis://localhost/0"})
    except ConfigError as exc:
        raise Failed(f"configuration: {exc}") from None
    return secret_from_env


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
        start_servers(cleanup)
    try:
        config = from_env()
    except ConfigError as exc:
        raise Failed(f"configuration: {exc}") from None
    event_id, balance = prepare_database(config)

    log(f"starting gunicorn on {host}:{http_port}")
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    server = Gunicorn({}, workers=None, threads=None, log_path="-", port=http_port, host=url_host)
    cleanup.callback(stop_gunicorn, server)
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        raise Failed(f"gunicorn did not come up ({exc}); see its log above") from None
    say(banner(server.base, event_id, balance, config, secret_from_env, external))

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


def port_free(host, port):
    # SO_REUSEADDR as gunicorn sets it: a port in TIME_WAIT after the last run is free.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True


def start_servers(cleanup):
    """Start PostgreSQL and redis-server under .run/; export DATABASE_URL and REDIS_URL."""
    if not shutil.which("redis-server"):
        raise Failed("redis-server not found (install redis, or set DATABASE_URL and REDIS_URL)")
    RUN_DIR.mkdir(exist_ok=True)
    lock_run_dir(cleanup)
    stop_leftover_redis()
    try:
        pg = Postgres(*pg_dirs(cleanup))
    except RuntimeError as exc:
        raise Failed(f"{exc}; or set DATABASE_URL and REDIS_URL") from None
    if pg.running():
        log("stopping a PostgreSQL left over from an earlier run")
        pg.stop()
    reused = (pg.data / "PG_VERSION").exists()
    log(f"{'reusing' if reused else 'creating'} the PostgreSQL cluster in {pg.data}")
    cleanup.callback(stop_postgres, pg)  # before start: an interrupted start is stopped too
    try:
        pg.init(reuse=True)
        log(f"starting PostgreSQL on 127.0.0.1:{pg.port}")
        pg.start()
    except subprocess.CalledProcessError as exc:
        log_file = pg.dir / "log"
        tail = log_file.read_text(errors="replace").splitlines()[-15:] if log_file.exists() else []
        raise Failed("\n".join([exc.stderr.decode(errors="replace").strip(), *tail,
                                f"PostgreSQL did not start (log: {log_file})"])) from None
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone():
                conn.execute(f"CREATE DATABASE {DB_NAME}")
    except psycopg.Error as exc:
        raise Failed(f"creating the database {DB_NAME}: {exc}") from None
    os.environ["DATABASE_URL"] = pg.url(DB_NAME)

    redis = Redis(workdir=RUN_DIR, new_session=True)
    log(f"starting redis-server on 127.0.0.1:{redis.port}")
    cleanup.callback(stop_redis, redis)
    try:
        redis.start()
    except TimeoutError:
        raise Failed(f"redis-server did not come up (log: {RUN_DIR / 'redis.log'})") from None
    os.environ["REDIS_URL"] = redis.url


def lock_run_dir(cleanup):
    """One `make run` per checkout. The kernel's lock goes with our process, even a killed one."""
    pid_file = RUN_DIR / "run.pid"
    held = cleanup.enter_context(open(pid_file, "a+"))
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        raise Failed(f"another make run (pid {held.read().strip() or '?'}) is using {RUN_DIR}; stop it first") from None
    held.truncate(0)
    held.write(f"{os.getpid()}\n")
    held.flush()
    cleanup.callback(pid_file.unlink, missing_ok=True)


def stop_leftover_redis():
    """A redis-server that a killed run left behind still holds its pid file."""
    pid_file = RUN_DIR / "redis.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    try:
        comm = Path(f"/proc/{pid}/comm").read_text()
    except OSError:  # not running
        comm = ""
    if comm.startswith("redis-server"):
        log(f"stopping a redis-server left over from an earlier run (pid {pid})")
        os.kill(pid, signal.SIGTERM)
    pid_file.unlink(missing_ok=True)


def pg_dirs(cleanup):
    """The cluster's folder (.run/pg, kept between runs) and its socket's."""
    base = RUN_DIR / "pg"
    base.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: the cluster belongs to `postgres`.
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise Failed("running as root, but there is no 'postgres' user to run PostgreSQL as") from None
        shutil.chown(base, "postgres")
        if subprocess.run(["runuser", "-u", "postgres", "--", "test", "-w", str(base)], cwd="/").returncode != 0:
            # e.g. a checkout under /root (mode 700): a throwaway cluster in /tmp.
            base = temp_dir(cleanup, "pg")
            log(f"the postgres user cannot reach {RUN_DIR}; the throwaway cluster is in {base} instead")
    socket_dir = base if len(str(base)) <= MAX_SOCKET_DIR else temp_dir(cleanup, "sock")
    return base, socket_dir


def temp_dir(cleanup, kind):
    path = Path(tempfile.mkdtemp(prefix=f"webhook-ledger-run-{kind}."))
    cleanup.callback(shutil.rmtree, path, ignore_errors=True)
    return path


def prepare_database(config):
    """Apply the schema and create the demo user; return the next demo event id and its balance."""
    log("applying the schema")
    try:
        with psycopg.connect(config.database_url, autocommit=True, connect_timeout=10) as conn:
            apply_schema(conn, config.schema_path, config.policy.currency)
            conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)"
                         " ON CONFLICT (user_id) DO NOTHING", [DEMO_USER])
            # The first evt_demo_N this database has not seen, so that the printed
            # command answers "processed" once, then "duplicate", on every start.
            (number,) = conn.execute(
                "SELECT coalesce(max(substring(event_id FROM '^evt_demo_([0-9]{1,9})$')::int), 0) + 1"
                " FROM webhook_events WHERE event_id ~ '^evt_demo_[0-9]{1,9}$'").fetchone()
            (balance,) = conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s",
                                      [DEMO_USER]).fetchone()
    except psycopg.Error as exc:
        raise Failed(f"preparing the database: {exc}") from None
    log(f"demo user {DEMO_USER} exists, balance {balance} cents")
    return f"evt_demo_{number}", balance


def banner(base_url, event_id, balance, config, secret_from_env, external):
    """What to paste into another terminal. Only the demo secret is ever printed."""
    body = json.dumps({"id": event_id, "type": "payment.succeeded",
                       "data": {"userId": DEMO_USER, "amountCents": 1000}}, separators=(",", ":"))
    scheme = config.webhook_signature_scheme
    headers = {"Content-Type": "application/json",
               **sign(scheme, body.encode(), config.webhook_secret, msg_id=event_id)}
    signed_with = "WEBHOOK_SECRET" if secret_from_env else f"the DEMO secret '{DEMO_SECRET}'"
    if scheme in ("stripe", "standard-webhooks"):
        signed_with += f"; its signed timestamp expires in {config.webhook_tolerance_seconds} s"
    curl = " ".join([f"curl -sS -w 'HTTP %{{http_code}}\\n' -X POST {base_url}/api/webhooks",
                     *(f"-H {shlex.quote(f'{name}: {value}')}" for name, value in headers.items()),
                     '--data-binary "$BODY"'])
    psql_target = '"$DATABASE_URL"' if external else shlex.quote(config.database_url)
    demo = "" if secret_from_env else f"\nWEBHOOK_SECRET = {DEMO_SECRET}  <- a DEMO secret, for local use only\n"
    rule = "=" * 70
    return f"""
{rule}
webhook-ledger is up at {base_url}   (Ctrl-C stops it{'' if external else ' and its servers'})
{demo}
Credit the demo user 1000 cents ({scheme}, signed with {signed_with}); paste it twice:
the first answer is "processed", the second "duplicate".

BODY={shlex.quote(body)}
{curl}

The balance ({balance} cents now, {balance + 1000} after that):

psql {psql_target} -c "SELECT user_id, balance_cents FROM user_balances WHERE user_id = '{DEMO_USER}'"
{rule}
"""


def stop_gunicorn(server):
    if server.proc and server.proc.poll() is None:
        log(f"stopping gunicorn (pid {server.proc.pid})")
        server.stop()


def stop_redis(redis):
    if redis.proc:
        log(f"stopping redis-server (pid {redis.proc.pid})")
        redis.stop()


def stop_stray_children():
    """A signal that lands inside Popen() loses the new child's pid, but it is still our child."""
    for pid in children(os.getpid()):
        log(f"stopping pid {pid}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)


def stop_postgres(pg):
    # pg_ctl starts it in its own session, out of reach of Ctrl-C.
    log("stopping PostgreSQL")
    pg.stop()


if __name__ == "__main__":
    sys.exit(main())
