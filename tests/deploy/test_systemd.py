"""deploy/systemd: the units pass `systemd-analyze verify` and score as
hardened by `systemd-analyze security`, checked against a real virtualenv
holding the wheel (verify insists that ExecStart exists); and the service's
own command line, environment and stop signal, run as systemd runs them
(readiness on NOTIFY_SOCKET, a socket handed over by socket activation),
serve a delivery and stop gracefully with one in flight.

systemd is not PID 1 here, so the hardening options themselves are not
applied by these tests: what runs is the unit's command and environment."""

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from devservers import ROOT, free_port, packages, wait_until

from ..helpers import ALICE, debian_program, encode, http_get, payment, send
from .host import INSTALLED_SECRET

# One worker of `make test` (pytest-xdist) builds the wheel and installs the host, once for the
# modules that use them (test_packaging, test_systemd, test_reconcile_timer).
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("installed-host")]

UNITS = ROOT / "deploy" / "systemd"
SERVICE, SOCKET = "webhook-ledger.service", "webhook-ledger.socket"
# flask reconcile's, a template per source; verified as an instance (a link named for it, as systemctl does).
RECONCILE, TIMER = "webhook-ledger-reconcile@.service", "webhook-ledger-reconcile@.timer"
RECONCILE_DEFAULT, TIMER_DEFAULT = "webhook-ledger-reconcile@default.service", "webhook-ledger-reconcile@default.timer"
# flask audit's, the same way; installed, but off until its timer is enabled.
AUDIT, AUDIT_TIMER = "webhook-ledger-audit@.service", "webhook-ledger-audit@.timer"
AUDIT_DEFAULT, AUDIT_TIMER_DEFAULT = "webhook-ledger-audit@default.service", "webhook-ledger-audit@default.timer"
ENV_EXAMPLE = UNITS / "webhook-ledger.env"
# Where the units expect the virtualenv; the tests put theirs there instead.
PREFIX = "/opt/webhook-ledger"
# systemd-analyze security's scale: 0 (everything locked) to 10; under 2 it says "OK".
MAX_EXPOSURE = 2.0
# systemd's PATH for services, not the test's (which holds the checkout's venv).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"



@pytest.fixture(scope="module", autouse=True)
def systemd_tools():
    if not debian_program("systemd-analyze"):
        pytest.skip(f"systemd-analyze not found: apt-get install {packages.package('systemd-analyze')} "
                    "(make test does, as root)")


def read_unit(text):
    """{section: {key: [values]}} of a unit file (a key may repeat)."""
    unit, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = unit.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key, []).append(value)
    return unit


@pytest.fixture
def units(installed_venv, tmp_path):
    """The committed units, with the test's virtualenv where they expect /opt/webhook-ledger."""
    folder = tmp_path / "units"
    folder.mkdir()
    for name in (SERVICE, SOCKET, RECONCILE, TIMER, AUDIT, AUDIT_TIMER):
        (folder / name).write_text((UNITS / name).read_text().replace(PREFIX, str(installed_venv)))
    (folder / RECONCILE_DEFAULT).symlink_to(RECONCILE)
    (folder / TIMER_DEFAULT).symlink_to(TIMER)
    (folder / AUDIT_DEFAULT).symlink_to(AUDIT)
    (folder / AUDIT_TIMER_DEFAULT).symlink_to(AUDIT_TIMER)
    return folder


def test_the_units_verify_clean(units):
    done = subprocess.run(["systemd-analyze", "verify", SERVICE, SOCKET, f"./{RECONCILE_DEFAULT}",
                           f"./{TIMER_DEFAULT}", f"./{AUDIT_DEFAULT}", f"./{AUDIT_TIMER_DEFAULT}"], cwd=units,
                          capture_output=True, text=True, timeout=60)
    # verify exits 0 on an option it cannot parse ("ignoring"): any output is a finding.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_reconcile_service_runs_the_sources_reconcile_with_the_services_settings():
    """test_reconcile_timer.py checks the timer that starts it, hourly."""
    service = read_unit((UNITS / RECONCILE).read_text())["Service"]
    assert service["ExecStart"] == [f"{PREFIX}/bin/flask --app app reconcile %i"]
    assert service["EnvironmentFile"] == read_unit((UNITS / SERVICE).read_text())["Service"]["EnvironmentFile"]


def test_a_reconcile_run_that_yields_to_another_is_no_failure_of_the_unit():
    service = read_unit((UNITS / RECONCILE).read_text())["Service"]
    assert service["Type"] == ["oneshot"] and service["SuccessExitStatus"] == ["75"]  # cli.YIELDED_EXIT


def test_the_reconcile_run_writes_its_counts_in_the_services_metrics_folder_as_the_service_s_user():
    """What a run applies reaches /metrics (app/receiver/metrics.py): one folder, one dynamic user, for both units."""
    service = read_unit((UNITS / SERVICE).read_text())["Service"]
    reconcile = read_unit((UNITS / RECONCILE).read_text())["Service"]
    assert "PROMETHEUS_MULTIPROC_DIR=%t/webhook-ledger" in service["Environment"]
    assert "PROMETHEUS_MULTIPROC_DIR=%t/webhook-ledger" in reconcile["Environment"]
    assert service["RuntimeDirectory"] == ["webhook-ledger"] and reconcile["ReadWritePaths"] == ["-%t/webhook-ledger"]
    assert (reconcile["User"], reconcile["DynamicUser"]) == (service["User"], service["DynamicUser"])


def test_the_audit_service_runs_the_sources_audit_with_the_services_settings_daily():
    service = read_unit((UNITS / AUDIT).read_text())["Service"]
    assert service["ExecStart"] == [f"{PREFIX}/bin/flask --app app audit %i"]
    assert service["Type"] == ["oneshot"]
    assert service["EnvironmentFile"] == read_unit((UNITS / SERVICE).read_text())["Service"]["EnvironmentFile"]
    assert read_unit((UNITS / AUDIT_TIMER).read_text())["Timer"]["OnCalendar"] == ["daily"]


@pytest.mark.parametrize("unit", [SERVICE, RECONCILE_DEFAULT, AUDIT_DEFAULT])
def test_the_service_is_hardened(units, unit):
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", f"./{unit}"], cwd=units,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)[1])
    assert exposure <= MAX_EXPOSURE, done.stdout


def test_the_service_stops_after_gunicorns_graceful_timeout_not_before():
    service = read_unit((UNITS / SERVICE).read_text())["Service"]
    graceful = int(re.search(r"^graceful_timeout = (\d+)$", (ROOT / "gunicorn.conf.py").read_text(), re.M)[1])
    assert service["KillMode"] == ["mixed"]  # SIGTERM to the master alone: it stops its workers
    assert int(service["TimeoutStopSec"][0]) > graceful
    assert service["Type"] == ["notify"] and service["RestartPreventExitStatus"] == ["78"]


def test_the_example_environment_file_names_only_documented_settings():
    readme = (ROOT / "docs" / "configuration.md").read_text()  # the settings table
    names = re.findall(r"^#?([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.M)
    assert names and all(f"| `{name}` |" in readme for name in names), names


@pytest.fixture
def service(installed_host, tmp_path):
    """The service's ExecStart, working directory and environment, as systemd would give them."""
    runtime = tmp_path / "run"  # %t; systemd makes RuntimeDirectory= under it
    text = (UNITS / SERVICE).read_text().replace(PREFIX, str(installed_host.venv)).replace("%t", str(runtime))
    service = read_unit(text)["Service"]
    (runtime / service["RuntimeDirectory"][0]).mkdir(parents=True)
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}
    env.update(value.split("=", 1) for value in service.get("Environment", []))
    # EnvironmentFile=: the host's settings (the example file's names, with this test's servers).
    env.update({name: installed_host.env[name] for name in ("DATABASE_URL", "REDIS_URL", "WEBHOOK_SECRET")},
               BIND=f"127.0.0.1:{free_port()}", WEB_CONCURRENCY="1", GUNICORN_THREADS="2")
    installed_host.flask("init-db")
    with psycopg.connect(installed_host.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [ALICE])
    return shlex.split(service["ExecStart"][0]), Path(service["WorkingDirectory"][0]), env


@contextlib.contextmanager
def running(service, tmp_path, **settings):
    """The service's command run as systemd runs it, with NOTIFY_SOCKET bound here: (the notify socket, the
    process, its base URL). On leaving, it is stopped with SIGTERM if it still runs, and must exit 0."""
    command, workdir, env = service
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    proc = subprocess.Popen(command, cwd=workdir, env={**env, **settings, "NOTIFY_SOCKET": str(tmp_path / "notify")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        yield notify, proc, f"http://{env['BIND']}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
        notify.close()
    assert proc.returncode == 0, output


def test_the_service_tells_systemd_it_is_ready_once_it_serves(service, tmp_path):
    with running(service, tmp_path) as (notify, _, base):
        assert b"READY=1" in notify.recv(4096)  # Type=notify: systemd starts dependants only now
        wait_until(lambda: _healthy(base), timeout=20, what="gunicorn /health")


def test_the_service_stops_gracefully_with_a_delivery_in_flight(service, installed_host, tmp_path):
    # Room for the held row below on a busy machine: the delivery waits seconds, not the default 1 s.
    timeouts = {"PG_LOCK_TIMEOUT_MS": "5000", "PG_STATEMENT_TIMEOUT_MS": "6000", "PG_POOL_TIMEOUT_MS": "7000"}
    with running(service, tmp_path, **timeouts) as (_, proc, base):
        wait_until(lambda: _healthy(base), timeout=20, what="gunicorn /health")
        body = encode(payment("evt_in_flight", cents=900))
        answers = []
        with psycopg.connect(installed_host.db_url) as holder:
            # The delivery waits on ALICE's balance row, held here, while the master is told to stop.
            holder.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
            sender = threading.Thread(target=lambda: answers.append(
                send(base, body, secret=INSTALLED_SECRET)[:2]))
            sender.start()
            wait_until(lambda: _lock_waiters(installed_host.db_url) > 0, timeout=10, what="a delivery on the row")
            os.kill(proc.pid, signal.SIGTERM)  # KillMode=mixed: the main process only
            time.sleep(0.5)
        sender.join(10)
        assert answers == [(200, {"status": "processed", "event_id": "evt_in_flight"})]
        assert list(Path(service[2]["PROMETHEUS_MULTIPROC_DIR"]).glob("*.db")), \
            "the workers keep their metrics in the runtime directory"


def test_the_service_serves_the_socket_that_the_socket_unit_hands_over(service):
    command, workdir, env = service
    listen = read_unit((UNITS / SOCKET).read_text())["Socket"]["ListenStream"][0]
    address = f"{listen.rsplit(':', 1)[0]}:{free_port()}"  # the unit's host, on a free port
    # systemd-socket-activate passes on only the variables it is told to (as systemd passes the unit's).
    setenv = [f"--setenv={name}" for name in env]
    proc = subprocess.Popen(["systemd-socket-activate", "-l", address, *setenv, *command], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(f"http://{address}"), timeout=20,
                   what="gunicorn on the activated socket")
        assert proc.poll() is None
        assert not _healthy(f"http://{env['BIND']}")  # BIND is not used when systemd passes a socket
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output


def _lock_waiters(url):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]


def _healthy(base):
    try:
        return http_get(base, "/health", timeout=1)[0] == 200
    except OSError:
        return False


def test_the_haproxy_drop_in_points_the_proxy_at_the_services_loopback_address():
    """deploy/haproxy.cfg in front of the service on its host: the drop-in's servers are BIND and ListenStream."""
    drop_in = read_unit((UNITS / "haproxy.service.d" / "webhook-ledger.conf").read_text())["Service"]
    env = dict(value.split("=", 1) for value in drop_in["Environment"])
    bind = re.search(r"^BIND=(\S+)$", ENV_EXAMPLE.read_text(), re.M)[1]
    listen = read_unit((UNITS / SOCKET).read_text())["Socket"]["ListenStream"][0]
    assert {env[f"APP_HOST_{i}"] for i in (1, 2, 3)} == {bind} == {listen} == {"127.0.0.1:8000"}
    assert env["HAPROXY_BIND"] == "0.0.0.0:8080"
    names = set(re.findall(r'"\$\{([A-Z0-9_]+)-', (ROOT / "deploy" / "haproxy.cfg").read_text()))
    assert set(env) == names - {"NAME"}  # every variable the file reads ("${NAME-default}": its own comment)
