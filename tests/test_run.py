"""scripts/run.py (`make run`) as a user runs it: its banner names the route of every configured source and
names the file (.run/env) after which `flask` commands run in another terminal as the docs print them; Ctrl-C
stops it. Each run is in a folder of its own (MAKE_RUN_DIR), never the checkout's .run/: that is the user's
ledger, cluster and settings."""

import os
import shlex
import signal
import subprocess
import sys

import pytest

from devservers import ROOT, free_port

from .helpers import checkout_run_state, read_banner

pytestmark = pytest.mark.core

# initdb on first use, PostgreSQL, Redis and gunicorn on 2 busy cores.
START_TIMEOUT_S = 90
STRIPE_SECRET = "whsec_run_test_0123456789abcdef"


def _in_a_fresh_shell(command, cwd=ROOT):
    """command run by bash in a shell that holds nothing of this one's: no venv on PATH, no settings."""
    return subprocess.run(["env", "-i", f"HOME={os.environ.get('HOME', '/')}", "PATH=/usr/bin:/bin", "bash", "-c",
                           command], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_banner_gives_each_route_and_one_line_after_which_the_docs_commands_run_as_printed(tmp_path):
    port = free_port()
    checkout_before = checkout_run_state()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("WEBHOOK_", "DATABASE_URL", "REDIS_", "PROMETHEUS_", "STRIPE_", "FLASK_"))}
    # Settings given on make run's command line (`STRIPE_ACCEPT_TEST_EVENTS=true make run`) reach the commands too.
    env.update(PORT=str(port), WEBHOOK_SOURCES="stripe", WEBHOOK_STRIPE_SECRET=STRIPE_SECRET,
               STRIPE_ACCEPT_TEST_EVENTS="true", MAKE_RUN_DIR=str(tmp_path / ".run"))
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

        env_file = tmp_path / ".run" / "env"
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
        # The docs' relative form, from the folder that holds .run/ (the checkout, for a user).
        assert _in_a_fresh_shell(". .run/env && flask users list", cwd=tmp_path).returncode == 0
        # A terminal that sourced an earlier run's file keeps none of the settings this run leaves at their default.
        again = _in_a_fresh_shell("export LEDGER_CURRENCY=inr WEBHOOK_FETCH=true; . .run/env && "
                                  "echo ${LEDGER_CURRENCY-unset} ${WEBHOOK_FETCH-unset} $STRIPE_ACCEPT_TEST_EVENTS",
                                  cwd=tmp_path)
        assert again.stdout == "unset unset true\n", again
    finally:
        proc.send_signal(signal.SIGINT)
        status = proc.wait(60)
    assert status == 128 + signal.SIGINT, stderr.read_text()
    assert checkout_run_state() == checkout_before, "make run under MAKE_RUN_DIR wrote the checkout's .run/"

