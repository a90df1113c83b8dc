"""scripts/run.py (`make run`) as a user runs it: its banner names the route of every configured source and
names the file (.run/env) after which `flask` commands run in another terminal as the docs print them; Ctrl-C
stops it."""

import os
import shlex
import signal
import subprocess
import sys

import pytest

from devservers import ROOT, free_port

from .helpers import read_banner

# On one worker of `make test` (pytest-xdist) with test_docs_examples.py: `make run`'s script keeps
# its metrics in the checkout's .run/metrics, which each start empties.
pytestmark = [pytest.mark.core, pytest.mark.xdist_group("make-run")]

# initdb on first use, PostgreSQL, Redis and gunicorn on 2 busy cores.
START_TIMEOUT_S = 90
STRIPE_SECRET = "whsec_run_test_0123456789abcdef"


def _in_a_fresh_shell(command):
    """command run by bash in a shell that holds nothing of this one's: no venv on PATH, no settings."""
    return subprocess.run(["env", "-i", f"HOME={os.environ.get('HOME', '/')}", "PATH=/usr/bin:/bin", "bash", "-c",
                           command], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_banner_gives_each_route_and_one_line_after_which_the_docs_commands_run_as_printed(tmp_path):
    port = free_port()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("WEBHOOK_", "DATABASE_URL", "REDIS_", "PROMETHEUS_", "STRIPE_", "FLASK_"))}
    # Settings given on make run's command line (`STRIPE_ACCEPT_TEST_EVENTS=true make run`) reach the commands too.
    env.update(PORT=str(port), WEBHOOK_SOURCES="stripe", WEBHOOK_STRIPE_SECRET=STRIPE_SECRET,
               STRIPE_ACCEPT_TEST_EVENTS="true")
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env)
    try:
        try:
            banner = read_banner(proc, START_TIMEOUT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stderr.read_text()}") from None
        base = f"http://127.0.0.1:{port}"
        assert f"  default      hmac-sha256        {base}/api/webhooks\n" in banner
        assert f"  stripe       stripe             {base}/api/webhooks/stripe\n" in banner

        env_file = ROOT / ".run" / "env"
        assert f"\n. {env_file}\nflask events list\n" in banner
        assert STRIPE_SECRET not in banner  # a secret the shell gave is in the file alone
        assert env_file.stat().st_mode & 0o777 == 0o600

        listed = _in_a_fresh_shell(f". {shlex.quote(str(env_file))} && flask events list")
        assert (listed.returncode, listed.stdout) == (0, "no events\n"), listed
        # Replay reads every service setting: the named source's secret, the test-events setting.
        replayed = _in_a_fresh_shell(f". {shlex.quote(str(env_file))} && flask events replay --all-failed && "
                                     "echo $STRIPE_ACCEPT_TEST_EVENTS $FLASK_APP")
        assert replayed.returncode == 0, replayed
        assert replayed.stdout == "replayed 0 failed events: 0 completed, 0 still failed\ntrue app\n"
        # The docs' relative form, from the checkout.
        assert _in_a_fresh_shell(". .run/env && flask users list").returncode == 0
        # A terminal that sourced an earlier run's file keeps none of the settings this run leaves at their default.
        again = _in_a_fresh_shell("export LEDGER_CURRENCY=inr WEBHOOK_FETCH=true; . .run/env && "
                                  "echo ${LEDGER_CURRENCY-unset} ${WEBHOOK_FETCH-unset} $STRIPE_ACCEPT_TEST_EVENTS")
        assert again.stdout == "unset unset true\n", again
    finally:
        proc.send_signal(signal.SIGINT)
        status = proc.wait(60)
    assert status == 128 + signal.SIGINT, stderr.read_text()
