"""deploy/systemd's reconcile timer on an installed host: webhook-ledger-reconcile@<source>.timer starts
webhook-ledger-reconcile@<source>.service, whose command, working directory and environment are run here as
systemd runs them, from the wheel installed in a fresh virtualenv, against Stripe's List Events on loopback.

systemd is not PID 1 here, so no timer elapses by itself (and no hardening option is applied): what is
tested is the unit each elapse starts, run as systemd would run it, and when the timer elapses
(`systemd-analyze calendar` on its OnCalendar). tests/deploy/test_systemd.py verifies the units themselves.
"""

import shlex
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from devservers import packages
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.providers.stripe.events import intent_succeeded

from ..helpers import ALICE, debian_program
from .test_systemd import PREFIX, SYSTEMD_PATH, UNITS, read_unit

# One worker of `make test` (pytest-xdist) builds the wheel and installs the host, once for the
# modules that use them (test_packaging, test_systemd, test_reconcile_timer).
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("installed-host")]

SERVICE, TIMER = "webhook-ledger-reconcile@.service", "webhook-ledger-reconcile@.timer"
INSTANCE = "default"  # %i: the source the instance reconciles


@pytest.fixture(scope="module", autouse=True)
def systemd_tools():
    if not debian_program("systemd-analyze"):
        pytest.skip(f"systemd-analyze not found: apt-get install {packages.package('systemd-analyze')} "
                    "(make test does, as root)")


@pytest.fixture
def stand_in():
    with StripeStandIn() as server:
        yield server


@pytest.fixture
def unit_run(installed_host, stand_in):
    """A function that runs the instance's ExecStart as systemd would: (exit code, output, SuccessExitStatus)."""
    text = (UNITS / SERVICE).read_text().replace(PREFIX, str(installed_host.venv)).replace("%i", INSTANCE)
    service = read_unit(text)["Service"]
    command, workdir = shlex.split(service["ExecStart"][0]), Path(service["WorkingDirectory"][0])
    success = {0, *(int(code) for code in service["SuccessExitStatus"][0].split())}
    # EnvironmentFile=: the host's settings, the example file's reconcile key, this test's stand-in of Stripe.
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8",
           **{name: installed_host.env[name] for name in ("DATABASE_URL", "REDIS_URL", "WEBHOOK_SECRET")},
           "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url}
    installed_host.flask("init-db")
    with psycopg.connect(installed_host.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [ALICE])

    def run():
        done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr, success

    return run


def _payments(count):
    now = int(time.time())
    events = [intent_succeeded(f"pi_timer_{n}", cents=25) for n in range(count)]
    for n, evt in enumerate(events):
        evt["created"] = now - 600 + n  # inside the next run's overlap: listed again, as duplicates
    return events


def test_each_elapse_of_the_timer_reconciles_the_source_once_on_the_installed_host(unit_run, installed_host,
                                                                                   stand_in):
    stand_in.add(*_payments(120))
    code, output, success = unit_run()
    assert code == 0, output
    assert "120 listed: 120 applied (recovered: their deliveries were lost), 0 duplicates, 0 refused" in output
    assert "Traceback" not in output and API_KEY not in output
    late = intent_succeeded("pi_timer_late", cents=25)
    late["created"] = int(time.time()) - 1  # after the first run's watermark
    stand_in.add(late)
    code, output, _ = unit_run()  # the next elapse: from the watermark, minus the overlap
    assert code in success and code == 0, output
    assert "121 listed: 1 applied (recovered: their deliveries were lost), 120 duplicates, 0 refused" in output
    with psycopg.connect(installed_host.db_url, autocommit=True) as conn:
        assert conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s",
                            [ALICE]).fetchone()[0] == 121 * 25
        assert [row[0] for row in conn.execute("SELECT status FROM reconcile_runs ORDER BY id")] == \
            ["completed", "completed"]


def test_an_elapse_while_another_run_holds_the_source_is_a_yield_the_unit_counts_a_success(unit_run,
                                                                                          installed_host,
                                                                                          stand_in):
    stand_in.add(*_payments(3))
    assert unit_run()[0] == 0  # the source's watermark row exists from its first run
    with psycopg.connect(installed_host.db_url) as holder:  # another run of the source, holding its row
        holder.execute("SELECT 1 FROM reconcile_watermarks WHERE source = %s FOR UPDATE", [INSTANCE])
        code, output, success = unit_run()
    assert code == 75 and code in success, output  # SuccessExitStatus=75: the unit does not fail
    assert output.splitlines()[-1].endswith("this one yields"), output


def test_the_timer_catches_up_a_run_missed_while_the_host_was_down():
    assert read_unit((UNITS / TIMER).read_text())["Timer"]["Persistent"] == ["true"]


def test_the_timer_starts_its_own_instance_every_hour_on_the_hour():
    timer = read_unit((UNITS / TIMER).read_text())
    assert "Unit" not in timer["Timer"]  # so an instance's timer starts the service instance of the same name
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    (calendar,) = timer["Timer"]["OnCalendar"]
    done = subprocess.run(["systemd-analyze", "calendar", "--iterations=3", calendar], capture_output=True,
                          text=True, timeout=30, env={"PATH": SYSTEMD_PATH, "TZ": "UTC", "LANG": "C.UTF-8"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Normalized form: *-*-* *:00:00" in done.stdout, done.stdout
    elapses = [datetime.strptime(line.split(":", 1)[1].strip()[4:23], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
               for line in done.stdout.splitlines() if line.strip().startswith(("Next elapse:", "Iter. #"))]
    assert len(elapses) == 3 and all(b - a == timedelta(hours=1) for a, b in zip(elapses, elapses[1:], strict=False))
    assert timedelta(0) < elapses[0] - datetime.now(UTC) <= timedelta(hours=1)
