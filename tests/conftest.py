"""Fixtures: real PostgreSQL (pytest-postgresql on a private cluster), real
Redis, the app, and a signer that builds deliveries the way a provider does."""

import base64
import functools
import json
import shutil
import tempfile
import time
import uuid

import pytest
import redis
from pytest_postgresql import factories

from app import create_app, signature
from app.db import SCHEMA_PATH

from .servers import Gunicorn, Postgres, Redis

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
OPENING = {ALICE: 1000, BOB: 0}


@pytest.fixture(scope="session")
def pg_server():
    """A private cluster: PostgreSQL refuses to run as root, so it runs as `postgres`."""
    base = tempfile.mkdtemp(prefix="webhook-ledger-pg-")
    server = Postgres(base).init().start()
    server.maintenance_dbname, server.template_dbname = "postgres", None
    yield server
    server.stop("immediate")
    shutil.rmtree(base, ignore_errors=True)


pg_noproc = factories.postgresql_noproc(depends_on="pg_server", load=[SCHEMA_PATH])
postgresql = factories.postgresql("pg_noproc")


@pytest.fixture
def db(postgresql):
    """The test's fresh database (schema loaded), in autocommit for checks."""
    postgresql.autocommit = True
    with postgresql.cursor() as cur:
        for user, cents in OPENING.items():
            cur.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s)", [user, cents])
    return postgresql


@pytest.fixture(scope="session")
def redis_server():
    server = Redis().start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


def db_url(conn):
    info = conn.info
    return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture
def scheme():
    """The deployment's signature scheme; EVERY_SCHEME parametrizes it."""
    return "hmac-sha256"


@pytest.fixture
def config(db, redis_server, redis_client, scheme):
    return {
        "DATABASE_URL": db_url(db),
        "REDIS_URL": redis_server.url,
        "WEBHOOK_SECRET": SECRETS[scheme],
        "WEBHOOK_SIGNATURE_SCHEME": scheme,
    }


@pytest.fixture
def make_app():
    apps = []

    def make(config):
        app = create_app(config)
        app.config["TESTING"] = True
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["db_pool"].close()


@pytest.fixture
def app(make_app, config):
    return make_app(config)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def gunicorn(config, tmp_path):
    """Start real gunicorn servers on the test's database and Redis."""
    servers = []

    def start(workers=2, threads=4, **env):
        server = Gunicorn({**config, **{k: str(v) for k, v in env.items()}}, workers, threads,
                          log_path=tmp_path / f"gunicorn-{len(servers)}.log").start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


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
    secrets = [secret or SECRETS[scheme]] if not isinstance(secret, list) else secret
    keys = [signing_key(s, scheme) for s in secrets]
    timestamp = int(time.time()) if timestamp is None else timestamp
    event_id = event_id or _body_id(body) or f"msg_{uuid.uuid4().hex}"
    if scheme == "hmac-sha256":
        signed = signature.generate_hmac_sha256(body, keys[0])
    elif scheme == "stripe":
        signed = signature.generate_stripe(body, keys, timestamp)
    elif scheme == "standard-webhooks":
        signed = signature.generate_standard_webhooks(body, keys, event_id, timestamp)
    else:
        signed = {**signature.generate_github(body, keys[0]),
                  "X-GitHub-Delivery": event_id, "X-GitHub-Event": github_event}
    return {"Content-Type": content_type, **signed}


@pytest.fixture
def sign(scheme):
    """signed_headers for the test's scheme, for deliveries sent to gunicorn."""
    return functools.partial(signed_headers, scheme=scheme)


def deliver(client, event, secret=None, **headers):
    """POST event, signed the way the client's app expects."""
    body = encode(event)
    scheme = client.application.config["WEBHOOK_SIGNATURE_SCHEME"]
    return client.post("/api/webhooks", data=body,
                       headers={**signed_headers(body, secret, scheme=scheme), **headers})


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
