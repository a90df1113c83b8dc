"""Issue 44's two capture attacks, measured on the checkout this script sits in: its own PostgreSQL, Redis, the
providers' stand-ins (devservers/) and a gunicorn host (2 workers x 4 threads, default settings otherwise).

(a) Replay: one genuine, signed Razorpay delivery of a payment (the source fetches each payment from Razorpay's
    API, here devservers/razorpay_stand_in.py) sent COPIES times from 8 threads: the answers by status, and how many
    calls the Razorpay stand-in received (one is the genuine fetch; the rest are the replay's).
(b) Forged storage: one captured genuine PayPal delivery's headers reused on FORGED bodies, each a capture under a
    made-up event id (which PayPal's API, devservers/paypal_stand_in.py, does not have), padded to ~1000 KiB and to
    the captured body's CRC32: the answers by status, the bytes stored in every table column that can hold a body,
    the failed rows, and how many rows `flask events replay --all-failed` would re-ask (its own query).

A measurement, not a test (no assertion; pytest does not collect scripts/):

    .venv/bin/python scripts/attacks.py [COPIES [FORGED]]   (default 300 copies, 40 forged bodies)
"""

import base64
import binascii
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.commands.cli import FAILED_EVENTS  # noqa: E402
from app.store.db import apply_schema  # noqa: E402
from devservers import Gunicorn, Postgres, Redis  # noqa: E402
from devservers.paypal_stand_in import PayPalStandIn  # noqa: E402
from devservers.razorpay_stand_in import RazorpayStandIn  # noqa: E402
from tests.helpers import BOB, OPENING, encode, send, sources_config  # noqa: E402
from tests.providers.paypal import events as paypal_events
from tests.providers.paypal.certificates import PKI, WEBHOOK_ID, CertHost, paypal_headers  # noqa: E402
from tests.providers.paypal.test_scheme import _crc32_forgery  # noqa: E402
from tests.providers.razorpay import events as razorpay_events  # noqa: E402
from tests.providers.razorpay.test_delivery import razorpay_headers  # noqa: E402

THREADS = 8
SETTLE_S = 10.0
DRAIN_PATIENCE_S = 180.0
FORGED_SIZE = 1000 * 1024  # each forged body, under the 1 MiB a delivery may be
# Columns that can hold a delivery's bytes: every table's, counted as stored (pg_column_size: after TOAST).
BODY_TYPES = ("bytea", "text", "json", "jsonb", "character varying")


def _database(server, name, currency):
    """A fresh database as `flask init-db` makes it, in currency, with the tests' opening balances."""
    url = server.createdb(name)
    with psycopg.connect(url, autocommit=True) as conn:
        apply_schema(conn)
        conn.execute("UPDATE ledger_currency SET currency = %s", [currency])
        for user, cents in OPENING.items():
            conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s)", [user, cents])
    return url


def _host(env, folder, name):
    return Gunicorn(env, workers=2, threads=4, log_path=Path(folder) / f"{name}.log").start()


def replay(server, redis, folder, copies):
    """(a): copies of one genuine Razorpay fetching delivery from THREADS threads."""
    api = RazorpayStandIn().start()
    url = _database(server, "replay", "inr")
    env = sources_config({"DATABASE_URL": url, "REDIS_URL": redis.url}, {"razorpay": None},
                         LEDGER_CURRENCY="inr", WEBHOOK_RAZORPAY_FETCH="true",
                         WEBHOOK_RAZORPAY_API_KEY=api.api_key, WEBHOOK_RAZORPAY_API_BASE=api.url)
    host = _host(env, folder, "replay")
    try:
        payment_id = razorpay_events.new_id("pay")
        event = razorpay_events.payment_captured(payment_id, user=BOB, paise=100000)
        api.add(event["payload"]["payment"]["entity"])
        body = encode(event)
        headers = razorpay_headers(body)  # captured once: the same bytes and headers every time
        started = time.monotonic()
        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(pool.map(lambda _: _status(send(host.base, body, headers, source="razorpay")),
                                    range(copies)))
        elapsed = time.monotonic() - started
        print(f"(a) {copies} copies of one genuine Razorpay fetching delivery, {THREADS} threads, {elapsed:.1f} s")
        _table(Counter(answers))
        print(f"    calls the Razorpay stand-in received: {api.count('/v1/')}")
        time.sleep(SETTLE_S)  # deliveries answered 202 are fetched later, by the drain
        print(f"    ... and {SETTLE_S:.0f} s later: {api.count('/v1/')}")
    finally:
        host.stop()
        api.close()


def forged(server, redis, folder, count):
    """(b): count bodies under made-up ids, each padded to ~FORGED_SIZE and to a captured delivery's CRC32."""
    (Path(folder) / "pki").mkdir()
    pki = PKI(Path(folder) / "pki")
    cert_host, api = CertHost(pki), PayPalStandIn().start()
    url = _database(server, "forged", "usd")
    env = sources_config({"DATABASE_URL": url, "REDIS_URL": redis.url}, {"paypal": None},
                         LEDGER_CURRENCY="usd", WEBHOOK_PAYPAL_SECRET=WEBHOOK_ID,
                         PAYPAL_CERT_HOSTS=f"localhost:{cert_host.port}", PAYPAL_CA_FILE=str(pki.ca_file),
                         WEBHOOK_PAYPAL_API_KEY=api.api_key, WEBHOOK_PAYPAL_API_BASE=api.url)
    host = _host(env, folder, "forged")
    try:
        genuine = paypal_events.capture_completed(paypal_events.new_id(), user=BOB, value="1.00")
        api.add(genuine)
        captured = encode(genuine)
        headers = paypal_headers(captured, pki, cert_host)
        first = send(host.base, captured, headers, source="paypal")
        print(f"(b) the captured genuine PayPal delivery itself: {_status(first)}")
        with psycopg.connect(url, autocommit=True) as conn:
            before = _stored(conn)
        bodies = [_forged_body(binascii.crc32(captured)) for _ in range(count)]
        started = time.monotonic()
        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(pool.map(lambda body: _status(send(host.base, body, headers, source="paypal")), bodies))
        elapsed = time.monotonic() - started
        print(f"    {count} forged bodies of {len(bodies[0]) // 1024} KiB under made-up ids, the captured "
              f"signature, {THREADS} threads, {elapsed:.1f} s")
        _table(Counter(answers))
        with psycopg.connect(url, autocommit=True) as conn:
            _report(conn, before, "right after")
            waited = _drained(conn)
            _report(conn, before, f"after the drain ({waited:.0f} s later)")
    finally:
        host.stop()
        api.close()
        cert_host.close()


def _report(conn, before, when):
    """What the forged bodies left in the database: bytes, rows by state, failed rows, what replay would re-ask."""
    after = _stored(conn)
    print(f"    {when}:")
    for column in sorted(after):
        grown = after[column] - before.get(column, 0)
        if grown:
            print(f"      bytes stored, {column}: +{grown}")
    print(f"      bytes stored in all such columns: +{sum(after.values()) - sum(before.values())}")
    for table in ("webhook_events", "waiting_notifications"):
        if _has(conn, table, "status" if table == "webhook_events" else "state"):
            column = "status" if table == "webhook_events" else "state"
            rows = conn.execute(f"SELECT {column}, count(*) FROM {table} GROUP BY 1 ORDER BY 1").fetchall()  # noqa: S608
            print(f"      {table} rows by {column}: " + (", ".join(f"{state} {n}" for state, n in rows) or "none"))
    failed = conn.execute("SELECT count(*) FROM webhook_events WHERE status = 'failed'").fetchone()[0]
    print(f"      failed rows (webhook_events): {failed}")
    print(f"      rows `flask events replay --all-failed` would re-ask: "
          f"{len(conn.execute(FAILED_EVENTS, {'source': None}).fetchall())}")


def _has(conn, table, column):
    return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' "
                        "AND table_name = %s AND column_name = %s", [table, column]).fetchone() is not None


def _drained(conn):
    """Seconds until no notification waits for the drain any more (at most DRAIN_PATIENCE_S); 0 with no such table."""
    started = time.monotonic()
    if not _has(conn, "waiting_notifications", "state"):
        return 0.0
    while time.monotonic() - started < DRAIN_PATIENCE_S:
        if not conn.execute("SELECT 1 FROM waiting_notifications WHERE state = 'waiting' LIMIT 1").fetchone():
            break
        time.sleep(1)
    return time.monotonic() - started


def _forged_body(target_crc):
    event = paypal_events.capture_completed(paypal_events.new_id(), user=BOB, value="1.00",
                                            event_id=paypal_events.new_event_id())
    filler = FORGED_SIZE - len(encode(event)) - 100
    # Base64 of random bytes: what TOAST compresses least of what JSON can carry.
    event["filler"] = base64.b64encode(os.urandom(filler * 3 // 4 + 3)).decode()[:filler]
    return _crc32_forgery(encode(event), target_crc)


def _stored(conn):
    """Bytes held per table.column, for every column whose type can hold a delivery's bytes."""
    columns = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns c JOIN information_schema.tables t "
        "USING (table_schema, table_name) WHERE table_schema = 'public' AND t.table_type = 'BASE TABLE' "
        "AND data_type = ANY(%s)", [list(BODY_TYPES)]).fetchall()
    sizes = {}
    for table, column in columns:
        sizes[f"{table}.{column}"] = conn.execute(
            f'SELECT coalesce(sum(pg_column_size("{column}")), 0) FROM "{table}"').fetchone()[0]  # noqa: S608
    return sizes


def _status(answer):
    """The HTTP status with the answer's status or error word, as the table counts it."""
    payload = answer.json if isinstance(answer.json, dict) else {}
    return f"{answer.status} {payload.get('status') or payload.get('error') or ''}".strip()


def _table(counts):
    for status, n in sorted(counts.items()):
        print(f"    {status:<32} {n}")


def main(copies, count):
    folder = tempfile.mkdtemp(prefix="attacks-")
    os.chmod(folder, 0o755)  # noqa: S103 - the cluster runs as postgres, which must reach its folder
    server = Postgres(Path(folder) / "pg").init().start()
    redis = Redis().start()
    print(f"checkout: {ROOT}")
    try:
        replay(server, redis, folder, copies)
        forged(server, redis, folder, count)
    finally:
        redis.stop()
        server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300, int(sys.argv[2]) if len(sys.argv) > 2 else 40)
