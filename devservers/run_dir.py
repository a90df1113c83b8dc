"""`make run`'s own PostgreSQL and redis-server, under .run/ in the checkout
(MAKE_RUN_DIR moves it: the tests give each run a folder of its own): one
`make run` per folder at a time, the PostgreSQL cluster kept between runs,
and what a killed run left running stopped first."""

import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from . import ROOT, Postgres, Redis
from .supervise import Failed

# Everything make run keeps: its cluster (pg/), Redis's files, env (the settings for `. .run/env`), metrics/.
RUN_DIR = Path(os.environ.get("MAKE_RUN_DIR") or ROOT / ".run")
DB_NAME = "webhook_ledger"  # the usd ledger's; another LEDGER_CURRENCY's is DB_NAME_<currency>
# A Unix socket's path is limited to ~107 bytes: a deep checkout's goes to /tmp.
MAX_SOCKET_DIR = 80


def start_servers(cleanup, log):
    """Start PostgreSQL and redis-server under .run/; export DATABASE_URL and REDIS_URL."""
    if not shutil.which("redis-server"):
        raise Failed("redis-server not found (install redis, or set DATABASE_URL and REDIS_URL)")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    _lock_run_dir(cleanup)
    _stop_leftover_redis(log)
    try:
        pg = Postgres(*_pg_dirs(cleanup, log))
    except RuntimeError as exc:
        raise Failed(f"{exc}; or set DATABASE_URL and REDIS_URL") from None
    if pg.running():
        log("stopping a PostgreSQL left over from an earlier run")
        pg.stop()
    reused = (pg.data / "PG_VERSION").exists()
    log(f"{'reusing' if reused else 'creating'} the PostgreSQL cluster in {pg.data}")
    cleanup.callback(_stop_postgres, pg, log)  # before start: an interrupted start is stopped too
    try:
        pg.init(reuse=True)
        log(f"starting PostgreSQL on 127.0.0.1:{pg.port}")
        pg.start()
    except subprocess.CalledProcessError as exc:
        log_file = pg.dir / "log"
        tail = log_file.read_text(errors="replace").splitlines()[-15:] if log_file.exists() else []
        raise Failed("\n".join([exc.stderr.decode(errors="replace").strip(), *tail,
                                f"PostgreSQL did not start (log: {log_file})"])) from None
    currency = (os.environ.get("LEDGER_CURRENCY") or "usd").strip().lower()  # as parsers.currency reads it
    name = database_name(currency)
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f"CREATE DATABASE {name}")
    except psycopg.Error as exc:
        raise Failed(f"creating the database {name}: {exc}") from None
    log(f"the ledger in {currency}: database {name}")
    os.environ["DATABASE_URL"] = pg.url(name)

    redis = Redis(workdir=RUN_DIR, new_session=True)
    log(f"starting redis-server on 127.0.0.1:{redis.port}")
    cleanup.callback(_stop_redis, redis, log)
    try:
        redis.start()
    except TimeoutError:
        raise Failed(f"redis-server did not come up (log: {RUN_DIR / 'redis.log'})") from None
    os.environ["REDIS_URL"] = redis.url


def database_name(currency):
    """make run's database for a ledger in currency: one per currency, since a ledger holds one (docs/operations.md),
    so that a page of the docs in rupees starts its own ledger and leaves the reader's in dollars as it was."""
    return DB_NAME if currency == "usd" else f"{DB_NAME}_{currency}"


def _lock_run_dir(cleanup):
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


def _stop_leftover_redis(log):
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


def _pg_dirs(cleanup, log):
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
            base = _temp_dir(cleanup, "pg")
            log(f"the postgres user cannot reach {RUN_DIR}; the throwaway cluster is in {base} instead")
    socket_dir = base if len(str(base)) <= MAX_SOCKET_DIR else _temp_dir(cleanup, "sock")
    return base, socket_dir


def _temp_dir(cleanup, kind):
    path = Path(tempfile.mkdtemp(prefix=f"webhook-ledger-run-{kind}."))
    cleanup.callback(shutil.rmtree, path, ignore_errors=True)
    return path


def _stop_redis(redis, log):
    if redis.proc:
        log(f"stopping redis-server (pid {redis.proc.pid})")
        redis.stop()


def _stop_postgres(pg, log):
    # pg_ctl starts it in its own session, out of reach of Ctrl-C.
    log("stopping PostgreSQL")
    pg.stop()
