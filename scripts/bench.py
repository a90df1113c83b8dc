"""`make bench`: throughput, latency and CPU per delivery of the real stack,
side by side with a peer receiver under the same load.

Starts a throwaway PostgreSQL and Redis on loopback, the app under gunicorn
with the production gunicorn.conf.py, and a peer receiver (devservers/peer.py)
with its own database on the same PostgreSQL and its own Redis database
number. wrk replays the same pre-signed requests to both, one receiver at a
time, and the bench prints both with the ratios project/peer. After every run
the ledgers' invariants are checked. It installs nothing: a missing program
stops it with one line naming the Debian packages to install.

For the new-event scenarios, with small bodies and with Stripe-sized ones, it
also prints what each new event cost the one PostgreSQL writer: WAL bytes
(pg_current_wal_lsn), table and index bytes stored, PostgreSQL CPU.

Then, project only, the fetch scenario: new Stripe deliveries to a gunicorn of its own that fetches
each event (WEBHOOK_FETCH=true) from devservers/stripe_stand_in.py's Retrieve an event, answering after
50 ms: deliveries per second beside the inline ceiling, workers x PROVIDER_SLOTS / 0.05 s, and the 202s of a
full slot, at the bench's connections and at one connection per slot.

Then, project only, the pace scenario: 2,000 Stripe thin events offered at 200/s to two gunicorn hosts, Stripe's
stand-in answering in 150 ms behind its rate limiter: the share answered 2xx at first delivery, the stand-in's 429s
and peak per-endpoint rate against the budget, provider requests per event, and the time from the last notification
to the last credit.

Then `flask reconcile` against devservers/stripe_stand_in.py (Stripe's List
Events on loopback) for windows of RECONCILE_EVENTS events: events applied
per second and the command's peak RSS, its listing alone (--dry-run) beside it.

BENCH_QUICK=1: 3 s runs. BENCH_ONLY="new events,100% re-deliveries": those scenarios (and /health);
BENCH_ONLY=fetch, BENCH_ONLY=pace, BENCH_ONLY=reconcile: that scenario alone.
BENCH_RECONCILE_EVENTS (default 10000,50000: the windows).
BENCH_PEER_CMD + BENCH_PEER_SCHEMA: another peer; BENCH_PEER=off: none.
BENCH_CONNECTIONS (default 32); BENCH_PEER_POOL_MAX (default: the connections).
BENCH_PYSPY=<file>: py-spy records one worker's GIL time during the project's
new-event run (or BENCH_PYSPY_SCENARIO's), as collapsed stacks (`pip install
py-spy`; speedscope opens them).
"""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# devservers (the throwaway servers) is test tooling, not installed with the
# app: the scripts import it from the checkout they belong to.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.intake.signature import sign
from app.store import verify
from app.store.db import apply_schema
from devservers import ROOT, Gunicorn, Postgres, Redis, children, descendants, peer, pg_bindir
from devservers.packages import BENCH, how_to_install, missing, program

QUICK = os.environ.get("BENCH_QUICK") == "1"
ONLY = [name.strip() for name in os.environ.get("BENCH_ONLY", "").split(",") if name.strip()]
DURATION = 3 if QUICK else 8  # seconds per wrk run
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
WRK_THREADS = 2
SECRET = "bench-secret-0123456789"
# The peer's schema.sql creates users md5('user-<n>'); both ledgers get these 100.
USERS = [uuid.UUID(hashlib.md5(f"user-{n}".encode()).hexdigest()) for n in range(1, 101)]
# Enough distinct new events that no run wraps around at 12k req/s.
NEW_EVENTS = 12_000 * DURATION
WRK_LUA = ROOT / "scripts" / "bench.lua"
STRIPE_SIZED = "new events of Stripe-sized bodies"

# The goals of docs/performance.md, in the order printed: (what, measured key, comparison, bound).
GOALS = [
    ("new events req/s, project/peer", "new_rps", ">=", 0.75),
    ("new events p99, project/peer", "new_p99", "<=", 1.5),
    ("50% re-deliveries req/s, project/peer", "mix_rps", ">=", 1.0),
    ("100% re-deliveries req/s, project/peer", "dup_rps", ">=", 1.5),
    ("app CPU per new event / per GET /health", "new_health", "<=", 2.5),
    ("app CPU per re-delivery / per GET /health", "dup_health", "<=", 1.3),
    ("open loop p99, project/peer", "open_p99", "<=", 1.5),
    ("peak RSS per worker, MB", "rss", "<=", 80),
    # What each new event costs the one PostgreSQL writer (issue 24), project/peer.
    ("WAL bytes per new event, Stripe-sized, project/peer", "big_wal", "<=", 1.5),
    ("table+index bytes per event, Stripe-sized, project/peer", "big_stored", "<=", 1.5),
    ("PG CPU per new event, Stripe-sized, project/peer", "big_pg_cpu", "<=", 1.0),
    ("WAL bytes per new event, small, project/peer", "small_wal", "<=", 2.5),
    ("table+index bytes per event, small, project/peer", "small_stored", "<=", 2.5),
    ("PG CPU per new event, small, project/peer", "small_pg_cpu", "<=", 1.0),
]


def sh(*args, **kw):
    result = subprocess.run(args, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def check_programs():
    """Stop, naming the Debian packages to install, when a program the bench runs is missing."""
    needed = missing(BENCH if peer.runs_node() else {"wrk": BENCH["wrk"]})
    if needed:
        no_peer = "; or BENCH_PEER=off, without the peer" if {BENCH["node"], BENCH["npm"]} & set(needed) else ""
        raise SystemExit(f"bench: missing Debian packages: {how_to_install(needed)}{no_peer}")


# -- requests ------------------------------------------------------------------

def event(event_id, n, stripe_sized=False):
    """A payment.succeeded in the service's own shape, which both receivers take.

    stripe_sized: its data also carries the PaymentIntent and its Charge, as a
    real Stripe event's data.object does (about 4.5 kB in all), which both
    receivers store and neither reads.
    """
    user = USERS[n % len(USERS)]
    data = {"userId": str(user), "amountCents": 1 + n % 997, "currency": "usd", "description": "bench payment"}
    if not stripe_sized:
        return {"id": event_id, "type": "payment.succeeded", "data": data}
    data["object"] = payment_intent(event_id, data["amountCents"], user)
    return {"id": event_id, "object": "event", "api_version": "2025-03-31.basil", "created": 1_764_000_000 + n,
            "type": "payment.succeeded", "data": data, "livemode": True, "pending_webhooks": 1,
            "request": {"id": f"req_{event_id[-14:]}", "idempotency_key": str(uuid.UUID(int=n))}}


def payment_intent(tag, cents, user):
    """A succeeded PaymentIntent with its latest Charge expanded, with the fields and nesting that
    Stripe's API reference shows (https://docs.stripe.com/api/payment_intents/object,
    https://docs.stripe.com/api/charges/object); ids and numbers vary per event, as in real ones."""
    digest = hashlib.sha256(tag.encode()).hexdigest()
    pi, ch, pm = f"pi_3{digest[:23]}", f"ch_3{digest[23:46]}", f"pm_1{digest[40:63]}"
    created = 1_764_000_000 + cents
    address = {"city": None, "country": "US", "line1": None, "line2": None, "postal_code": "94107", "state": None}
    card = {"brand": "visa", "checks": {"address_line1_check": None, "address_postal_code_check": "pass",
                                        "cvc_check": "pass"},
            "country": "US", "exp_month": 12, "exp_year": 2034, "fingerprint": digest[:16], "funding": "credit",
            "installments": None, "last4": "4242", "mandate": None, "network": "visa",
            "network_token": {"used": False}, "three_d_secure": None, "wallet": None,
            "amount_authorized": cents, "authorization_code": digest[50:56], "capture_before": created + 604800,
            "extended_authorization": {"status": "disabled"},
            "incremental_authorization": {"status": "unavailable"}, "multicapture": {"status": "unavailable"},
            "network_transaction_id": digest[30:45], "overcapture": {"maximum_amount_capturable": cents,
                                                                      "status": "unavailable"},
            "regulated_status": "unregulated"}
    charge = {"id": ch, "object": "charge", "amount": cents, "amount_captured": cents, "amount_refunded": 0,
              "application": None, "application_fee": None, "application_fee_amount": None,
              "balance_transaction": f"txn_3{digest[8:31]}",
              "billing_details": {"address": address, "email": "jenny.rosen@example.com", "name": "Jenny Rosen",
                                  "phone": None},
              "calculated_statement_descriptor": "WEBHOOK LEDGER", "captured": True, "created": created,
              "currency": "usd", "customer": f"cus_{digest[:14]}", "description": "bench payment", "disputed": False,
              "failure_balance_transaction": None, "failure_code": None, "failure_message": None,
              "fraud_details": {}, "livemode": True, "metadata": {"user_id": str(user)},
              "on_behalf_of": None,
              "outcome": {"network_status": "approved_by_network", "reason": None, "risk_level": "normal",
                          "risk_score": 32, "seller_message": "Payment complete.", "type": "authorized"},
              "paid": True, "payment_intent": pi, "payment_method": pm,
              "presentment_details": None, "radar_options": {},
              "refunds": {"object": "list", "data": [], "has_more": False, "total_count": 0,
                          "url": f"/v1/charges/{ch}/refunds"},
              "payment_method_details": {"card": card, "type": "card"},
              "receipt_email": "jenny.rosen@example.com", "receipt_number": None,
              "receipt_url": f"https://pay.stripe.com/receipts/payment/{digest}",
              "refunded": False, "review": None, "shipping": None, "source": None, "source_transfer": None,
              "statement_descriptor": None, "statement_descriptor_suffix": None, "status": "succeeded",
              "transfer_data": None, "transfer_group": None}
    return {"id": pi, "object": "payment_intent", "amount": cents, "amount_capturable": 0,
            "amount_details": {"tip": {}}, "amount_received": cents, "application": None,
            "application_fee_amount": None,
            "automatic_payment_methods": {"allow_redirects": "always", "enabled": True},
            "canceled_at": None, "cancellation_reason": None, "capture_method": "automatic_async",
            "client_secret": f"{pi}_secret_{digest[:25]}", "confirmation_method": "automatic", "created": created,
            "currency": "usd", "customer": f"cus_{digest[:14]}", "description": "bench payment",
            "last_payment_error": None, "latest_charge": charge, "livemode": True,
            "metadata": {"user_id": str(user), "order_id": f"order_{digest[:10]}"}, "next_action": None,
            "on_behalf_of": None, "payment_method": pm,
            "payment_method_configuration_details": {"id": f"pmc_1{digest[:23]}", "parent": None},
            "payment_method_options": {"card": {"installments": None, "mandate_options": None, "network": None,
                                                "request_three_d_secure": "automatic"},
                                       "link": {"persistent_token": None}},
            "payment_method_types": ["card", "link"], "processing": None, "receipt_email": "jenny.rosen@example.com",
            "review": None, "setup_future_usage": None, "shipping": None, "source": None,
            "statement_descriptor": None, "statement_descriptor_suffix": None, "status": "succeeded",
            "transfer_data": None, "transfer_group": None}


def write_requests(path, events):
    """One line per request: signature TAB body; bench.lua replays them in order."""
    with open(path, "w") as f:
        for e in events:
            body = json.dumps(e, separators=(",", ":"))
            signature = sign("hmac-sha256", body.encode(), [SECRET.encode()])["X-Signature"]
            f.write(f"{signature}\t{body}\n")
    return path


@dataclass
class Scenario:
    name: str
    events: list | None  # None: GET /health
    peer: bool = True  # measured on the peer too
    paced: bool = False  # at a fixed offered rate, not as fast as answered


def scenarios(completed):
    def new(tag):
        return [event(f"evt_{tag}_{i}", i) for i in range(NEW_EVENTS)]

    mixed = [event(f"evt_mix_{i}", i) if i % 2 else completed[i % len(completed)] for i in range(NEW_EVENTS)]
    burst = [event(f"evt_burst_{i}", i) for i in range(NEW_EVENTS // 50) for _ in range(50)]
    return [
        Scenario("new events", new("new")),
        Scenario(STRIPE_SIZED, [event(f"evt_big_{i}", i, stripe_sized=True) for i in range(NEW_EVENTS)]),
        Scenario("50% re-deliveries", mixed),
        Scenario("100% re-deliveries", completed),
        Scenario("GET /health", None, peer=False),
        Scenario("open loop: new events", new("open"), paced=True),
        # The peer answers an in-flight copy 200 (a defect); not comparable.
        Scenario("bursts of 50 copies", burst, peer=False),
    ]


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


def worker_class_name(printed):
    """The worker class as gunicorn's --print-config shows it, `<ThreadWorker()>` for the class object that
    gunicorn.conf.py loads from app/serving/gunicorn_worker.py, as a dotted name."""
    match = re.fullmatch(r"<(\w+)\(\)>", printed or "")
    if match and f"class {match[1]}(" in (ROOT / "app" / "serving" / "gunicorn_worker.py").read_text():
        return f"app.serving.gunicorn_worker.{match[1]}"
    return printed


def peak_rss_mb(pids):
    peaks = []
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        peaks.append(int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)
    return peaks


def run_wrk(url, requests_file=None, delay_ms=None, connections=CONNECTIONS, extra_env=None):
    """One wrk run of DURATION; extra_env: the fetch scenario's (its Stripe-Signature header)."""
    threads = min(WRK_THREADS, connections)
    env = {**os.environ, "BENCH_THREADS": str(threads),
           "BENCH_CONNECTIONS_PER_THREAD": str(connections // threads), **(extra_env or {})}
    env.pop("BENCH_REQUESTS", None)
    env.pop("BENCH_DELAY_MS", None)
    if requests_file:
        env["BENCH_REQUESTS"] = str(requests_file)
    if delay_ms:
        env["BENCH_DELAY_MS"] = str(round(delay_ms))
    out = sh(program("wrk"), "-t", str(threads), "-c", str(connections), "-d", f"{DURATION}s", "--timeout", "10s",
             "-s", str(WRK_LUA), url, env=env)
    return json.loads(out[out.index("BENCH_JSON ") + len("BENCH_JSON "):].splitlines()[0])


# -- the receivers ---------------------------------------------------------------

@dataclass
class Receiver:
    name: str
    base: str
    app_pids: callable  # every process whose CPU is the receiver's
    worker_pids: callable  # the processes whose peak RSS is reported
    conn: psycopg.Connection
    check: callable  # conn -> "ok", or raises SystemExit
    rows: dict = field(default_factory=dict)


def check_project(conn):
    """`flask ledger verify`'s checks, and balances recomputed from the payloads alone."""
    problems = verify.check(conn).problems
    if problems:
        raise SystemExit("INVARIANT BROKEN:\n" + "\n".join(problems[:20]))
    dupes = conn.execute("SELECT count(*) FROM (SELECT source, event_id FROM webhook_events "
                         "GROUP BY source, event_id HAVING count(*) > 1) d").fetchone()[0]
    wrong = conn.execute("""
        SELECT count(*) FROM user_balances b LEFT JOIN (
            SELECT (event_json(body)->'data'->>'userId')::uuid AS user_id,
                   sum((event_json(body)->'data'->>'amountCents')::bigint) AS credits
            FROM webhook_events
            WHERE status = 'completed' AND event_type = 'payment.succeeded' AND event_id LIKE 'evt_%'
            GROUP BY 1) c USING (user_id)
        WHERE b.balance_cents <> coalesce(c.credits, 0)""").fetchone()[0]
    stuck = conn.execute("SELECT count(*) FROM webhook_events WHERE status <> 'completed'").fetchone()[0]
    if dupes or wrong or stuck:
        raise SystemExit(f"INVARIANT BROKEN: {dupes} duplicated ids, {wrong} wrong balances, {stuck} not completed")
    return "ok"


def check_peer(conn):
    """The same ledger check on the peer's tables (its payload column holds the event's data)."""
    try:
        wrong, stuck = conn.execute("""
            SELECT (SELECT count(*) FROM user_balances b LEFT JOIN (
                        SELECT (payload->>'userId')::uuid AS user_id, sum((payload->>'amountCents')::bigint) AS credits
                        FROM webhook_events WHERE status = 'completed' AND event_type = 'payment.succeeded'
                        GROUP BY 1) c USING (user_id)
                    WHERE b.balance_cents <> coalesce(c.credits, 0)),
                   (SELECT count(*) FROM webhook_events WHERE status <> 'completed')""").fetchone()
    except psycopg.Error as exc:
        return f"n/a ({type(exc).__name__})"
    return "ok" if not (wrong or stuck) else f"BROKEN: {wrong} wrong balances, {stuck} not completed"


# -- what each new event costs the one PostgreSQL writer -----------------------

WRITER_COST = ("new events", STRIPE_SIZED)


def stored(conn):
    """Events stored, WAL bytes written so far (the whole cluster's: one receiver runs at a time), the
    bytes of every table of conn's database with its indexes and TOAST, and the WAL's position."""
    return conn.execute("""
        SELECT (SELECT count(*) FROM webhook_events),
               pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'),
               (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.relkind = 'r' AND n.nspname = 'public'),
               pg_current_wal_lsn()::text""").fetchone()


def full_page_images(pg_data, start, end):
    """The bytes of full-page images in the WAL from start to end (pg_waldump --stats's total): the part of
    WAL bytes that depends on when the last checkpoint was, not on the event."""
    out = sh(str(pg_bindir() / "pg_waldump"), "--stats", "-p", str(Path(pg_data) / "pg_wal"), "-s", start, "-e", end)
    total = next(line for line in out.splitlines() if line.startswith("Total"))
    # Total, N, record bytes, FPI bytes, combined bytes; each but N maybe followed by its [share%].
    return int([word for word in total.split()[1:] if not word.startswith("[")][2])


def body_bytes(events):
    return sum(len(json.dumps(e, separators=(",", ":"))) for e in events[:100]) / min(len(events), 100)


# -- the run ---------------------------------------------------------------------

def measure(receiver, scenario, path, requests, pg_pids, redis_pid, pg_data, delay_ms=None):
    pids = lambda: [receiver.app_pids(), pg_pids + children(pg_pids[0]), [redis_pid]]  # noqa: E731
    writes = scenario.name in WRITER_COST
    if writes:
        # Every run then starts after a checkpoint: the first change of each page writes its full image.
        receiver.conn.execute("CHECKPOINT")
        stored_before = stored(receiver.conn)
    before = [cpu_ms(p) for p in pids()]
    spy = None
    profiled = os.environ.get("BENCH_PYSPY_SCENARIO", "new events")
    if os.environ.get("BENCH_PYSPY") and receiver.name == "project" and scenario.name == profiled:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        spy = subprocess.Popen([py_spy, "record", "--gil", "--nonblocking", "--rate", "200", "--format", "raw",
                                "-d", str(DURATION), "-o", os.environ["BENCH_PYSPY"],
                                "-p", str(receiver.worker_pids()[0])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = run_wrk(receiver.base + path, requests, delay_ms)
    if spy:
        spy.wait(30)
    after = [cpu_ms(p) for p in pids()]
    n = max(result["requests"], 1)
    result["cpu"] = [(a - b) / n for a, b in zip(after, before, strict=True)]
    if writes:
        stored_after = stored(receiver.conn)
        events, wal, size = (a - b for a, b in zip(stored_after[:3], stored_before[:3], strict=True))
        events = max(events, 1)
        fpi = full_page_images(pg_data, stored_before[3], stored_after[3])
        result["writer"] = {"body": body_bytes(scenario.events), "wal": wal / events, "fpi": fpi / events,
                            "stored": size / events, "pg_cpu": result["cpu"][1]}
    result["invariants"] = receiver.check(receiver.conn)
    # Re-deliveries repeat by design; for the others, a wrap would repeat an event.
    result["wrapped"] = scenario.events is not None and "re-deliveries" not in scenario.name \
        and result["requests"] > len(scenario.events)
    receiver.rows[scenario.name] = result
    print(f"  done: {scenario.name}, {receiver.name}: {result['rps']:.0f} req/s", file=sys.stderr, flush=True)


# -- at the provider's pace (issue 46) -----------------------------------------------------------

PACE = "pace"  # its name in BENCH_ONLY
PACE_EVENTS, PACE_RATE = 2_000, 200  # thin events offered, per second, open loop, to two hosts in turn
PACE_ANSWER_SECONDS = 0.15  # Stripe across the internet answers in 100 to 500 ms
PACE_RETRY_SECONDS = 5  # a refused delivery is sent again after this (far sooner than Stripe retries)


def _pace_deliveries(stand_in, stamp):
    """PACE_EVENTS thin v1.payment_intent.succeeded events, signed; their PaymentIntents at the stand-in, each
    created (https://docs.stripe.com/api/payment_intents/object) a few seconds before its event."""
    deliveries = []
    for n in range(PACE_EVENTS):
        cents = 1 + n % 997
        created = stamp + n // PACE_RATE
        intent = {"id": f"pi_pace_{n:06d}", "object": "payment_intent", "amount": cents, "amount_received": cents,
                  "currency": "usd", "status": "succeeded", "livemode": True, "created": created - 5,
                  "metadata": {"user_id": str(USERS[n % len(USERS)])}}
        stand_in.put(intent)
        body = json.dumps({"id": f"evt_pace_{n:06d}", "object": "v2.core.event", "type": "v1.payment_intent.succeeded",
                           "created": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(created)),
                           "livemode": True, "context": None,
                           "related_object": {"id": intent["id"], "type": "payment_intent",
                                              "url": f"/v1/payment_intents/{intent['id']}"}},
                          separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", **sign("stripe", body, [FETCH_SECRET.encode()], timestamp=stamp)}
        deliveries.append((body, headers, cents))
    return deliveries


def _post(base, body, headers):
    import http.client
    from urllib.parse import urlsplit
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("POST", "/api/webhooks", body=body, headers=headers)
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def bench_pace(pg, redis, work):
    """PACE_EVENTS thin events offered at PACE_RATE a second to two hosts sharing PostgreSQL and Redis, Stripe's
    stand-in answering in PACE_ANSWER_SECONDS behind its rate limiter; a refusal is sent again after
    PACE_RETRY_SECONDS, as a (much faster) provider would. Project only."""
    from concurrent.futures import ThreadPoolExecutor

    from devservers.stripe_stand_in import API_KEY, StripeStandIn

    conn = psycopg.connect(pg.createdb("bench_pace"), autocommit=True)
    apply_schema(conn)
    for user in USERS:
        conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])
    with StripeStandIn() as stand_in:
        stand_in.delay, stand_in.limiter = PACE_ANSWER_SECONDS, True
        env = {"DATABASE_URL": pg.url("bench_pace"), "REDIS_URL": redis.url, "WEBHOOK_SECRET": FETCH_SECRET,
               "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url}
        hosts = [Gunicorn(env, workers=None, threads=None, log_path=work / f"gunicorn-pace-{n}.log") for n in (0, 1)]
        try:
            for host in hosts:
                host.start()
            deliveries = _pace_deliveries(stand_in, int(time.time()))
            expected = sum(cents for _, _, cents in deliveries)
            first, sent, lock = {}, [0], threading.Lock()
            started = time.monotonic()
            burst_end = started + (PACE_EVENTS - 1) / PACE_RATE

            def offer(n):
                time.sleep(max(0.0, started + n / PACE_RATE - time.monotonic()))  # open loop: on time, whatever
                body, headers, _ = deliveries[n]
                status = _post(hosts[n % 2].base, body, headers)
                first[n] = status
                while not 200 <= status < 300:
                    time.sleep(PACE_RETRY_SECONDS)
                    status = _post(hosts[n % 2].base, body, headers)
                    with lock:
                        sent[0] += 1
                return time.monotonic()

            with ThreadPoolExecutor(256) as pool:
                last_sent = max(pool.map(offer, range(PACE_EVENTS)))
            first_done = time.monotonic()
            while True:
                credited = conn.execute("SELECT coalesce(sum(balance_cents), 0) FROM user_balances").fetchone()[0]
                if credited >= expected or time.monotonic() - first_done > 900:
                    break
                time.sleep(0.1)
            last_credit = time.monotonic()
        finally:
            for host in hosts:
                if host.proc:
                    host.stop()
        problems = verify.check(conn).problems
    conn.close()
    ok_first = sum(1 for status in first.values() if 200 <= status < 300)
    budget = os.environ.get("WEBHOOK_API_RATE", "10")
    print(f"\npace: {PACE_EVENTS} thin v1.payment_intent.succeeded events offered at {PACE_RATE}/s to two gunicorn "
          f"hosts (default workers) sharing PostgreSQL and Redis; Stripe's stand-in answers in "
          f"{PACE_ANSWER_SECONDS * 1000:.0f} ms behind its limiter (25 per endpoint, 100 in all per second); a "
          f"refusal is sent again after {PACE_RETRY_SECONDS} s")
    print("| figure | value |\n|---|---|")
    print(f"| 2xx at first delivery | {ok_first} of {PACE_EVENTS} ({ok_first / PACE_EVENTS:.1%}) |")
    print(f"| deliveries sent again | {sent[0]} |")
    print(f"| 429s the stand-in answered | {stand_in.limited} |")
    print(f"| peak requests in one second, GET /v1/payment_intents/{{id}} | {stand_in.peaks.get('payment_intent', 0)} "
          f"(budget {budget}, Stripe's limit 25) |")
    print(f"| peak requests in one second, GET /v1/payment_intents (pages) | "
          f"{stand_in.peaks.get('payment_intent_list', 0)} (budget {budget}) |")
    print(f"| pages read / single reads | {sum(1 for r in stand_in.requests if 'limit' in r)} / "
          f"{sum(1 for r in stand_in.requests if 'limit' not in r)} |")
    print(f"| provider requests per event | {len(stand_in.requests) / PACE_EVENTS:.2f} |")
    print(f"| the burst's last notification offered to the last credit | {last_credit - burst_end:.1f} s |")
    print(f"| the last 2xx answer to the last credit | {last_credit - last_sent:.1f} s |")
    print(f"| credited | {credited} of {expected} cents; verify: {'ok' if not problems else problems[:3]} |")


# -- fetching each event from Stripe's API (issue 35) ---------------------------------

FETCH = "fetch"  # its name in BENCH_ONLY
# Seconds the stand-in of Stripe's Retrieve an event waits before each answer.
FETCH_ANSWER_SECONDS = 0.05
FETCH_SECRET = "whsec_benchFetch0123456789abcdef"
# New events of each run, per worker: 2,000 a second, more than a run sends. Most of its requests are quick
# 503s (no free slot), about 450 a second per worker on 2 cores; a run that sends more says "requests wrapped".
FETCH_EVENTS_PER_WORKER = 2_000 * DURATION
# bench.lua sends each line's hex as X-Signature; here as the stripe scheme's Stripe-Signature,
# t=<unix>,v1=<hex> of "<t>.<body>", every request of a run signed with one t just before the run.


def fetch_events(tag, count, created):
    """count new Stripe payment_intent.succeeded Events, each its own PaymentIntent and user's payment."""
    documents = []
    for n in range(count):
        cents = 1 + n % 997
        intent = {"id": f"pi_{tag}_{n}", "object": "payment_intent", "amount": cents, "amount_received": cents,
                  "currency": "usd", "status": "succeeded", "metadata": {"user_id": str(USERS[n % len(USERS)])}}
        documents.append({"id": f"evt_{tag}_{n:06d}", "object": "event", "api_version": "2025-03-31.basil",
                          "created": created, "livemode": True, "pending_webhooks": 1,
                          "request": {"id": None, "idempotency_key": None}, "type": "payment_intent.succeeded",
                          "data": {"object": intent}})
    return documents


def write_stripe_requests(path, events, stamp):
    """write_requests' lines, each signature the v1 of the stripe scheme at time stamp (bench.lua adds t=)."""
    with open(path, "w") as f:
        for e in events:
            body = json.dumps(e, separators=(",", ":"))
            header = sign("stripe", body.encode(), [FETCH_SECRET.encode()], timestamp=stamp)["Stripe-Signature"]
            f.write(f"{header.split(',v1=', 1)[1]}\t{body}\n")
    return path


def check_fetched(conn):
    """`flask ledger verify`'s checks; every event completed, with Stripe's bytes kept; the balances' sum that
    of the events' amount_received."""
    problems = verify.check(conn).problems
    if problems:
        raise SystemExit("fetch bench: INVARIANT BROKEN:\n" + "\n".join(problems[:20]))
    stuck, unfetched, paid, balances = conn.execute("""
        SELECT count(*) FILTER (WHERE status <> 'completed'), count(*) FILTER (WHERE fetched IS NULL),
               coalesce(sum((event_json(body)->'data'->'object'->>'amount_received')::bigint), 0),
               (SELECT coalesce(sum(balance_cents), 0) FROM user_balances)
        FROM webhook_events""").fetchone()
    if stuck or unfetched or paid != balances:
        raise SystemExit(f"fetch bench: INVARIANT BROKEN: {stuck} not completed, {unfetched} without Stripe's "
                         f"bytes, balances {balances} cents for payments of {paid}")
    return "ok"


def bench_fetch(pg, redis, work):
    """New Stripe deliveries to a service that fetches each event (WEBHOOK_FETCH=true) from the stand-in of
    Stripe's Retrieve an event, answering after FETCH_ANSWER_SECONDS: at the bench's connections, then at one
    connection per slot. Project only: the peer fetches nothing."""
    from app.settings.config import from_env
    from devservers.stripe_stand_in import API_KEY, StripeStandIn

    conn = psycopg.connect(pg.createdb("bench_fetch"), autocommit=True)
    apply_schema(conn)
    for user in USERS:
        conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])
    with StripeStandIn() as stand_in:
        stand_in.delay = FETCH_ANSWER_SECONDS
        env = {"DATABASE_URL": pg.url("bench_fetch"), "REDIS_URL": redis.url, "WEBHOOK_SECRET": FETCH_SECRET,
               "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_FETCH": "true", "WEBHOOK_API_KEY": API_KEY,
               "STRIPE_API_BASE": stand_in.url}
        server = Gunicorn(env, workers=None, threads=None, log_path=work / "gunicorn-fetch.log")
        shape = server.settings()
        service = from_env(server.env)  # PROVIDER_SLOTS and PROVIDER_DEADLINE_MS as the service reads them
        workers, slots = int(shape["workers"]), service.provider_slots
        ceiling = workers * slots / FETCH_ANSWER_SECONDS
        rows = []
        try:
            server.start()
            for number, connections in enumerate(dict.fromkeys([CONNECTIONS, workers * slots])):
                events = fetch_events(f"fetch{number}", FETCH_EVENTS_PER_WORKER * workers, int(time.time()))
                stand_in.add(*events)
                stamp = int(time.time())  # the run starts within seconds, well inside WEBHOOK_TOLERANCE_SECONDS
                requests = write_stripe_requests(work / "fetch.tsv", events, stamp)
                stored_before = conn.execute("SELECT count(*) FROM webhook_events").fetchone()[0]
                waiting_before = conn.execute("SELECT count(*) FROM waiting_notifications").fetchone()[0]
                retrieves_before = len(stand_in.requests)
                result = run_wrk(server.base + "/api/webhooks", requests, connections=connections,
                                 extra_env={"BENCH_SIGNATURE_HEADER": "Stripe-Signature",
                                            "BENCH_SIGNATURE_PREFIX": f"t={stamp},v1="})
                time.sleep(2 * FETCH_ANSWER_SECONDS + 0.5)  # the deliveries in flight as wrk stopped end
                result["stored"] = conn.execute("SELECT count(*) FROM webhook_events").fetchone()[0] - stored_before
                result["retrieves"] = len(stand_in.requests) - retrieves_before
                # Accepted (202) for the drain: still waiting as the run's figures are read.
                result["waiting"] = conn.execute("SELECT count(*) FROM waiting_notifications").fetchone()[0] \
                    - waiting_before
                result["ok_rps"] = result["rps"] * (result["requests"] - result["non2xx"]) / max(result["requests"], 1)
                result["wrapped"] = result["requests"] > len(events)
                result["invariants"] = check_fetched(conn)
                rows.append((connections, result))
                print(f"  done: {FETCH}, {connections} connections: {result['ok_rps']:.0f} deliveries/s",
                      file=sys.stderr, flush=True)
        finally:
            if server.proc:
                server.stop()
    conn.close()
    print(f"\nfetch: new Stripe payment_intent.succeeded deliveries (stripe scheme, WEBHOOK_FETCH=true), each "
          f"fetched from the loopback stand-in of Stripe's Retrieve an event, which answers after "
          f"{FETCH_ANSWER_SECONDS * 1000:.0f} ms; project only (the peer fetches nothing). gunicorn {workers} workers "
          f"x {shape.get('threads')} threads, PROVIDER_SLOTS={slots}, "
          f"PROVIDER_DEADLINE_MS={service.provider_deadline_ms}; {DURATION}s per run"
          + (" (BENCH_QUICK)" if QUICK else ""))
    print(f"\nbound: each fetch holds one of a worker's {slots} slots for the {FETCH_ANSWER_SECONDS * 1000:.0f} ms "
          f"answer, so the ceiling is {workers} workers x {slots} slots / {FETCH_ANSWER_SECONDS} s = {ceiling:.0f} "
          f"deliveries/s applied inline; a delivery that finds no free slot or no budget is recorded and answered 202 "
          f"accepted at once, for the drain (2xx, counted in `waiting` while it waits). Latencies are of every "
          f"answer. Runs: the bench's {CONNECTIONS} connections, then one per slot "
          f"({workers * slots}).\n")
    print("| connections | deliveries/s (2xx) | ceiling | of ceiling | req/s (all) | p50 ms | p90 ms | p99 ms "
          "| non-2xx | errors | applied inline | waiting | retrieves | invariants |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for connections, r in rows:
        wrapped = " (requests wrapped)" if r["wrapped"] else ""
        print(f"| {connections}{wrapped} | {r['ok_rps']:.1f} | {ceiling:.0f} | {r['ok_rps'] / ceiling:.0%} "
              f"| {r['rps']:.0f} | {r['p50']:.1f} | {r['p90']:.1f} | {r['p99']:.1f} | {r['non2xx']} | {r['errors']} "
              f"| {r['stored']} | {r['waiting']} | {r['retrieves']} | {r['invariants']} |")


# -- flask reconcile against the loopback stand-in of Stripe's List Events ---------

# Two windows, so that the peak RSS of each run shows whether memory grows with the window.
RECONCILE_EVENTS = [int(n) for n in os.environ.get("BENCH_RECONCILE_EVENTS", "10000,50000").split(",")]


def stripe_events(count, now):
    """count Stripe Event objects over the last two days, oldest first: 8 in 10 payments (each its own
    PaymentIntent), 1 in 10 a refund of the payment before it, 1 in 10 a type that moves nothing."""
    documents = []
    for n in range(count):
        created = now - 2 * 86400 + n * 2 * 86400 // count
        intent = f"pi_bench_{n - n % 10}"
        if n % 10 == 8:
            kind, obj = "refund.created", {"id": f"re_bench_{n}", "object": "refund", "amount": 100,
                                           "payment_intent": intent, "currency": "usd", "status": "succeeded"}
        elif n % 10 == 9:
            kind, obj = "charge.dispute.created", {"id": f"du_bench_{n}", "object": "dispute", "amount": 100,
                                                   "payment_intent": intent, "currency": "usd"}
        else:
            intent = f"pi_bench_{n}"
            kind, obj = "payment_intent.succeeded", {
                "id": intent, "object": "payment_intent", "amount": 1000, "amount_received": 1000,
                "currency": "usd", "status": "succeeded", "metadata": {"user_id": str(USERS[n % len(USERS)])}}
        documents.append({"id": f"evt_bench_{n:06d}", "object": "event", "api_version": "2025-03-31.basil",
                          "created": created, "livemode": True, "pending_webhooks": 0,
                          "request": {"id": None, "idempotency_key": None}, "type": kind,
                          "data": {"object": obj}})
    return documents


def peak_rss_of(pid, peak=0.0):
    """A running process's own peak RSS in MB (VmHWM: its address space's high-water mark), or peak once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return peak
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    return max(peak, int(found[1]) / 1024) if found else peak


def run_reconcile(env, pg, *args):
    """`flask reconcile default` in its own process: (seconds, peak RSS in MB, output, its CPU ms, PostgreSQL's).

    The peak is the command's VmHWM, read every 50 ms while it runs: wait4's ru_maxrss would not do, as Linux
    carries the spawning process's high-water mark across exec, and this process holds the stand-in's events.
    """
    postmaster = [int(Path(pg.data / "postmaster.pid").read_text().split()[0])]
    pg_before = cpu_ms(postmaster + children(postmaster[0]))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "app", "reconcile", "default", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()))
    reader.start()
    peak = 0.0
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        peak = peak_rss_of(proc.pid, peak)  # until it has exited (a zombie's status has no VmHWM)
        time.sleep(0.05)
    _, status, usage = os.wait4(proc.pid, 0)
    reader.join()
    out = output[0]
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"flask reconcile failed ({proc.returncode}):\n{out}")
    time.sleep(0.5)  # its backends exit and are reaped: their CPU is then the postmaster's children's
    pg_ms = cpu_ms(postmaster + children(postmaster[0])) - pg_before
    return seconds, peak, out, (usage.ru_utime + usage.ru_stime) * 1000, pg_ms


def bench_reconcile(pg, redis):
    """Reconcile windows of RECONCILE_EVENTS events into empty ledgers; print events/s and peak RSS of each."""
    from devservers.stripe_stand_in import API_KEY, StripeStandIn

    rows, outs = [], []
    for n in RECONCILE_EVENTS:
        dbname = f"bench_reconcile_{n}"
        conn = psycopg.connect(pg.createdb(dbname), autocommit=True)
        apply_schema(conn)
        for user in USERS:
            conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])
        with StripeStandIn() as stand_in:
            stand_in.add(*stripe_events(n, int(time.time()) - 60))
            env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "DATABASE_URL": pg.url(dbname),
                   "REDIS_URL": redis.url, "WEBHOOK_SECRET": "whsec_bench0123456789abcdef",
                   "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url}
            runs = [("--dry-run (listing: both passes, a stored-or-not query per page)",
                     run_reconcile(env, pg, "--dry-run")),
                    ("first run (every event applied)", run_reconcile(env, pg))]
            out = runs[-1][1][2]
            since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 3 * 86400))
            runs.append(("again (every event a duplicate)", run_reconcile(env, pg, "--since", since)))
            requests = len(stand_in.requests)
        report = verify.check(conn)
        if report.problems:
            raise SystemExit("reconcile bench: ledger inconsistent:\n" + "\n".join(report.problems))
        applied = conn.execute("SELECT count(*) FROM webhook_events WHERE origin = 'reconcile'").fetchone()[0]
        if applied != n:
            raise SystemExit(f"reconcile bench: {applied} events stored of {n}:\n{out}")
        conn.close()
        rows += [(n, requests, name, run) for name, run in runs]
        outs.append(out)
    print(f"\nflask reconcile, windows of {' and '.join(map(str, RECONCILE_EVENTS))} Stripe events (2 days) from the"
          " loopback stand-in, each run its own process (peak RSS: its VmHWM):\n")
    print("| events | list requests | run | seconds | events/s | peak RSS MB | CPU ms/event: command | PostgreSQL |")
    print("|---|---|---|---|---|---|---|---|")
    for n, requests, name, (seconds, rss, _, command_ms, pg_ms) in rows:
        print(f"| {n} | {requests} | {name} | {seconds:.1f} | {n / seconds:.0f} | {rss:.0f} | {command_ms / n:.2f} "
              f"| {pg_ms / n:.2f} |")
    peaks = [rss for _, _, _, (_, rss, *_) in rows]
    print(f"\npeak RSS over every run: {min(peaks):.0f} to {max(peaks):.0f} MB")
    print("\n" + outs[-1])


def main():
    check_programs()
    work = Path(tempfile.mkdtemp(prefix="webhook-ledger-bench-"))
    pg_dir = tempfile.mkdtemp(prefix="webhook-ledger-bench-pg-")  # its own 0700 folder, owned by postgres
    pg = Postgres(pg_dir).init().start()
    redis = Redis().start()
    server = peer_server = None
    try:
        if ONLY and set(ONLY) <= {FETCH, PACE, "reconcile"}:  # each with its own servers: the scenarios' is not
            if FETCH in ONLY:
                bench_fetch(pg, redis, work)
            if PACE in ONLY:
                bench_pace(pg, redis, work)
            if "reconcile" in ONLY:
                bench_reconcile(pg, redis)
            return
        conn = psycopg.connect(pg.createdb("bench"), autocommit=True)
        apply_schema(conn)
        for user in USERS:
            conn.execute("INSERT INTO user_balances (user_id) VALUES (%s)", [user])

        env = {"DATABASE_URL": pg.url("bench"), "REDIS_URL": redis.url, "WEBHOOK_SECRET": SECRET}
        # workers and threads None: gunicorn.conf.py decides, from the environment as in production.
        server = Gunicorn(env, workers=None, threads=None, log_path=work / "gunicorn.log")
        settings = server.settings()
        server.start()
        project = Receiver("project", server.base, lambda: [server.proc.pid] + children(server.proc.pid),
                           lambda: children(server.proc.pid), conn, check_project)
        receivers = [project]

        command, schema, no_peer = peer.command()
        peer_pool = os.environ.get("BENCH_PEER_POOL_MAX", str(CONNECTIONS))
        if command:
            peer_server = peer.Peer(command, schema, pg, redis, SECRET, USERS, peer_pool, work / "peer.log")
            try:
                peer_server.start()
            except RuntimeError as exc:
                raise SystemExit(str(exc)) from None
            receivers.append(Receiver("peer", peer_server.base, lambda: descendants(peer_server.proc.pid),
                                      lambda: [peer_server.proc.pid], peer_server.conn, check_peer))
        pg_pids = [int(Path(pg.data / "postmaster.pid").read_text().split()[0])]

        # Completed events to re-deliver: processed once by each receiver, before any timing.
        completed = [event(f"evt_done_{i}", i) for i in range(2000)]
        warm = write_requests(work / "warm.tsv", completed)
        for receiver in receivers:
            run_wrk(receiver.base + "/api/webhooks", warm)

        rate = None
        for scenario in scenarios(completed):
            if ONLY and scenario.name not in [*ONLY, "GET /health"]:
                continue
            requests = write_requests(work / "req.tsv", scenario.events) if scenario.events else None
            path = "/health" if scenario.events is None else "/api/webhooks"
            delay_ms = None
            if scenario.paced:
                new = project.rows.get("new events")
                rate = float(os.environ.get("BENCH_OPEN_RATE", 0)) or (new["rps"] / 2 if new else None)
                if not rate:
                    continue
                delay_ms = CONNECTIONS / rate * 1000
            for receiver in receivers:
                if receiver is project or scenario.peer:
                    measure(receiver, scenario, path, requests, pg_pids, redis.proc.pid, pg.data, delay_ms)

        rss = {r.name: peak_rss_mb(r.worker_pids()) for r in receivers}
        header = (f"webhook-ledger bench: project = gunicorn {settings.get('workers')} workers x "
                  f"{settings.get('threads')} threads ({worker_class_name(settings.get('worker_class'))}); "
                  + (f"peer = {shlex.join(command)}, PG_POOL_MAX={peer_pool}" if command else "no peer")
                  + f"; {CONNECTIONS} connections, {os.cpu_count()} cores, {DURATION}s per run"
                  + (" (BENCH_QUICK)" if QUICK else ""))
        report(header, receivers, rss, rate, no_peer)
        if not ONLY or FETCH in ONLY:  # after every scenario, with its own server: none runs beside it
            bench_fetch(pg, redis, work)
        if not ONLY or PACE in ONLY:
            bench_pace(pg, redis, work)
        if not ONLY or "reconcile" in ONLY:
            bench_reconcile(pg, redis)
    finally:
        if server:
            server.stop()
        if peer_server:
            peer_server.stop()
        redis.stop()
        pg.stop("immediate")
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pg_dir, ignore_errors=True)


# -- the report ------------------------------------------------------------------

def ratio(a, b):
    return a / b if b else float("nan")


def report(header, receivers, rss, rate, no_peer):
    project = receivers[0]
    peer = receivers[1] if len(receivers) > 1 else None
    print(f"\n{header}\n")
    if no_peer:
        print(f"peer column skipped: {no_peer}\n")
    print("| scenario | receiver | req/s | p50 ms | p90 ms | p99 ms | non-2xx | errors "
          "| CPU ms/req app / pg / redis | invariants |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    names = list(project.rows)
    for name in names:
        for receiver in receivers:
            r = receiver.rows.get(name)
            if r is None:
                continue
            cpu = " / ".join(f"{x:.2f}" for x in r["cpu"])
            wrapped = " (requests wrapped)" if r["wrapped"] else ""
            print(f"| {name}{wrapped} | {receiver.name} | {r['rps']:.0f} | {r['p50']:.1f} | {r['p90']:.1f} "
                  f"| {r['p99']:.1f} | {r['non2xx']} | {r['errors']} | {cpu} | {r['invariants']} |")
    if rate:
        print(f"\nopen loop: offered {rate:.0f} req/s (half the project's new-event rate), "
              f"each connection waiting {CONNECTIONS / rate * 1000:.0f} ms before each request")
    print("\npeak RSS per worker: " + "; ".join(
        f"{name} {', '.join(f'{x:.1f} MB' for x in peaks)}" for name, peaks in rss.items()))

    measured = {"rss": max(rss["project"])}
    p = project.rows
    health = p.get("GET /health")
    if health:
        for key, name in (("new_health", "new events"), ("dup_health", "100% re-deliveries")):
            if name in p:
                measured[key] = ratio(p[name]["cpu"][0], health["cpu"][0])
    if peer:
        print("\n| scenario | req/s project/peer | p99 project/peer | app CPU/req project/peer "
              "| app+pg+redis CPU/req project/peer |")
        print("|---|---|---|---|---|")
        for name in names:
            mine, theirs = p[name], peer.rows.get(name)
            if theirs is None:
                continue
            print(f"| {name} | {ratio(mine['rps'], theirs['rps']):.2f} | {ratio(mine['p99'], theirs['p99']):.2f} "
                  f"| {ratio(mine['cpu'][0], theirs['cpu'][0]):.2f} "
                  f"| {ratio(sum(mine['cpu']), sum(theirs['cpu'])):.2f} |")
        keys = {"new_rps": ("new events", "rps"), "new_p99": ("new events", "p99"),
                "mix_rps": ("50% re-deliveries", "rps"), "dup_rps": ("100% re-deliveries", "rps"),
                "open_p99": ("open loop: new events", "p99")}
        for key, (name, column) in keys.items():
            if name in p and name in peer.rows:
                measured[key] = ratio(p[name][column], peer.rows[name][column])

    writer_cost(receivers, measured)

    print("\n| goal | measured | bound | met |")
    print("|---|---|---|---|")
    for what, key, op, bound in GOALS:
        if key not in measured:
            continue
        value = measured[key]
        met = value >= bound if op == ">=" else value <= bound
        print(f"| {what} | {value:.2f} | {op} {bound} | {'yes' if met else 'NO'} |")


def writer_cost(receivers, measured):
    """What each new event cost PostgreSQL, per receiver and body size, and the ratios project/peer."""
    rows = [(name, r, r.rows[name]["writer"]) for name in WRITER_COST for r in receivers
            if "writer" in r.rows.get(name, {})]
    if not rows:
        return
    print("\n| per new event | receiver | body bytes | WAL bytes | of which full-page images | table+index bytes "
          "| PG CPU ms |")
    print("|---|---|---|---|---|---|---|")
    for name, receiver, w in rows:
        print(f"| {name} | {receiver.name} | {w['body']:.0f} | {w['wal']:.0f} | {w['fpi']:.0f} | {w['stored']:.0f} "
              f"| {w['pg_cpu']:.3f} |")
    if len(receivers) < 2:
        return
    project, peer = receivers[0].rows, receivers[1].rows
    for name, size in ((STRIPE_SIZED, "big"), ("new events", "small")):
        if "writer" in project.get(name, {}) and "writer" in peer.get(name, {}):
            mine, theirs = project[name]["writer"], peer[name]["writer"]
            for key in ("wal", "stored", "pg_cpu"):
                measured[f"{size}_{key}"] = ratio(mine[key], theirs[key])


if __name__ == "__main__":
    main()
