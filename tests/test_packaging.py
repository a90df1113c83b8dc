"""A pip-installed host: the wheel built from this checkout, installed in a
fresh virtualenv, runs init-db, gunicorn and every `flask` command from a
folder outside the checkout, and carries the runtime only."""

import os
import shutil
import signal
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import psycopg
import pytest

from devservers import ROOT, free_port, wait_until

from .helpers import ALICE, UNKNOWN_USER, encode, http_get, http_post, payment, signed_headers

# What a build reads: the checkout without its local state.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".run", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis")
# Where the wheel puts gunicorn's settings, under the environment's prefix (setup.cfg's data_files).
GUNICORN_CONF = Path("share", "webhook-ledger", "gunicorn.conf.py")
SECRET = "installed-host-secret"
# pip may fetch the build backend and the dependencies (or take them from its
# cache and PIP_FIND_LINKS): a fresh install took about 10 s here.
PIP_TIMEOUT = 600


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel that `pip wheel .` builds from a copy of the checkout (a build writes build/ and egg-info)."""
    source = tmp_path_factory.mktemp("source") / "webhook-ledger"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCES)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("webhook_ledger-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtualenv with the wheel and its dependencies installed, and nothing of the checkout."""
    path = tmp_path_factory.mktemp("host") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(path / "bin" / "pip"), "install", "--quiet", str(wheel)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return path


@pytest.fixture
def host(venv, pg_server, redis_server, tmp_path):
    """The installed host's environment, on a fresh database; its working directory is outside the checkout."""
    dbname = f"installed_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTHON", "VIRTUAL_ENV", "WEBHOOK_", "FLASK_"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", DATABASE_URL=pg_server.url(dbname),
               REDIS_URL=redis_server.url, WEBHOOK_SECRET=SECRET)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    assert ROOT not in workdir.parents
    yield env, workdir, pg_server.url(dbname)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{dbname}" WITH (FORCE)')


def flask(venv, host, *args):
    env, workdir, _ = host
    done = subprocess.run([str(venv / "bin" / "flask"), "--app", "app", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_the_wheel_holds_the_runtime_and_the_schema_only(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        schema = archive.read("app/schema.sql")
        conf = archive.read(next(n for n in names if n.endswith("/data/" + GUNICORN_CONF.as_posix())))
    tops = {name.split("/")[0] for name in names}
    release = "-".join(wheel.name.split("-")[:2])  # webhook_ledger-<version>
    assert tops == {"app", "wsgi.py", "logformat.py", f"{release}.dist-info", f"{release}.data"}, tops
    assert not [n for n in names if n.startswith(("devservers/", "tests/", "scripts/", "deploy/"))]
    # The copies are the checkout's files, byte for byte (the package's schema.sql is a symlink to the top one).
    assert schema == (ROOT / "schema.sql").read_bytes()
    assert conf == (ROOT / "gunicorn.conf.py").read_bytes()


def test_the_installed_package_is_not_the_checkout(venv, host):
    env, workdir, _ = host
    probe = ("import importlib.util, app, wsgi, logformat\n"
             "print(app.__file__, importlib.util.find_spec('devservers'))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    location, devservers = done.stdout.split()
    assert Path(location).is_relative_to(venv) and devservers == "None", done.stdout


def test_an_installed_host_inits_its_database_serves_and_runs_every_command(venv, host):
    env, workdir, url = host
    out = flask(venv, host, "init-db")
    assert out.strip() == f"applied {next(venv.glob('lib/python*/site-packages/app/schema.sql'))}"
    assert "applied" in flask(venv, host, "init-db")  # safe to apply again
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [ALICE])

    port = free_port()
    server = subprocess.Popen(
        [str(venv / "bin" / "gunicorn"), "-c", str(venv / GUNICORN_CONF), "wsgi:app"], cwd=workdir,
        env={**env, "PORT": str(port), "WEB_CONCURRENCY": "1", "GUNICORN_THREADS": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(base) or server.poll() is not None, timeout=30, what="installed gunicorn")
        assert server.poll() is None, server.stdout.read()
        assert http_get(base, "/ready") == (200, {"status": "ok", "postgres": "ok", "redis": "ok"})
        body = encode(payment("evt_installed", cents=700))
        headers = signed_headers(body, SECRET)
        assert http_post(base, body, headers)[:2] == (200, {"status": "processed", "event_id": "evt_installed"})
        assert http_post(base, body, headers)[:2] == (200, {"status": "duplicate", "event_id": "evt_installed"})
        # A payment to a user not there yet is recorded as failed, for `events replay`.
        body = encode(payment("evt_later", user=UNKNOWN_USER, cents=300))
        assert http_post(base, body, signed_headers(body, SECRET))[0] == 422
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert server.returncode == 0, output

    assert "evt_installed" in flask(venv, host, "events", "list")
    assert "evt_later" in flask(venv, host, "events", "show", "evt_later")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    assert "processed" in flask(venv, host, "events", "replay", "evt_later")
    assert "ledger consistent" in flask(venv, host, "ledger", "verify")
    flask(venv, host, "events", "purge")
    flask(venv, host, "redis", "forget-done")
    with psycopg.connect(url) as conn:
        balances = dict(conn.execute("SELECT user_id, balance_cents FROM user_balances").fetchall())
    assert balances == {ALICE: 700, UNKNOWN_USER: 300}


def _answers(base):
    try:
        return http_get(base, "/health", timeout=1)[0] == 200
    except OSError:
        return False
