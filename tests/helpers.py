"""What the tests share besides fixtures: the users and secrets, deliveries
built and signed the way a provider builds them, one function that sends a
delivery (send: in-process or over HTTP, one Answer either way), HTTP to a
real server, and the ledger checks."""

import base64
import dataclasses
import http.client
import json
import queue
import socket
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import namedtuple_row
from werkzeug.datastructures import Headers

from app.intake import events, signature
from app.intake.events import DEFAULT_POLICY
from app.settings.config import DEFAULT_SOURCE, Settings
from app.store import verify
from devservers import ROOT, packages

# The schemes signed by their secrets alone: paypal's deliveries need PayPal's certificate (test_paypal_scheme.py).
SCHEMES = signature.HMAC_SCHEMES
# Each scheme's secret, written the way its provider issues it.
SECRETS = {
    "hmac-sha256": "whsec-test-0123456789",
    "stripe": "whsec_test_5tr1pe5ecretF0rTheTests",  # Stripe uses the whole string as the key
    "standard-webhooks": "whsec_" + base64.b64encode(b"a-standard-webhooks-test-key").decode(),
    "github": "github-test-secret-0123456789",
    "razorpay": "razorpay-test-webhook-secret-0123",  # chosen by the merchant in Razorpay's Dashboard
}
SECRET = SECRETS["hmac-sha256"]  # the default scheme's
# The exactly-once tests run once per scheme: the signing helper is what changes.
EVERY_SCHEME = pytest.mark.parametrize("scheme", SCHEMES)
# The key ones run once more on a named source (the `source` fixture): its path,
# its secret, its keys in Redis and its rows. One scheme is enough there; the
# source changes none of the scheme's code.
NAMED_SOURCE = "billing"
EVERY_SCHEME_AND_A_NAMED_SOURCE = pytest.mark.parametrize(
    ("scheme", "source"), [*((scheme, DEFAULT_SOURCE) for scheme in SCHEMES), ("standard-webhooks", NAMED_SOURCE)])
ALICE = uuid.UUID("11111111-1111-4111-8111-111111111111")
BOB = uuid.UUID("22222222-2222-4222-8222-222222222222")
# No balance row: a payment to this user fails until a test inserts one.
UNKNOWN_USER = uuid.UUID("33333333-3333-4333-8333-333333333333")
OPENING = {ALICE: 1000, BOB: 0}  # the balances every test's database starts with


def db_url(conn):
    info = conn.info
    return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"


# -- deliveries, built the way a provider builds them --------------------------

def payment(event_id=None, user=ALICE, cents=250, **extra):
    """payment.succeeded, naming its own payment (pay_<event id>) unless extra says paymentId (None: none)."""
    event_id = event_id or f"evt_{uuid.uuid4().hex}"
    data = {"userId": str(user), "amountCents": cents, "paymentId": f"pay_{event_id}", **extra}
    if data["paymentId"] is None:
        del data["paymentId"]
    return {"id": event_id, "type": "payment.succeeded", "data": data}


def payment_refunded(payment_id, refunded_total, event_id=None, **extra):
    """payment.refunded: payment_id's running total refunded so far."""
    return {"id": event_id or f"evt_{uuid.uuid4().hex}", "type": "payment.refunded",
            "data": {"paymentId": payment_id, "amountRefundedCents": refunded_total, **extra}}


def encode(event):
    return event if isinstance(event, bytes) else json.dumps(event).encode()


def secret_for(scheme, key):
    """A secret for scheme made of the text key, written as its provider issues one (e.g. for rotation tests):
    Standard Webhooks' is whsec_ and key in base64, every other scheme's is key itself."""
    return "whsec_" + base64.b64encode(key.encode()).decode() if scheme == "standard-webhooks" else key


def signing_key(secret, scheme):
    """The HMAC key of a secret as configured: Standard Webhooks' is base64 after whsec_."""
    if scheme == "standard-webhooks":
        return base64.b64decode(secret.removeprefix("whsec_"))
    return secret.encode()


def _body_id(body):
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return document.get("id") if isinstance(document, dict) and isinstance(document.get("id"), str) else None


def signed_headers(body, secret=None, content_type="application/json", *, scheme="hmac-sha256",
                   timestamp=None, event_id=None, github_event="ping"):
    """The headers a provider of scheme sends with body.

    secret may be a list (a sender rolling its secret signs with each);
    timestamp defaults to now; event_id (webhook-id, X-GitHub-Delivery) to the body's id.
    """
    secrets = secret if isinstance(secret, list) else [secret or SECRETS[scheme]]
    keys = [signing_key(s, scheme) for s in secrets]
    event_id = event_id or _body_id(body) or f"msg_{uuid.uuid4().hex}"
    headers = {"Content-Type": content_type,
               **signature.sign(scheme, body, keys, timestamp=timestamp, msg_id=event_id)}
    if scheme == "github":  # unsigned, but GitHub always sends them: the delivery's id and the event's type
        headers.update({"X-GitHub-Delivery": event_id, "X-GitHub-Event": github_event})
    return headers


# -- sending a delivery: one function, in-process or over HTTP -------------------

class Answer(NamedTuple):
    """The answer to a delivery, in one shape whichever way it went (it unpacks as status, json, headers)."""

    status: int
    json: Any  # the body parsed as JSON; None for an empty body
    headers: Headers  # read case-insensitively, as HTTP reads them

    @classmethod
    def of(cls, response):
        """The Answer of a Flask test client's response."""
        return cls(response.status_code, json.loads(response.data or b"null"), response.headers)


def send(to, event, headers=None, *, source=None, scheme=None, secret=None, path=None, timeout=30) -> Answer:
    """POST event (a dict, or bytes sent as they are) to source's endpoint (default: the default source's) on to:
    a Flask test client (in-process) or a server's base URL (over HTTP).

    Signed as the source's provider signs: by the source's scheme (the client's app says which; over HTTP,
    scheme= or hmac-sha256) with the source's test secret, unless scheme= or secret= (a list: one signature per
    secret) say otherwise. headers, when given, go out exactly as they are instead: forged, unsigned or signed
    by hand (send(to, *delivery) sends a delivery kept as its bytes and headers). path, when given, is where it
    goes instead of source's endpoint: a path that names no source, or names one another way (a trailing slash).
    """
    body = encode(event)
    if headers is None:
        scheme = scheme or _scheme_of(to, source)
        if secret is None and source not in (None, DEFAULT_SOURCE):
            secret = source_secret(source, scheme)
        headers = signed_headers(body, secret, scheme=scheme)
    else:
        assert scheme is None and secret is None, "headers are sent as they are: sign them, or pass none"
    path = path or source_path(source)
    if isinstance(to, str):
        return http_request(to, "POST", path, body, headers, timeout)
    return Answer.of(to.post(path, data=body, headers=headers))


def _scheme_of(to, source):
    """The scheme source verifies on to: its app's settings say it; hmac-sha256 over HTTP or for an unknown
    source (signed all the same)."""
    if isinstance(to, str):
        return "hmac-sha256"
    settings = Settings.of(to.application)
    if source in (None, DEFAULT_SOURCE):
        return settings.webhook_signature_scheme
    sender = settings.sources.get(source)
    return sender.scheme if sender else "hmac-sha256"


# -- named sources (WEBHOOK_SOURCES) ---------------------------------------------

def source_path(source=None):
    """Where a source's deliveries are posted: /api/webhooks for the default one."""
    return "/api/webhooks" if source in (None, DEFAULT_SOURCE) else f"/api/webhooks/{source}"


def source_prefix(name):
    """The prefix of a named source's settings, WEBHOOK_<NAME>_ (a - becomes _)."""
    return f"WEBHOOK_{name.upper().replace('-', '_')}_"


def source_secret(name, scheme):
    """A named source's own test secret, shared with no other source, written as its provider issues one."""
    return secret_for(scheme, f"{name}-source-test-secret-0123456789")


def sources_config(config, sources, **settings):
    """config that also serves named sources.

    sources maps each name to its scheme, or to None to leave WEBHOOK_<NAME>_SCHEME
    unset (then it is the name when the name is a scheme, else hmac-sha256, as
    the README says); each source gets source_secret(name, scheme). settings come
    last; a None removes a setting (WEBHOOK_SECRET=None turns the default source off).
    """
    merged = {**config, "WEBHOOK_SOURCES": ",".join(sources)}
    for name, scheme in sources.items():
        if scheme is not None:
            merged[source_prefix(name) + "SCHEME"] = scheme
        merged[source_prefix(name) + "SECRET"] = source_secret(
            name, scheme or (name if name in SCHEMES else "hmac-sha256"))
    merged.update(settings)
    return {name: value for name, value in merged.items() if value is not None}


# -- HTTP to a real server ------------------------------------------------------

def http_request(base, method, path, body=None, headers=None, timeout=30) -> Answer:
    """method path on a real server; its Answer. Raises on connection errors."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, json.loads(response.read() or b"null"), Headers(response.getheaders()))
    finally:
        conn.close()


def http_get(base, path, timeout=10):
    """GET path; return (status, parsed JSON body)."""
    return http_request(base, "GET", path, timeout=timeout)[:2]


def raw_exchange(base, data, timeout=10):
    """Send data (bytes: a whole request, well formed or not) on a new connection, and read until the server
    closes it or timeout; return (status, parsed JSON body) of the first answer, or (None, None) for none."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_answer(sock)


def read_answer(sock):
    """(status, parsed JSON body) of the answer on sock, read until the server closes; (None, None) if none came."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    if not received:
        return None, None
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def burst(bases, body, headers, twins=50, source=None):
    """Send twins of one delivery (this many, the same bytes and headers) to source at the same instant, spread
    over bases (base URLs); return every Answer."""
    barrier = threading.Barrier(twins)

    def send_twin(i):
        barrier.wait()
        return send(bases[i % len(bases)], body, headers, source=source)

    with ThreadPoolExecutor(twins) as pool:
        return list(pool.map(send_twin, range(twins)))


# -- the ledger, read back --------------------------------------------------------

def balance(conn, user=ALICE):
    return conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [user]).fetchone()[0]


def stored_event_row(conn, event_id):
    """event_id's row of webhook_events, its columns by name (row.status, row.attempts, ...); None if not stored.

    Every column but the jsonb payload, which psycopg parses with Python's json: a number of more than 4300
    digits in it would raise, and a test of such a body reads the rest of the row. Read the payload on its own.
    """
    return conn.cursor(row_factory=namedtuple_row).execute(
        "SELECT id, source, event_id, event_type, status, body, attempts, last_error, created_at, updated_at,"
        " completed_at, payload_sha256, effect_sha256, effect_version, mismatches, last_mismatch_at"
        " FROM webhook_events WHERE event_id = %s", [event_id]).fetchone()


def event_rows(conn, source=None):
    """How many events are stored: all of them, or source's."""
    return conn.execute("SELECT count(*) FROM webhook_events WHERE %(source)s::text IS NULL OR source = %(source)s",
                        {"source": source}).fetchone()[0]


def assert_ledger_consistent(conn, policy=DEFAULT_POLICY):
    """Invariants 5 and 6, from the stored events alone: no (source, id) stored twice; each payment that a
    completed event announced credited once; balance = opening + those credits - what the money rule's Python
    model (expected_debits) says each payment's completed events take + the adjustments and spends (which no
    event makes: their journal rows are their record); and `flask ledger verify`'s own checks clean. The
    events are read from their bytes (a fetched event's from its provider's) by the live path's reader
    (events.effect_of, under policy)."""
    assert conn.execute(
        "SELECT source, event_id FROM webhook_events GROUP BY source, event_id HAVING count(*) > 1").fetchall() == []
    completed = conn.execute("SELECT source, event_id, event_type, body, fetched FROM webhook_events"
                             " WHERE status = 'completed' AND body IS NOT NULL ORDER BY id").fetchall()
    credits, moves, unnamed, read_then = {}, {}, [], {}
    for source, event_id, event_type, body, fetched in completed:
        # A fetched event's money is read from the provider's bytes (app/providers/).
        effect = events.effect_of(events.stored_event(source, event_id, event_type, bytes(body), None, fetched),
                                  policy)
        if effect.kind is None:
            continue
        if effect.app_key is not None:  # the application's key names the user (never changed)
            (user_id,) = conn.execute("SELECT user_id FROM user_keys WHERE app_key = %s", [effect.app_key]).fetchone()
            effect = dataclasses.replace(effect, user_id=user_id)
        if effect.kind == events.Kind.LINK:  # no money: the customer is linked to the user its bytes name
            assert conn.execute("SELECT user_id FROM customer_links WHERE source = %s AND customer_id = %s",
                                [source, effect.customer_id]).fetchone() == (effect.user_id,), event_id
            continue
        key = (source, effect.payment_id)
        if effect.kind == events.Kind.CREDIT:
            link = effect.user_id is None and conn.execute(  # a customer's link names it (links never change)
                "SELECT user_id FROM customer_links WHERE source = %s AND customer_id = %s",
                [source, effect.customer_id]).fetchone()
            if effect.user_id is None and not link and effect.account and (source, effect.payment_id) not in credits:
                link = conn.execute(  # its connected account's link, after the payment's own user
                    "SELECT user_id FROM customer_links WHERE source = %s AND customer_id = %s",
                    [source, effect.account]).fetchone()
            assigned = effect.user_id is None and not link and conn.execute(  # an operator's (never changed)
                "SELECT user_id FROM payment_users WHERE source = %s AND payment_id = %s",
                [source, effect.payment_id]).fetchone()
            user = effect.user_id or (link and link[0]) or (assigned and assigned[0])
            if user is None:  # no user named: a payment another event credited, announced again
                unnamed.append((key, effect.amount_cents))
                continue
            first = credits.setdefault(key, (user, effect.amount_cents))
            read_then[key] = read_then.get(key, False) or events.read_when_fetched(event_type)
            # Twins of which one is read as its object is now may name two users: the first (in id order) credits.
            assert first == (user, effect.amount_cents) or first[1] == effect.amount_cents and read_then[key], \
                f"payment {key} completed with two users or amounts"
        else:
            moves.setdefault(key, []).append(effect)
    for key, cents in unnamed:
        assert credits.get(key, (None, cents))[1] == cents and key in credits, \
            f"payment {key} completed naming no user, and no event credited it"
    expected = dict(OPENING)
    for key, (user, cents) in credits.items():
        expected[user] = expected.get(user, 0) + cents - expected_debits(cents, moves.get(key, []))
    for user, cents in conn.execute("SELECT user_id, sum(amount_cents) FROM ledger_journal"
                                    " WHERE kind IN ('adjustment', 'spend', 'give_back') GROUP BY user_id").fetchall():
        expected[user] = expected.get(user, 0) + cents
    for user, cents in expected.items():
        assert balance(conn, user) == cents, user
    if not conn.autocommit:
        conn.commit()  # verify's snapshot is a transaction of its own; only reads came before
    assert verify.check(conn, policy).problems == []


def expected_debits(credited, effects):
    """What a credited payment's refunds and disputes take in all, by the rule of docs/design.md, written
    apart from money.sql: each refund or dispute counts once, reversed if any event says so; the highest
    running total takes what it says beyond the refund objects known; never more than the payment."""
    total = max((e.amount_cents for e in effects if e.kind == events.Kind.REFUNDED_TOTAL), default=0)
    movements = {}
    for e in effects:
        if e.kind in (events.Kind.REFUND, events.Kind.DISPUTE):
            amount, reversed_ = movements.get((e.kind, e.movement_id), (e.amount_cents, False))
            movements[(e.kind, e.movement_id)] = (amount, reversed_ or e.state == events.State.REVERSED)
    refunds = [(a, r) for (kind, _), (a, r) in movements.items() if kind == events.Kind.REFUND]
    disputes = [(a, r) for (kind, _), (a, r) in movements.items() if kind == events.Kind.DISPUTE]
    known = sum(a for a, _ in refunds)
    applied = sum(a for a, r in refunds if not r)
    withdrawn = sum(a for a, r in disputes if not r)
    return min(credited, applied + max(0, total - known) + withdrawn)


def scrape(base):
    """samples() of a real server's GET /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        return samples(response.read().decode())


def samples(text):
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def checkout_run_state(run_dir=ROOT / ".run"):
    """What a `make run` folder holds (the checkout's .run/ by default: the user's ledger, cluster and settings):
    each file's path, size and modification time, none when it does not exist; of the cluster, its folder's own
    files (postmaster.pid, its log, PG_VERSION: what a start changes), not its tables'. A test that runs make
    run's script compares it before and after: it must never read or write the user's."""
    if not run_dir.exists():
        return None
    return {str(path.relative_to(run_dir)): (path.lstat().st_size, path.lstat().st_mtime_ns)
            for path in sorted(run_dir.rglob("*"))
            if len(path.relative_to(run_dir).parts) <= 3 and (path.is_file() or path.is_symlink())}


def read_banner(proc, timeout):
    """A script's stdout (`make run`, `make cluster`) up to its banner's closing rule; fails if it does not come."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    text, rules, deadline = "", 0, time.monotonic() + timeout
    while rules < 2:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no banner (exit status {proc.poll()}):\n{text}") from None
            continue
        text += line
        rules += line.startswith("=" * 70)
    return text


def debian_program(name):
    """A program's path (`make test` installed its package, devservers/packages.py), or None."""
    return packages.find(name)


def record_currency(db, currency):
    """Make currency the ledger's, as the first init-db under LEDGER_CURRENCY=currency records it."""
    db.execute("UPDATE ledger_currency SET currency = %s", [currency.lower()])


def waiting_row(conn, event_id):
    """event_id's row of waiting_notifications (state, body, attempts, last_error, ...); None if none."""
    return conn.cursor(row_factory=namedtuple_row).execute(
        "SELECT source, event_id, event_type, state, body, attempts, last_error, received_at, not_before"
        " FROM waiting_notifications WHERE event_id = %s", [event_id]).fetchone()


def waiting_rows(conn, state="waiting"):
    """How many notifications are in state ('waiting' or 'unknown')."""
    return conn.execute("SELECT count(*) FROM waiting_notifications WHERE state = %s", [state]).fetchone()[0]


def drain(app, conn):
    """Run app's drain (app/receiver/drain.py) until nothing waits that is due, each backoff made due at once (the
    provider answers now); return how many notifications it ended."""
    from app.receiver.drain import Drain

    ended, rounds = 0, Drain(app)
    for _ in range(1000):
        conn.execute("UPDATE waiting_notifications SET not_before = now() WHERE state = 'waiting'")
        done = rounds.round()
        ended += done
        if waiting_rows(conn) == 0:
            return ended
    raise AssertionError(f"the drain left {waiting_rows(conn)} notifications waiting")


def wait_drained(conn, within=60.0):
    """Wait until the served hosts' drains leave nothing waiting (a liveness bound, not a speed check)."""
    deadline = time.monotonic() + within
    while waiting_rows(conn):
        if time.monotonic() > deadline:
            raise AssertionError(f"{waiting_rows(conn)} notifications still wait after {within:g} s")
        time.sleep(0.1)


# A budget no test of one host's deliveries reaches (the budget's own tests set theirs: tests/test_budget.py).
UNMETERED = {"WEBHOOK_API_RATE": "100000", "WEBHOOK_API_RATE_TOTAL": "100000"}


# -- a database as an earlier migration left it ----------------------------------------------------------------

# The journal's CHECKs before 012 (payment_moved rows).
BEFORE_012 = {
    "ledger_journal_kind_check": "kind IN ('credit', 'refund_reversed', 'dispute_reinstated') AND amount_cents > 0"
                                 " OR kind IN ('refund', 'dispute_withdrawn', 'spend') AND amount_cents < 0"
                                 " OR kind = 'adjustment' AND amount_cents <> 0",
    "ledger_journal_names_check": "CASE kind WHEN 'adjustment' THEN num_nonnulls(event_id, movement_id, reference) = 0"
                                  " AND num_nonnulls(source, payment_id) IN (0, 2) AND num_nonnulls(reason, actor) = 2"
                                  " WHEN 'spend' THEN num_nonnulls(source, event_id, payment_id, movement_id, reason,"
                                  " actor) = 0 AND reference IS NOT NULL ELSE num_nonnulls(source, event_id,"
                                  " payment_id) = 3 AND num_nonnulls(reference, reason, actor) = 0 END",
}


def before_012(db):
    """db without migration 012: no ledger_journal.moved_from (its index and CHECKs with it), the CHECKs before."""
    db.execute("DROP VIEW ledger_journal_keyed")  # money.sql's, which reads the column: the next init-db makes it
    db.execute("ALTER TABLE ledger_journal DROP COLUMN moved_from")  # its index and the CHECKs naming it
    db.execute("ALTER TABLE ledger_journal " + ", ".join(f"DROP CONSTRAINT IF EXISTS {name}, ADD CONSTRAINT {name}"
                                                         f" CHECK ({check})" for name, check in BEFORE_012.items()))
    db.execute("DELETE FROM schema_migrations WHERE name = '012_journal_payment_moves.sql'")
