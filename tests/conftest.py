"""Fixtures: real PostgreSQL (pytest-postgresql on a private cluster), real
Redis, the app, gunicorn, and a signer for the test's scheme; and the hooks
that hold each test to its tier (tests/tiers.py). Shared helpers live in
helpers.py."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from pytest_postgresql import factories

from app import create_app
from app.config import DEFAULT_SOURCE
from app.db import apply_schema
from devservers import ROOT, Gunicorn, Postgres, Redis, readme

from . import tiers
from .helpers import (
    INSTALLED_SECRET,
    OPENING,
    SECRETS,
    InstalledHost,
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


def _refuse_deploy_programs(event, args):
    """A unit or core test that starts a program of the deploy tier fails before the program runs."""
    if event == "subprocess.Popen":
        refused = tiers.refused_program(RUNNING["tier"], tiers.program(args[0], args[1]))
        if refused:
            raise RuntimeError(refused)


sys.addaudithook(_refuse_deploy_programs)


@pytest.fixture(scope="session")
def pg_server():
    """A private cluster: PostgreSQL refuses to run as root, so it runs as `postgres`."""
    base = tempfile.mkdtemp(prefix="webhook-ledger-pg-")
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


# -- a pip-installed host ------------------------------------------------------

# What a build reads: the checkout without its local state.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".run", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", ".mypy_cache")
# pip may fetch the build backend and the dependencies (or take them from its
# cache and PIP_FIND_LINKS): a build and a fresh install took about 10 s here.
PIP_TIMEOUT = 600


def _as_printed(lines, cwd, prefix=None):
    """Run docs/deploying.md's lines in bash from cwd, with this Python's pip and the venv at prefix."""
    script = "set -e\n" + "\n".join(lines).replace(readme.HOST_PREFIX, str(prefix))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "PIP_QUIET": "1"}
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=PIP_TIMEOUT)
    assert done.returncode == 0, script + "\n" + done.stdout + done.stderr


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The wheel that docs/deploying.md's `pip wheel` builds from a copy of the checkout (a build writes build/
    and egg-info), in dist/ beside requirements.lock."""
    source = tmp_path_factory.mktemp("source") / "webhook-ledger"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCES)
    build, _ = readme.wheel_install()
    _as_printed(build, source)
    (built,) = (source / "dist").glob("webhook_ledger-*.whl")
    return built


@pytest.fixture(scope="session")
def installed_venv(wheel, tmp_path_factory):
    """A fresh virtualenv holding requirements.lock's dependencies, hash-checked, and the wheel, installed as
    docs/deploying.md says, and nothing of the checkout."""
    path = tmp_path_factory.mktemp("host") / "venv"
    _, host = readme.wheel_install()
    _as_printed(host, wheel.parent, prefix=path)
    return path


@pytest.fixture
def installed_host(installed_venv, pg_server, redis_server, tmp_path):
    """The installed host on a fresh, empty database; its environment holds nothing of the checkout's."""
    dbname = f"installed_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTHON", "VIRTUAL_ENV", "WEBHOOK_", "FLASK_", "PROMETHEUS_"))}
    env.update(PATH=f"{installed_venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
               DATABASE_URL=pg_server.url(dbname), REDIS_URL=redis_server.url, WEBHOOK_SECRET=INSTALLED_SECRET)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    yield InstalledHost(installed_venv, env, workdir, pg_server.url(dbname))
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{dbname}" WITH (FORCE)')
