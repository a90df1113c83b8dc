"""The peer receiver that `make bench` measures beside the project: by default
the Node prototype in BENCH_PEER_DIR (../shared/peer) when it is there (copied to
.run/bench-peer, where `npm ci` runs), or any BENCH_PEER_CMD with its
BENCH_PEER_SCHEMA; BENCH_PEER=off: none. It gets its own database on the
bench's PostgreSQL and its own Redis database number."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from . import ROOT, answers_tcp, free_port, stop_group, wait_until

PEER_DIR = Path(os.environ.get("BENCH_PEER_DIR") or ROOT.parent / "shared" / "peer")
PEER_COPY = ROOT / ".run" / "bench-peer"  # PEER_DIR is read-only: npm ci runs in this copy
DB_NAME = "peer"


def _off():
    return os.environ.get("BENCH_PEER", "").lower() in ("off", "0", "false", "no")


def runs_node():
    """Whether the peer is PEER_DIR's, which needs node and npm."""
    return not _off() and not os.environ.get("BENCH_PEER_CMD") and (PEER_DIR / "app.mjs").exists()


def command():
    """(command, schema file, None), or (None, None, why not) when no peer can run."""
    if _off():
        return None, None, "BENCH_PEER=off"
    if os.environ.get("BENCH_PEER_CMD"):
        schema = os.environ.get("BENCH_PEER_SCHEMA")
        if not schema:
            return None, None, "BENCH_PEER_CMD is set but BENCH_PEER_SCHEMA (the peer's schema file) is not"
        return shlex.split(os.environ["BENCH_PEER_CMD"]), Path(schema).resolve(), None
    if not (PEER_DIR / "app.mjs").exists():
        return None, None, f"no peer: BENCH_PEER_CMD is not set and {PEER_DIR} does not exist"
    try:
        _copy_with_modules()
    except (OSError, RuntimeError) as exc:
        return None, None, f"no peer: could not set up node and {PEER_DIR} ({str(exc).strip()[:200]})"
    return ["node", str(PEER_COPY / "app.mjs")], PEER_COPY / "schema.sql", None


def _copy_with_modules():
    """PEER_DIR's files in PEER_COPY, with node_modules from `npm ci` unless its lock file is unchanged."""
    lock = (PEER_DIR / "package-lock.json").read_bytes()
    fresh = (PEER_COPY / "node_modules").is_dir() and (PEER_COPY / "package-lock.json").read_bytes() == lock
    if not fresh:
        shutil.rmtree(PEER_COPY, ignore_errors=True)
    PEER_COPY.mkdir(parents=True, exist_ok=True)
    for f in PEER_DIR.iterdir():
        if f.is_file():
            shutil.copyfile(f, PEER_COPY / f.name)
    if not fresh:
        sys.stderr.write(f"npm ci in {PEER_COPY}...\n")
        _sh("npm", "ci", "--no-audit", "--no-fund", cwd=PEER_COPY)


def _sh(*args, **kw):
    done = subprocess.run(args, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


class Peer:
    """command on a free loopback port, its schema loaded into its own
    database on pg, users given a zero balance, Redis database 1 of redis
    (its lock keys are named as the project's), signed with secret."""

    def __init__(self, command, schema, pg, redis, secret, users, pool_max, log_path):
        self.command, self.schema, self.pg, self.users = command, schema, pg, users
        self.port = free_port()
        self.log_path = log_path
        self.env = {**os.environ, "DATABASE_URL": pg.url(DB_NAME), "REDIS_URL": redis.url.rsplit("/", 1)[0] + "/1",
                    "WEBHOOK_SECRET": secret, "PORT": str(self.port), "HOST": "127.0.0.1",
                    "PG_POOL_MAX": str(pool_max)}
        self.proc = self.conn = None

    def start(self):
        url = self.pg.createdb(DB_NAME)
        # The peer's schema drops and recreates its tables: psql, for its VACUUM outside a transaction.
        _sh("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(self.schema), url)
        self.conn = psycopg.connect(url, autocommit=True)
        for user in self.users:
            self.conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)"
                              " ON CONFLICT DO NOTHING", [user])
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=open(self.log_path, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._listening, timeout=20, what="the peer")
        return self

    def _listening(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"the peer exited with {self.proc.returncode}: see {self.log_path}")
        return answers_tcp(self.port)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        stop_group(self.proc, 10)
