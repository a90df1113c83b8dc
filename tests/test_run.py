"""scripts/run.py (`make run`) as a user runs it: its banner names the route of every configured source and
gives a ready `export` block with which `flask` commands run in another terminal; Ctrl-C stops it."""

import os
import re
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


def test_the_banner_gives_each_route_and_an_export_block_the_commands_run_with(tmp_path):
    port = free_port()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("WEBHOOK_", "DATABASE_URL", "REDIS_", "PROMETHEUS_"))}
    env.update(PORT=str(port), WEBHOOK_SOURCES="stripe", WEBHOOK_STRIPE_SECRET=STRIPE_SECRET)
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

        export = next(line for line in banner.splitlines() if line.startswith("export "))
        exported = dict(word.split("=", 1) for word in shlex.split(export)[1:])
        assert sorted(exported) == ["DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR", "REDIS_URL", "WEBHOOK_SECRET"]
        assert re.search(rf":{port}\b", exported["DATABASE_URL"]) is None  # the database's port, not the app's
        assert "# and, as in the shell that started this: WEBHOOK_SOURCES WEBHOOK_STRIPE_SECRET" in banner
        command = next(line for line in banner.splitlines() if line.endswith(" --app app events list"))

        other_terminal = {"PATH": os.environ["PATH"], **exported}
        listed = subprocess.run(shlex.split(command), cwd=ROOT, env=other_terminal, capture_output=True, text=True,
                                timeout=60)
        assert listed.returncode == 0, listed
        replayed = subprocess.run([*shlex.split(command)[:-1], "replay", "--all-failed"], cwd=ROOT,
                                  env={**other_terminal, "WEBHOOK_SOURCES": "stripe",
                                       "WEBHOOK_STRIPE_SECRET": STRIPE_SECRET},
                                  capture_output=True, text=True, timeout=60)
        assert replayed.returncode == 0, replayed  # the service's settings, as the banner says
        assert replayed.stdout.endswith("replayed 0 failed events: 0 completed, 0 still failed\n")
    finally:
        proc.send_signal(signal.SIGINT)
        status = proc.wait(60)
    assert status == 128 + signal.SIGINT, stderr.read_text()
