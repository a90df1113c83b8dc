"""Fixtures of the deploy tier only: the wheel, built as docs/deploying.md builds it, and a host that
installed it. A test outside tests/deploy/ cannot ask for them."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from devservers import ROOT, readme

from .host import INSTALLED_SECRET, InstalledHost

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
