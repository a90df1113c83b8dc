"""The operator's commands on a table of 1,000,000 stored events (docs/performance.md).

Starts a throwaway PostgreSQL and Redis, makes a database as `flask init-db`
does, stores MILLION_EVENTS events over 40 days in it,
then prints how long each of these takes, with the longest wait of a writer
that inserts an event every 10 ms throughout (what a delivery would wait),
beside `flask routes`, which starts the app and reads nothing (the start-up
that every command's time includes):
- `flask init-db` on the full table (no migration to apply: its checks);
- `flask events list`, newest first, and with --since an hour ago;
- `flask events purge` of the events older than 35 days (an eighth of them);
and the table's size before and after. `python scripts/million.py`; about
two minutes. MILLION_EVENTS (default 1000000).
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.store.db import apply_schema
from devservers import ROOT, Postgres, Redis

EVENTS = int(os.environ.get("MILLION_EVENTS", "1000000"))
USER = "00000000-0000-4000-8000-000000000001"

# Events of the service's own shape, one every 40 days / EVENTS.
FILL = """
    INSERT INTO webhook_events (source, event_id, event_type, body, payload_sha256, effect_sha256, status,
                                created_at, completed_at)
    SELECT 'default', 'evt_fill_' || n, 'payment.succeeded', b, sha256(b), sha256(b), 'completed', t, t
    FROM generate_series(%(first)s, %(last)s) n,
         LATERAL (SELECT convert_to(format('{"id":"evt_fill_%%s","type":"payment.succeeded","data":{"userId":"%%s",'
                                           '"amountCents":%%s,"currency":"usd","description":"bench payment"}}',
                                           n, %(user)s::text, 1 + n %% 997), 'UTF8') AS b,
                         now() - make_interval(secs => (%(events)s - n) * 3456000.0 / %(events)s) AS t) v
"""


class Writer(threading.Thread):
    """Inserts one event every 10 ms; the longest an insert waited, while running."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.waits, self.stop = url, [], threading.Event()

    def run(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            n = 0
            while not self.stop.is_set():
                started = time.monotonic()
                conn.execute("INSERT INTO webhook_events (event_id, event_type, body, payload_sha256, status)"
                             " VALUES (%s, 'ping', '{}', sha256('{}'), 'completed')", [f"evt_writer_{time.time_ns()}"])
                self.waits.append(time.monotonic() - started)
                n += 1
                time.sleep(0.01)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()


def timed(env, *args):
    """`flask ARGS` in its own process, with a writer beside it: (seconds, its output, the writer's longest wait)."""
    with Writer(env["DATABASE_URL"]) as writer:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "flask", "--app", "app", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout
        seconds = time.monotonic() - started
    return seconds, out, max(writer.waits), statistics.median(writer.waits)


def size(conn):
    return conn.execute("SELECT pg_size_pretty(pg_total_relation_size('webhook_events'))").fetchone()[0]


def main():
    pg_dir = tempfile.mkdtemp(prefix="webhook-ledger-million-pg-")
    pg = Postgres(pg_dir).init().start()
    redis = Redis().start()
    try:
        url = pg.createdb("million")
        conn = psycopg.connect(url, autocommit=True)
        apply_schema(conn)
        conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [USER])
        started = time.monotonic()
        step = 100_000
        for first in range(1, EVENTS + 1, step):
            conn.execute(FILL, {"first": first, "last": min(first + step - 1, EVENTS), "events": EVENTS, "user": USER})
        conn.execute("VACUUM ANALYZE webhook_events")
        print(f"stored {EVENTS:,} events over 40 days in {time.monotonic() - started:.0f} s; "
              f"webhook_events {size(conn)}")

        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis.url, "WEBHOOK_SECRET": "million-secret-0123456789"}
        print("\n| command | seconds | a writer's longest wait, ms | its median, ms |")
        print("|---|---|---|---|")
        an_hour_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3600))
        commands = [["routes"], ["init-db"], ["events", "list"], ["events", "list", "--since", an_hour_ago],
                    ["events", "purge"]]
        for args in commands:
            seconds, out, longest, median = timed(env, *args)
            print(f"| flask {' '.join(args)} | {seconds:.2f} | {longest * 1000:.1f} | {median * 1000:.1f} |")
            if args[0] in ("init-db", "purge") or args[-1] == "purge":
                print(f"|   {out.strip().splitlines()[-1][:100]} | | | |")
        print(f"\nwebhook_events after the purge: {size(conn)} (space that VACUUM lets new rows reuse)")
        conn.close()
    finally:
        redis.stop()
        pg.stop("immediate")
        shutil.rmtree(pg_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
