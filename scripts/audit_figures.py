"""`flask audit` over AUDIT_TRANSACTIONS (default 100,000) Stripe balance transactions (docs/performance.md). Starts a
throwaway PostgreSQL and Redis and Stripe's stand-in (devservers/stripe_stand_in.py, in a process of its own,
serving List all balance transactions), fills the ledger with the matching payments, refunds and disputes (straight
into the tables, as scripts/million.py fills its events: the audit only reads them), then runs `flask audit default`
as an operator would and prints its wall time, the peak memory (max RSS) of its process, the requests per second it
made, and the most requests Stripe's stand-in (its rate limiter on) saw in any second against the account's budget
(WEBHOOK_API_RATE, _TOTAL: their defaults unless set), which every request spends. The stand-in holds 90% charges,
7% refunds, 1% disputes and 2% non-user transactions over the last 10 days. `python scripts/audit_figures.py`.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.store.db import apply_schema
from devservers import ROOT, Postgres, Redis, wait_until
from devservers.background import wait_for_signal
from devservers.stripe_balance import charge, dispute, refund, transaction
from devservers.stripe_stand_in import API_KEY, StripeStandIn

TRANSACTIONS = int(os.environ.get("AUDIT_TRANSACTIONS", "100000"))
# The account's budget the audit spends: WEBHOOK_API_RATE's and _TOTAL's defaults unless given (docs/configuration.md).
RATE = int(os.environ.get("WEBHOOK_API_RATE", "10"))
RATE_TOTAL = int(os.environ.get("WEBHOOK_API_RATE_TOTAL", "20"))
USER = "00000000-0000-4000-8000-000000000001"
SPAN = 10 * 86400  # the transactions' window, seconds


def objects(now, count):
    """(balance transaction, ledger row) pairs, oldest first: ledger row is None for non-user money."""
    for n in range(count):
        created = now - SPAN + n * (SPAN - 7200) // count
        pi, cents, kind = f"pi_{n // 10:07d}", 1000 + n % 97, n % 100
        if kind < 90 or n < 10:
            pi = f"pi_{n:07d}"
            yield transaction(f"txn_{n:07d}", created, "charge", "charge", cents, charge(pi, cents, user=USER),
                              fee=30), ("payment", pi, cents, created)
        elif kind < 97:
            paid = f"pi_{n - n % 100:07d}"
            re_id = f"re_{n:07d}"
            yield transaction(f"txn_{n:07d}", created, "refund", "refund", -100, refund(re_id, paid, 100)), \
                ("refund", re_id, paid, created)
        elif kind < 98:
            paid = f"pi_{n - n % 100 + 1:07d}"
            du_id = f"du_{n:07d}"
            yield transaction(f"txn_{n:07d}", created, "adjustment", "dispute", -200, dispute(du_id, paid, 200),
                              fee=1500), ("dispute", du_id, paid, created)
        else:
            yield transaction(f"txn_{n:07d}", created, "stripe_fee", "fee", -50, None), None


def serve(port, now, count):
    """The stand-in, holding the transactions, with Stripe's rate limiter on, until SIGTERM; then what the limiter
    saw, as one JSON line: the peak requests in any second (per endpoint and in all) and the 429s it answered."""
    stand_in = StripeStandIn()
    stand_in.limiter = True  # Stripe's 25 per endpoint and 100 in all per sliding second (https://docs.stripe.com/rate-limits)
    stand_in.balance.add(*(txn for txn, _ in objects(now, count)))
    from http.server import ThreadingHTTPServer

    from devservers.stripe_stand_in import _handler

    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(stand_in))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)  # noqa: T201
    wait_for_signal()
    server.shutdown()
    print(json.dumps({"peak": max(stand_in.peaks.values(), default=0), "peak_total": stand_in.peak_total,  # noqa: T201
                      "limited": stand_in.limited, "requests": len(stand_in.requests)}), flush=True)


def fill(conn, now, count):
    """The ledger's side of every transaction, as deliveries would have left it."""
    conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [USER])
    payments, movements = [], []
    for _, row in objects(now, count):
        if row is None:
            continue
        if row[0] == "payment":
            payments.append((row[1], row[2], row[3] + 5))
        else:
            movements.append((row[0], row[1], row[2], 100 if row[0] == "refund" else 200, row[3] + 5))
    with conn.cursor() as cur:
        with cur.copy("COPY payments (source, payment_id, user_id, amount_cents, currency, event_id, created_at)"
                      " FROM STDIN") as copy:
            for pi, cents, at in payments:
                copy.write_row(("default", pi, USER, cents, "usd", f"evt_{pi}", _ts(at)))
        with cur.copy("COPY movements (source, kind, movement_id, payment_id, amount_cents, state, event_id,"
                      " created_at) FROM STDIN") as copy:
            for kind, key, paid, cents, at in movements:
                copy.write_row(("default", kind, key, paid, cents, "applied", f"evt_{key}", _ts(at)))
    conn.execute("ANALYZE")
    return len(payments), len(movements)


def _ts(seconds):
    return time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(seconds))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]), TRANSACTIONS)
        return
    from devservers import free_port

    now = int(time.time())
    pg_dir = tempfile.mkdtemp(prefix="audit-figures-pg-")
    pg = Postgres(pg_dir).init().start()
    redis = Redis().start()
    port = free_port()
    stand_in = subprocess.Popen([sys.executable, __file__, "serve", str(port), str(now)], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        url = pg.createdb("audit")
        with psycopg.connect(url, autocommit=True) as conn:
            apply_schema(conn)
            counted = fill(conn, now, TRANSACTIONS)
        assert stand_in.stdout is not None
        wait_until(lambda: stand_in.stdout.readline().strip() == "ready", timeout=600, what="the stand-in")
        out = Path(pg_dir) / "run.json"
        env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis.url, "WEBHOOK_SECRET": "whsec_figures0123456789",
               "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": API_KEY,
               "STRIPE_API_BASE": f"http://127.0.0.1:{port}", "WEBHOOK_API_RATE": str(RATE),
               "WEBHOOK_API_RATE_TOTAL": str(RATE_TOTAL)}
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - SPAN - 60))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", "audit", "default", "--since", since,
                               "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        seconds = time.monotonic() - started
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        stand_in.terminate()
        seen = json.loads(stand_in.communicate(timeout=60)[0].strip().splitlines()[-1])
        header = json.loads(out.read_text())["header"]
        pages = -(-header["listed"] // 100)
        print(f"ledger: {counted[0]} payments, {counted[1]} refunds and disputes")  # noqa: T201
        print(f"flask audit: exit {done.returncode}, verdict {header['verdict']}, {header['listed']} balance "  # noqa: T201
              f"transactions listed, objects {header['objects']}")
        print(f"time {seconds:.1f} s, peak memory (max RSS) {peak_mb:.0f} MB, {pages} requests, "  # noqa: T201
              f"{pages / seconds:.1f} requests/s")
        # The audit spends the account's budget (WEBHOOK_API_RATE per endpoint, _TOTAL in all, a second): the most
        # requests Stripe's stand-in saw in any one second, against it and against Stripe's own limiter.
        print(f"Stripe saw {seen['requests']} requests, at most {seen['peak']} in any second to one endpoint and "  # noqa: T201
              f"{seen['peak_total']} in all (budget: {RATE}/s per endpoint, {RATE_TOTAL}/s in all; Stripe's limit "
              f"25 and 100), {seen['limited']} answered 429")
        if done.returncode not in (0, 1, 2):
            print(done.stdout[-2000:], done.stderr[-2000:])  # noqa: T201
    finally:
        stand_in.kill()
        redis.stop()
        pg.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
