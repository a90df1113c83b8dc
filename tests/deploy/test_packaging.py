"""A pip-installed host: the wheel built from this checkout, installed in a
fresh virtualenv with requirements.lock's dependencies by docs/deploying.md's
own commands (the fixtures read them from the page), runs init-db, gunicorn
and every `flask` command from a folder outside the checkout, and carries the
runtime only."""

import json
import os
import re
import signal
import subprocess
import zipfile
from pathlib import Path

import psycopg
import pytest

from devservers import ROOT, free_port, wait_until

from ..helpers import ALICE, UNKNOWN_USER, encode, http_get, payment, send, signed_headers
from .host import INSTALLED_SECRET

# One worker of `make test` (pytest-xdist) builds the wheel and installs the host, once for the
# modules that use them (test_packaging, test_systemd, test_reconcile_timer).
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("installed-host")]


def test_the_wheel_holds_the_runtime_and_the_schema_only(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        schema, money = archive.read("app/schema.sql"), archive.read("app/money.sql")
        migrations = {name.removeprefix("app/migrations/"): archive.read(name)
                      for name in names if name.startswith("app/migrations/")}
        conf = archive.read(next(n for n in names if n.endswith(".data/data/share/webhook-ledger/gunicorn.conf.py")))
    release = "-".join(wheel.name.split("-")[:2])  # webhook_ledger-<version>
    assert {name.split("/")[0] for name in names} == {
        "app", "wsgi.py", f"{release}.dist-info", f"{release}.data"}, names
    assert not [n for n in names if n.startswith(("devservers/", "tests/", "scripts/", "deploy/"))]
    # Every module of the package, its sub-packages' too (setup.cfg's packages names each).
    modules = {str(path.relative_to(ROOT)) for path in (ROOT / "app").rglob("*.py") if "__pycache__" not in path.parts}
    assert modules <= set(names), modules - set(names)
    # Copies of the checkout's files, byte for byte (app/schema.sql and app/migrations are symlinks to the
    # top-level ones).
    assert schema == (ROOT / "schema.sql").read_bytes()
    assert money == (ROOT / "money.sql").read_bytes()
    assert migrations == {path.name: path.read_bytes() for path in (ROOT / "migrations").glob("*.sql")}  # none in 1.0
    assert "app/receiver/openapi.json" in names
    assert conf == (ROOT / "gunicorn.conf.py").read_bytes()


def test_the_installed_host_runs_the_exact_versions_of_requirements_lock(installed_venv):
    locked = {name.lower().replace("_", "-"): version
              for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.lock").read_text(),
                                              re.M)}
    listed = subprocess.run([str(installed_venv / "bin" / "pip"), "list", "--format=json"], capture_output=True,
                            text=True, check=True, timeout=60).stdout
    installed = {package["name"].lower().replace("_", "-"): package["version"] for package in json.loads(listed)}
    for name in ("webhook-ledger", "pip", "setuptools"):
        installed.pop(name, None)
    assert installed and {name: locked.get(name) for name in installed} == installed


def _installed_python(host, code):
    """What the installed host's Python prints for code, run from outside the checkout."""
    assert ROOT not in host.workdir.parents
    done = subprocess.run([str(host.venv / "bin" / "python"), "-c", code], cwd=host.workdir, env=host.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_installed_host_imports_the_installed_package(installed_host):
    location = _installed_python(installed_host, "import app.serving.logformat, wsgi; print(app.__file__)")
    assert Path(location).is_relative_to(installed_host.venv), location


def test_the_installed_host_has_no_test_tooling(installed_host):
    assert _installed_python(installed_host, "import importlib.util; print(importlib.util.find_spec('devservers'))") \
        == "None"


def test_an_installed_host_runs_every_command_from_outside_the_checkout(installed_host):
    """init-db twice, gunicorn with the shipped settings, deliveries, and every `flask` command."""
    host = installed_host
    shipped = next(host.venv.glob("lib/python*/site-packages/app/schema.sql"))
    assert host.flask("init-db").strip() == f"created the schema from {shipped}"
    assert host.flask("init-db").strip() == "schema up to date: no migration to apply"  # safe on every deploy
    with psycopg.connect(host.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [ALICE])

    port = free_port()
    server = subprocess.Popen(
        [str(host.venv / "bin" / "gunicorn"), "-c", str(host.gunicorn_conf), "wsgi:app"], cwd=host.workdir,
        env={**host.env, "PORT": str(port), "WEB_CONCURRENCY": "1", "GUNICORN_THREADS": "2"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.poll() is not None or _healthy(base), timeout=30, what="installed gunicorn")
        assert server.poll() is None, server.stdout.read()
        assert http_get(base, "/ready") == (200, {"status": "ok", "postgres": "ok", "redis": "ok"})
        body = encode(payment("evt_installed", cents=700))
        headers = signed_headers(body, INSTALLED_SECRET)
        assert send(base, body, headers)[:2] == (200, {"status": "processed", "event_id": "evt_installed"})
        assert send(base, body, headers)[:2] == (200, {"status": "duplicate", "event_id": "evt_installed"})
        # A payment to a user not there yet is recorded as failed, for `events replay` below.
        body = encode(payment("evt_later", user=UNKNOWN_USER, cents=300))
        assert send(base, body, secret=INSTALLED_SECRET).status == 422
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert server.returncode == 0, output

    assert "evt_installed" in host.flask("events", "list")
    assert "evt_later" in host.flask("events", "show", "evt_later")
    with psycopg.connect(host.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    assert "processed" in host.flask("events", "replay", "evt_later")
    assert "ledger consistent" in host.flask("ledger", "verify")
    host.flask("events", "purge")
    host.flask("redis", "forget-done")
    with psycopg.connect(host.db_url) as conn:
        balances = dict(conn.execute("SELECT user_id, balance_cents FROM user_balances").fetchall())
    assert balances == {ALICE: 700, UNKNOWN_USER: 300}


def _healthy(base):
    try:
        return http_get(base, "/health", timeout=1)[0] == 200
    except OSError:
        return False
