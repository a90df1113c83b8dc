"""Fixtures: real PostgreSQL (pytest-postgresql on a private cluster), real
Redis, the app, gunicorn, and a signer for the test's scheme. Shared helpers
live in helpers.py."""

import functools
import shutil
import tempfile

import pytest
import redis
from pytest_postgresql import factories

from app import create_app
from app.config import DEFAULT_SOURCE
from app.db import DEFAULT_SCHEMA_PATH
from devservers import Gunicorn, Postgres, Redis

from .helpers import OPENING, SECRETS, db_url, signed_headers, source_secret, sources_config


@pytest.fixture(scope="session")
def pg_server():
    """A private cluster: PostgreSQL refuses to run as root, so it runs as `postgres`."""
    base = tempfile.mkdtemp(prefix="webhook-ledger-pg-")
    server = Postgres(base).init().start()
    server.maintenance_dbname, server.template_dbname = "postgres", None
    yield server
    server.stop("immediate")
    shutil.rmtree(base, ignore_errors=True)


pg_noproc = factories.postgresql_noproc(depends_on="pg_server", load=[DEFAULT_SCHEMA_PATH])
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


@pytest.fixture
def scheme():
    """The deployment's signature scheme; EVERY_SCHEME parametrizes it."""
    return "hmac-sha256"


@pytest.fixture
def source():
    """The source the test's deliveries go to; EVERY_SCHEME_AND_A_NAMED_SOURCE parametrizes it."""
    return DEFAULT_SOURCE


@pytest.fixture
def config(db, redis_server, redis_client, scheme, source):
    config = {
        "DATABASE_URL": db_url(db),
        "REDIS_URL": redis_server.url,
        "WEBHOOK_SECRET": SECRETS[scheme],
        "WEBHOOK_SIGNATURE_SCHEME": scheme,
    }
    # A named source is served beside the default one, under a secret of its
    # own: a delivery sent to the wrong path is refused.
    return config if source == DEFAULT_SOURCE else sources_config(config, {source: scheme})


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


@pytest.fixture
def sign(scheme, source):
    """signed_headers for the test's scheme and source, for deliveries sent to gunicorn."""
    secret = None if source == DEFAULT_SOURCE else source_secret(source, scheme)
    return functools.partial(signed_headers, scheme=scheme, secret=secret)
