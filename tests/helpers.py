"""What the tests share besides fixtures: the users and secrets, deliveries
built and signed the way a provider builds them, HTTP to a real server, and
the ledger checks."""

import base64
import http.client
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from app import signature

SCHEMES = signature.SCHEMES
# Each scheme's secret, written the way its provider issues it.
SECRETS = {
    "hmac-sha256": "whsec-test-0123456789",
    "stripe": "whsec_test_5tr1pe5ecretF0rTheTests",  # Stripe uses the whole string as the key
    "standard-webhooks": "whsec_" + base64.b64encode(b"a-standard-webhooks-test-key").decode(),
    "github": "github-test-secret-0123456789",
}
SECRET = SECRETS["hmac-sha256"]  # the default scheme's
# The exactly-once tests run once per scheme: the signing helper is what changes.
EVERY_SCHEME = pytest.mark.parametrize("scheme", SCHEMES)
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
    return {"id": event_id or f"evt_{uuid.uuid4().hex}", "type": "payment.succeeded",
            "data": {"userId": str(user), "amountCents": cents, **extra}}


def encode(event):
    return event if isinstance(event, bytes) else json.dumps(event).encode()


def secret_for(scheme, seed):
    """A secret for scheme, written as its provider issues one (e.g. for rotation tests)."""
    return "whsec_" + base64.b64encode(seed.encode()).decode() if scheme == "standard-webhooks" else seed


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


def deliver(client, event, secret=None, **headers):
    """POST event, signed the way the client's app expects."""
    body = encode(event)
    scheme = client.application.config["WEBHOOK_SIGNATURE_SCHEME"]
    return client.post("/api/webhooks", data=body,
                       headers={**signed_headers(body, secret, scheme=scheme), **headers})


def post_delivery(client, body, headers):
    """POST body with exactly these headers, signed or not, through the Flask client."""
    return client.post("/api/webhooks", data=body, headers=headers)


# -- HTTP to a real server ------------------------------------------------------

def _request(base, method, path, body=None, headers=None, timeout=30):
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null"), dict(response.getheaders())
    finally:
        conn.close()


def http_post(base, body, headers, timeout=30):
    """POST body; return (status, parsed JSON body, headers). Raises on connection errors."""
    return _request(base, "POST", "/api/webhooks", body, headers, timeout)


def http_get(base, path, timeout=10):
    """GET path; return (status, parsed JSON body)."""
    return _request(base, "GET", path, timeout=timeout)[:2]


def burst(bases, body, headers, copies=50):
    """Send copies of one delivery at the same instant, spread over bases; return every answer."""
    barrier = threading.Barrier(copies)

    def send(i):
        barrier.wait()
        return http_post(bases[i % len(bases)], body, headers)

    with ThreadPoolExecutor(copies) as pool:
        return list(pool.map(send, range(copies)))


# -- the ledger, read back --------------------------------------------------------

def balance(conn, user=ALICE):
    return conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [user]).fetchone()[0]


def event_rows(conn):
    return conn.execute("SELECT count(*) FROM webhook_events").fetchone()[0]


def assert_ledger_consistent(conn):
    """DESIGN.md invariant 5: no duplicated id; balance = opening + completed credits."""
    assert conn.execute(
        "SELECT event_id FROM webhook_events GROUP BY event_id HAVING count(*) > 1").fetchall() == []
    credits = dict(conn.execute("""
        SELECT user_id, sum(cents) FROM (
            SELECT (payload->'data'->>'userId')::uuid, (payload->'data'->>'amountCents')::bigint
            FROM webhook_events WHERE status = 'completed' AND event_type = 'payment.succeeded'
            UNION ALL
            SELECT (payload #>> '{data,object,metadata,user_id}')::uuid,
                   (payload #>> '{data,object,amount_received}')::bigint
            FROM webhook_events WHERE status = 'completed' AND event_type = 'payment_intent.succeeded'
        ) AS credit (user_id, cents) GROUP BY 1""").fetchall())
    for user, opening in OPENING.items():
        assert balance(conn, user) == opening + credits.get(user, 0), user
    assert conn.execute("SELECT count(*) FROM webhook_events WHERE status = 'processing'").fetchone()[0] == 0
