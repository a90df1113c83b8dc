"""`make bench`: throughput and latency of the real stack, measured by wrk.

Starts a throwaway PostgreSQL and Redis on loopback and the app under gunicorn
with the production gunicorn.conf.py, replays pre-signed requests with wrk,
and prints one table. Then pgbench runs the seed's transaction at the same
concurrency, for the ratio the performance goal is stated in. After every run
the ledger's invariants are checked. BENCH_QUICK=1 shortens every run.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg

from app import verify
from app.db import apply_schema
from app.signature import sign
from devservers import Gunicorn, Postgres, Redis

ROOT = Path(__file__).resolve().parent.parent

QUICK = os.environ.get("BENCH_QUICK") == "1"
# BENCH_ONLY="new events" (a scenario name) measures one scenario, for comparing settings.
ONLY = os.environ.get("BENCH_ONLY")
DURATION = 3 if QUICK else 8  # seconds per wrk run
CONNECTIONS = [32] if QUICK else [8, 32, 64]
SECRET = "bench-secret"
USERS = [uuid.UUID(int=i + 1) for i in range(100)]
# Enough distinct new events that no run wraps around at 10k req/s.
NEW_EVENTS = 12_000 * DURATION
WRK_LUA = ROOT / "scripts" / "bench.lua"


def sh(*args, **kw):
    result = subprocess.run(args, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def ensure_wrk():
    if shutil.which("wrk"):
        return
    print("installing wrk (apt-get)...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


# -- requests ------------------------------------------------------------------

def event(event_id, n):
    user = USERS[n % len(USERS)]
    return {"id": event_id, "type": "payment.succeeded",
            "data": {"userId": str(user), "amountCents": 1 + n % 997, "currency": "usd",
                     "description": "bench payment"}}


def write_requests(path, events):
    """One line per request: signature TAB body; bench.lua replays them in order."""
    with open(path, "w") as f:
        for e in events:
            body = json.dumps(e, separators=(",", ":"))
            signature = sign("hmac-sha256", body.encode(), [SECRET.encode()])["X-Signature"]
            f.write(f"{signature}\t{body}\n")
    return path


class Scenario:
    def __init__(self, name, events):
        self.name, self.events = name, events


def scenarios(run_id, completed):
    new = [event(f"evt_{run_id}_new_{i}", i) for i in range(NEW_EVENTS)]
    mixed = []
    for i in range(NEW_EVENTS):
        mixed.append(event(f"evt_{run_id}_mix_{i}", i) if i % 2 else completed[i % len(completed)])
    burst = [event(f"evt_{run_id}_burst_{i}", i) for i in range(NEW_EVENTS // 50) for _ in range(50)]
    return [Scenario("new events", new), Scenario("100% re-deliveries", completed),
            Scenario("50/50 mix", mixed), Scenario("bursts of 50 copies", burst)]


# -- measuring -----------------------------------------------------------------

def cpu_ms(pids):
    """User+system CPU milliseconds used so far by pids (and their dead children)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total * 1000 / tick


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def peak_rss_mb(pids):
    peaks = []
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        peaks.append(int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)
    return peaks


def run_wrk(base, requests_file, connections):
    threads = min(2, connections)
    out = sh("wrk", "-t", str(threads), "-c", str(connections), "-d", f"{DURATION}s", "--timeout", "10s",
             "-s", str(WRK_LUA), f"{base}/api/webhooks",
             env={**os.environ, "BENCH_REQUESTS": str(requests_file), "BENCH_THREADS": str(threads)})
    result = json.loads(out[out.index("BENCH_JSON ") + len("BENCH_JSON "):].splitlines()[0])
    return result


def pgbench(pg, dbname, script, clients):
    out = sh("pgbench", "-n", "-h", pg.host, "-p", str(pg.port), "-U", pg.user, "-c", str(clients),
             "-j", "2", "-T", str(DURATION), "-M", "simple", "-f", str(script), dbname)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


# Seed 000's schema and transaction, in a database of their own: the peer
# the performance goal is measured against.
SEED_SCHEMA = """
CREATE TABLE webhook_events (
    id SERIAL PRIMARY KEY,
    event_id VARCHAR(128) NOT NULL UNIQUE,
    event_type VARCHAR(64) NOT NULL,
    status VARCHAR(32) NOT NULL DEFAULT 'processing',
    payload JSONB NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE user_balances (user_id UUID PRIMARY KEY, balance_cents BIGINT NOT NULL DEFAULT 0);
"""
EVENT_ID = "'pgb_' || :client_id || '_' || :n"
USER_ID = "('00000000-0000-0000-0000-' || lpad(to_hex(:u), 12, '0'))::uuid"
PAYLOAD = """'{"userId": "x", "amountCents": 7}'"""
SEED_TX = f"""\\set n random(1, 1000000000000)
\\set u random(1, 100)
BEGIN;
INSERT INTO webhook_events (event_id, event_type, payload, status)
  VALUES ({EVENT_ID}, 'payment.succeeded', {PAYLOAD}, 'processing')
  ON CONFLICT (event_id) DO NOTHING RETURNING id;
UPDATE user_balances SET balance_cents = balance_cents + 7 WHERE user_id = {USER_ID};
UPDATE webhook_events SET status = 'completed' WHERE event_id = {EVENT_ID};
COMMIT;
"""


def inline(sql, *positional, **named):
    """sql with its %s / %(name)s placeholders replaced by pgbench expressions."""
    for value in positional:
        sql = sql.replace("%s", value, 1)
    for name, value in named.items():
        sql = sql.replace(f"%({name})s", value)
    return " ".join(sql.split()) + ";"


def app_tx():
    """The statements app/ledger.py runs for one new payment event, in order."""
    from app import ledger

    row_id = f"(SELECT id FROM webhook_events WHERE event_id = {EVENT_ID})"
    sha = f"sha256(convert_to({EVENT_ID}, 'UTF8'))"
    statements = [
        inline(ledger.INSERT_EVENT, EVENT_ID, "'payment.succeeded'", PAYLOAD, sha),
        inline(ledger.CREDIT, amount="7", max=str(2**63 - 1), user_id=USER_ID, event_id=EVENT_ID),
        inline(ledger.MARK_COMPLETED, row_id),
    ]
    return "\n".join(["\\set n random(1, 1000000000000)", "\\set u random(1, 100)", "BEGIN;",
                      *statements, "COMMIT;", ""])


def check_invariants(conn):
    """`flask ledger verify`'s checks, and balances recomputed from the payloads alone."""
    problems, _ = verify.check(conn)
    if problems:
        raise SystemExit("INVARIANT BROKEN:\n" + "\n".join(problems[:20]))
    dupes = conn.execute("SELECT count(*) FROM (SELECT event_id FROM webhook_events "
                         "GROUP BY event_id HAVING count(*) > 1) d").fetchone()[0]
    wrong = conn.execute("""
        SELECT count(*) FROM user_balances b LEFT JOIN (
            SELECT (payload->'data'->>'userId')::uuid AS user_id,
                   sum((payload->'data'->>'amountCents')::bigint) AS credits
            FROM webhook_events
            WHERE status = 'completed' AND event_type = 'payment.succeeded' AND event_id LIKE 'evt_%'
            GROUP BY 1) c USING (user_id)
        WHERE b.balance_cents <> coalesce(c.credits, 0)""").fetchone()[0]
    stuck = conn.execute("SELECT count(*) FROM webhook_events WHERE status <> 'completed'").fetchone()[0]
    if dupes or wrong or stuck:
        raise SystemExit(f"INVARIANT BROKEN: {dupes} duplicated ids, {wrong} wrong balances, {stuck} not completed")
    return "ok"


def main():
    ensure_wrk()
    work = Path(tempfile.mkdtemp(prefix="webhook-ledger-bench-"))
    pg_dir = tempfile.mkdtemp(prefix="webhook-ledger-bench-pg-")  # its own 0700 folder, owned by postgres
    pg = Postgres(pg_dir).init().start()
    redis = Redis().start()
    server = None
    try:
        for dbname in ("bench", "seed"):
            sh("createdb", "-h", pg.host, "-p", str(pg.port), "-U", pg.user, dbname)
        with psycopg.connect(pg.url("seed"), autocommit=True) as seed:
            seed.execute(SEED_SCHEMA)
            for user in USERS:
                seed.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])
        conn = psycopg.connect(pg.url("bench"), autocommit=True)
        apply_schema(conn)
        for user in USERS:
            conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])

        env = {"DATABASE_URL": pg.url("bench"), "REDIS_URL": redis.url, "WEBHOOK_SECRET": SECRET}
        workers = int(os.environ.get("WEB_CONCURRENCY", os.cpu_count()))
        threads = int(os.environ.get("GUNICORN_THREADS", "4"))
        server = Gunicorn(env, workers=workers, threads=threads, log_path=work / "gunicorn.log")
        server.start()
        worker_pids = children(server.proc.pid)
        pg_pids = [int(Path(pg.data / "postmaster.pid").read_text().split()[0])]

        # Completed events to re-deliver: processed once, before any timing.
        completed = [event(f"evt_done_{i}", i) for i in range(2000)]
        warm = write_requests(work / "warm.tsv", completed)
        run_wrk(server.base, warm, 8)

        rows = []
        for connections in CONNECTIONS:
            for scenario in scenarios(f"c{connections}", completed):
                if ONLY and scenario.name != ONLY:
                    continue
                requests = write_requests(work / "req.tsv", scenario.events)
                before = [cpu_ms([server.proc.pid] + worker_pids), cpu_ms(pg_pids + children(pg_pids[0])),
                          cpu_ms([redis.proc.pid])]
                result = run_wrk(server.base, requests, connections)
                after = [cpu_ms([server.proc.pid] + worker_pids), cpu_ms(pg_pids + children(pg_pids[0])),
                         cpu_ms([redis.proc.pid])]
                n = max(result["requests"], 1)
                result.update(connections=connections, scenario=scenario.name,
                              cpu=[(a - b) / n for a, b in zip(after, before, strict=False)],
                              invariants=check_invariants(conn),
                              # Re-deliveries repeat by design; for the others, a wrap would repeat an event.
                              wrapped=(scenario.name != "100% re-deliveries"
                                       and result["requests"] > len(scenario.events)))
                rows.append(result)
                print(f"  done: {scenario.name} c={connections}: {result['rps']:.0f} req/s",
                      file=sys.stderr, flush=True)

        rss = peak_rss_mb(worker_pids)
        if ONLY:
            return report(rows, rss, {}, workers, threads)
        seed_script, app_script = work / "seed.sql", work / "app.sql"
        seed_script.write_text(SEED_TX)
        app_script.write_text(app_tx())
        pgb = {c: (pgbench(pg, "seed", seed_script, c), pgbench(pg, "bench", app_script, c)) for c in CONNECTIONS}
        report(rows, rss, pgb, workers, threads)
    finally:
        if server:
            server.stop()
        redis.stop()
        pg.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pg_dir, ignore_errors=True)


def report(rows, rss, pgb, workers, threads):
    print(f"\nwebhook-ledger bench: gunicorn {workers} workers x {threads} threads, {os.cpu_count()} cores, "
          f"{DURATION}s per run{' (BENCH_QUICK)' if QUICK else ''}\n")
    print("| scenario | conns | req/s | p50 ms | p90 ms | p99 ms | non-2xx | errors "
          "| CPU ms/req app / pg / redis | invariants |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu = " / ".join(f"{x:.2f}" for x in r["cpu"])
        wrapped = " (requests wrapped)" if r["wrapped"] else ""
        print(f"| {r['scenario']}{wrapped} | {r['connections']} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p90']:.1f} "
              f"| {r['p99']:.1f} | {r['non2xx']} | {r['errors']} | {cpu} | {r['invariants']} |")
    print(f"\npeak RSS per worker: {', '.join(f'{x:.1f} MB' for x in rss)}")
    print("\n| conns | pgbench seed tx/s | app new events req/s | ratio | pgbench app SQL tx/s | duplicates / new |")
    print("|---|---|---|---|---|---|")
    for c, (seed_tps, app_tps) in pgb.items():
        new = next(r["rps"] for r in rows if r["connections"] == c and r["scenario"] == "new events")
        dup = next(r["rps"] for r in rows if r["connections"] == c and r["scenario"] == "100% re-deliveries")
        print(f"| {c} | {seed_tps:.0f} | {new:.0f} | {new / seed_tps:.2f} | {app_tps:.0f} | {dup / new:.2f} |")


if __name__ == "__main__":
    main()
