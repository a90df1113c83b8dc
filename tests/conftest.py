"""Fixtures: real PostgreSQL (pytest-postgresql on a private cluster), real
Redis, the app, gunicorn, and a signer for the test's scheme; and the hooks
that hold each test to its tier (tests/tiers.py). Shared helpers live in
helpers.py."""

import functools
import os
import shutil
import sys
import tempfile

import psycopg
import pytest
import redis
from pytest_postgresql import factories

from app import create_app
from app.settings.config import DEFAULT_SOURCE
from app.store.db import apply_schema
from devservers import Gunicorn, Postgres, Redis
from devservers.paypal_stand_in import PayPalStandIn
from devservers.stripe_stand_in import StripeStandIn

from . import tiers
from .helpers import (
    OPENING,
    SECRETS,
    db_url,
    signed_headers,
    source_secret,
    sources_config,
)

# -- the tiers (tests/tiers.py, docs/testing.md) ---------------------------------

# The tier of the test being set up, run or torn down, for the audit hook below.
RUNNING = {"tier": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture starts: a test whose module declares no tier, or that asks for a fixture beyond its
    tier, fails at once."""
    RUNNING["tier"] = tiers.tier(item)
    if RUNNING["tier"] is None:
        pytest.fail(f"{item.path.name} declares no tier: add pytestmark = pytest.mark.unit, core or deploy "
                    "(docs/testing.md)", pytrace=False)
    refused = tiers.refused_fixtures(RUNNING["tier"], item.fixturenames)
    if refused:
        pytest.fail(f"a {RUNNING['tier']} test asks for {refused}: mark it with the tier they need "
                    "(docs/testing.md)", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """A test's teardown may stop what a test of another tier started (the session's servers: `pg_ctl stop`)."""
    RUNNING["tier"] = None


def _refuse_programs(event, args):
    """A unit test that starts any program, or a core test that starts one of the deploy tier, fails before the
    program runs."""
    if event == "subprocess.Popen" and RUNNING["tier"]:
        refused = tiers.refused_program(RUNNING["tier"], tiers.program(args[0], args[1]))
        if refused:
            raise RuntimeError(refused)


sys.addaudithook(_refuse_programs)


# -- pytest-xdist's groups (`make test`: -n 3 --dist loadgroup, docs/testing.md) ---

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """A test marked xdist_group(name) runs on its group's worker: pytest 9.2 no longer reads the `@name` suffix
    pytest-xdist 3.8 gives its id (pytest-dev/pytest-xdist#1386), so this sets it where pytest reads it."""
    if not getattr(config.option, "loadgroup", False):  # set in each worker of --dist loadgroup
        return
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):
            item._id = type(item._id).parse(item.nodeid + suffix)


# -- the servers: each pytest process's own (under pytest-xdist, each worker's) -------

# Where the session's cluster goes when it has room: a tmpfs (docs/testing.md, "Where the time goes").
MEMORY_DIR, MEMORY_DIR_ROOM = "/dev/shm", 2 << 30


def cluster_parent():
    """The folder of the session's cluster: /dev/shm when it has 2 GiB free (a test database's ~900 files cost
    0.13-0.2 s of CPU each to make and drop on ext4, 0.045 s on a tmpfs; docs/testing.md), else the temporary one."""
    try:
        room = os.statvfs(MEMORY_DIR)
    except OSError:
        return None
    return MEMORY_DIR if room.f_bavail * room.f_frsize >= MEMORY_DIR_ROOM else None


@pytest.fixture(scope="session")
def pg_server():
    """A private cluster, one per pytest-xdist worker: PostgreSQL refuses to run as root, so it runs as `postgres`."""
    base = tempfile.mkdtemp(prefix="webhook-ledger-pg-", dir=cluster_parent())
    server = Postgres(base).init().start()
    server.maintenance_dbname, server.template_dbname = "postgres", None
    yield server
    server.stop("immediate")
    shutil.rmtree(base, ignore_errors=True)


def load_schema(**connect):
    """pytest-postgresql's loader: each test's database as `flask init-db` makes it (migrations recorded)."""
    with psycopg.connect(**connect) as conn:
        apply_schema(conn)


pg_noproc = factories.postgresql_noproc(depends_on="pg_server", load=[load_schema])
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
    """A redis-server of this worker's own, which its flushall alone empties."""
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


@pytest.fixture(scope="session")
def paypal_api_server():
    stand_in = PayPalStandIn().start()
    yield stand_in
    stand_in.close()


@pytest.fixture
def paypal_api(paypal_api_server):
    """PayPal's REST API (token, events) on loopback, holding no event and failing nothing: this test's alone."""
    paypal_api_server.reset()
    return paypal_api_server


@pytest.fixture(scope="module")
def stripe_api_server():
    with StripeStandIn() as stand_in:
        yield stand_in


@pytest.fixture
def stripe_api(stripe_api_server):
    """Stripe's API on loopback (devservers/stripe_stand_in.py), shared by a module's tests, failing nothing and
    answering at once."""
    stripe_api_server._faults.clear()
    stripe_api_server.delay = 0.0
    return stripe_api_server
