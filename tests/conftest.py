"""Fixtures: real PostgreSQL (pytest-postgresql on a private cluster), real
Redis, the app, and a signer that builds deliveries the way a provider does."""

import json
import shutil
import tempfile
import uuid

import pytest
import redis
from pytest_postgresql import factories

from app import create_app
from app.db import SCHEMA_PATH
from app.signature import generate_signature

from .servers import Gunicorn, Postgres, Redis

SECRET = "whsec-test-0123456789"
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
def config(db, redis_server, redis_client):
    return {
        "DATABASE_URL": db_url(db),
        "REDIS_URL": redis_server.url,
        "WEBHOOK_SECRET": SECRET,
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


def signed_headers(body, secret=SECRET, content_type="application/json"):
    return {"Content-Type": content_type, "X-Signature": generate_signature(body, secret.encode())}


def deliver(client, event, secret=SECRET, **headers):
    body = encode(event)
    return client.post("/api/webhooks", data=body, headers={**signed_headers(body, secret), **headers})


def balance(conn, user=ALICE):
    return conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [user]).fetchone()[0]


def event_rows(conn):
    return conn.execute("SELECT count(*) FROM webhook_events").fetchone()[0]


def assert_ledger_consistent(conn):
    """DESIGN.md invariant 5: no duplicated id; balance = opening + completed credits."""
    assert conn.execute(
        "SELECT event_id FROM webhook_events GROUP BY event_id HAVING count(*) > 1").fetchall() == []
    credits = dict(conn.execute("""
        SELECT (payload->'data'->>'userId')::uuid, sum((payload->'data'->>'amountCents')::bigint)
        FROM webhook_events WHERE status = 'completed' AND event_type = 'payment.succeeded'
        GROUP BY 1""").fetchall())
    for user, opening in OPENING.items():
        assert balance(conn, user) == opening + credits.get(user, 0), user
    assert conn.execute("SELECT count(*) FROM webhook_events WHERE status = 'processing'").fetchone()[0] == 0
