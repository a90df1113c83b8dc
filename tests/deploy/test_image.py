"""The Dockerfile, built and run as a user would (with podman: no Docker
engine here), on a Debian-made Python base (devservers/image.py), against
throwaway PostgreSQL and Redis: init-db through the image, the README's
signed curl twice, the probes and /metrics, a non-root process, the
HEALTHCHECK kept, and a SIGTERM with a delivery in flight (answered, then
exit 0). Sizes and timings are printed in the test run's output."""

import json
import os
import subprocess
import threading
import time
import urllib.request
import uuid

import psycopg
import pytest

from app import __version__
from devservers import free_port, readme, wait_until
from devservers import image as images
from devservers.packages import IMAGE, find, image_test_skipped

from ..helpers import http_get, samples, send

DEMO_USER = uuid.UUID("00000000-0000-4000-8000-000000000001")  # the README's curl credits it
DEMO_SECRET = "dev-secret-change-me"  # the README's curl signs with it
APP_UID = 10001  # the Dockerfile's `app` user
TAG = "localhost/webhook-ledger:test"
# A delivery must still be waiting on a row lock when SIGTERM comes: the
# database timeouts are raised for this container, still nested (lock <
# statement < pool < Redis lock TTL <= gunicorn's timeout, 30 s).
SLOW_DATABASE = {"PG_LOCK_TIMEOUT_MS": "8000", "PG_STATEMENT_TIMEOUT_MS": "9000",
                 "PG_POOL_TIMEOUT_MS": "10000", "LOCK_TTL_MS": "15000"}
# How long the in-flight delivery is held after SIGTERM: the server must stay up meanwhile.
HELD_AFTER_SIGTERM_S = 2.0

# One worker of `make test` (pytest-xdist) builds the image and runs its container, once for the module.
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("image"),
              pytest.mark.skipif(image_test_skipped(), reason="IMAGE_TEST=skip: podman cannot run here")]


@pytest.fixture(scope="module")
def report(request):
    """Lines for the closing note: printed after the module, even without -s."""
    lines = []
    yield lines
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    # Past pytest's capture of the test's output, as capsys.disabled() does.
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        terminal.write_line("")
        for line in lines:
            terminal.write_line(f"test_image: {line}")


@pytest.fixture(scope="module")
def built(report):
    """The project's image id, built on the Debian-made Python base; its sizes and timings go to the report."""
    lacking = [package for name, package in IMAGE.items() if not find(name)]
    if lacking:
        pytest.skip(f"podman cannot run here, missing {' '.join(lacking)} (`make test` installs them as root)")
    if os.geteuid() != 0:
        pytest.skip("the image test runs as root (rootful podman, mmdebstrap's root mode), as CI does")
    timings = {}
    started = time.monotonic()
    base = images.python_base(timings)
    image = images.build_app(TAG, base, timings)
    timings["bases and image, in all"] = time.monotonic() - started
    report.append(f"image {image[:19]}: {images.size_mb(image):.0f} MB; python base {images.size_mb(base):.0f} MB, "
                  f"debian base {images.size_mb(images.debian_base()):.0f} MB")
    if "python base made" not in timings:
        report.append("the bases were cached in podman's storage")
    report.extend(f"{what}: {seconds:.1f} s" for what, seconds in timings.items())
    return image


@pytest.fixture(scope="module")
def database(pg_server):
    """An empty database of its own: init-db through the image creates the schema."""
    name = f"image_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.url(name)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def settings(database, redis_server):
    return {"DATABASE_URL": database, "REDIS_URL": redis_server.url, "WEBHOOK_SECRET": DEMO_SECRET}


def run_args(settings):
    env = [arg for name, value in settings.items() for arg in ("--env", f"{name}={value}")]
    return ["run", "--network", "host", *env]


@pytest.fixture(scope="module")
def schema(built, settings, database, report):
    started = time.monotonic()
    images.podman(*run_args(settings), "--rm", built, "flask", "--app", "app", "init-db", timeout=120)
    report.append(f"init-db through the image: {time.monotonic() - started:.1f} s")
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [DEMO_USER])
    return database


@pytest.fixture(scope="module")
def container(built, schema, settings, report):
    """The image's own CMD, on a free port of the host's network; (name, base URL)."""
    name, port = f"webhook-ledger-test-{uuid.uuid4().hex[:8]}", free_port()
    env = {**settings, **SLOW_DATABASE, "BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "2"}
    started = time.monotonic()
    images.podman(*run_args(env), "--detach", "--name", name, built, timeout=120)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(base), timeout=30, what="the container's /health")
        report.append(f"container up (/health answers): {time.monotonic() - started:.1f} s")
        yield name, base
    finally:
        images.podman("rm", "--force", "--time", "0", name, check=False, timeout=60)


def _answers(base):
    try:
        return http_get(base, "/health", timeout=1)[0] == 200
    except OSError:
        return False


def readme_curl(base):
    """The README's smoke test, its URL pointed at base, run by bash (curl and openssl)."""
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", readme.smoke_test(base)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_readme_curl_is_processed_then_a_duplicate(container, schema):
    _, base = container
    assert readme_curl(base) == '{"event_id":"evt_demo_1","status":"processed"}'
    assert readme_curl(base) == '{"event_id":"evt_demo_1","status":"duplicate"}'
    with psycopg.connect(schema) as conn:
        balance = conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [DEMO_USER]).fetchone()
    assert balance == (1000,)


def test_probes_and_metrics_answer(container):
    _, base = container
    assert http_get(base, "/health") == (200, {"status": "ok", "version": __version__})
    assert http_get(base, "/ready") == (200, {"status": "ok", "postgres": "ok", "redis": "ok"})
    assert "webhook_ledger_deliveries_total" in metrics(base)


def test_metrics_count_the_deliveries_across_workers(container):
    _, base = container
    readme_curl(base)  # a duplicate by now, whichever order the tests ran in
    counted = {labels: value for (name, labels), value in samples(metrics(base)).items()
               if name == "webhook_ledger_deliveries_total"}
    assert counted[(("outcome", "processed"), ("reason", ""), ("source", "default"))] == 1
    assert counted[(("outcome", "duplicate"), ("reason", ""), ("source", "default"))] >= 1


def metrics(base):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        return response.read().decode()


def test_every_process_runs_as_the_app_user_not_root(container):
    name, _ = container
    uids = images.podman("exec", name, "sh", "-c", "grep -h '^Uid:' /proc/[0-9]*/status", timeout=30)
    real = {int(line.split()[1]) for line in uids.splitlines()}
    assert real == {APP_UID}, uids


def test_the_built_image_keeps_the_dockerfiles_healthcheck(built):
    healthcheck = images.podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", built, timeout=30)
    assert "/health" in healthcheck


def test_the_healthcheck_passes_in_the_running_container(container):
    name, _ = container
    images.podman("healthcheck", "run", name, timeout=30)  # raises on a failing check


def test_logs_carry_deliveries_but_no_secret(container):
    name, base = container
    readme_curl(base)
    logs = images.podman("logs", name, timeout=30)
    assert "evt_demo_1" in logs
    assert DEMO_SECRET not in logs


def test_sigterm_answers_the_delivery_in_flight_then_exits_0(container, schema, report):
    name, base = container
    event = {"id": "evt_in_flight", "type": "payment.succeeded",
             "data": {"userId": str(DEMO_USER), "amountCents": 5}}
    body = json.dumps(event).encode()
    answers = []
    with psycopg.connect(schema) as holder:
        # Hold the demo user's row: the delivery's transaction waits on it.
        holder.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [DEMO_USER])
        sender = threading.Thread(target=lambda: answers.append(
            send(base, body, secret=DEMO_SECRET, timeout=30)))
        sender.start()
        with psycopg.connect(schema, autocommit=True) as watcher:
            wait_until(lambda: _waiting_on_a_lock(watcher), timeout=10, what="the delivery to wait on the row")
        stopped = time.monotonic()
        images.podman("kill", "--signal", "TERM", name, timeout=30)
        time.sleep(HELD_AFTER_SIGTERM_S)
        assert answers == [], "answered before its transaction could commit"
        assert images.podman("inspect", "--format", "{{.State.Running}}", name, timeout=30).strip() == "true"
        holder.rollback()
    sender.join(30)
    exit_code = images.podman("wait", name, timeout=60).strip()
    report.append(f"SIGTERM to exit with a delivery in flight (held {HELD_AFTER_SIGTERM_S:.0f} s): "
                  f"{time.monotonic() - stopped:.1f} s")
    assert answers and answers[0][:2] == (200, {"event_id": "evt_in_flight", "status": "processed"})
    assert exit_code == "0"


def _waiting_on_a_lock(conn):
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()").fetchone()[0] == 1

