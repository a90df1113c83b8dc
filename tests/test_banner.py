"""devservers/demo.py's banner, as `make run` prints it: its demo delivery, pasted as printed, answers "processed"
then "duplicate" and credits the demo user the 1000 cents it says, whatever the settings (a fetching Stripe source
included), and its balance line shows them."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from devservers import ROOT, free_port
from devservers.demo import DEMO_USER
from devservers.stripe_stand_in import API_KEY

from .helpers import db_url, read_banner

pytestmark = pytest.mark.core

START_TIMEOUT_S = 90  # PostgreSQL's schema, Redis and gunicorn on 2 busy cores
STRIPE_SECRET = "whsec_banner_0123456789abcdef"
NOT_INHERITED = ("WEBHOOK_", "DATABASE_URL", "REDIS_", "PROMETHEUS_", "STRIPE_", "FLASK_", "PORT", "LEDGER_")
SETTINGS = {
    "hmac-sha256": {},
    "stripe": {"WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_SECRET": STRIPE_SECRET,
               "STRIPE_ACCEPT_TEST_EVENTS": "true"},
    # configuration.md's "Stripe with fetch and thin events": each event read from the stand-in of Stripe's API.
    "stripe-fetch": {"WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_SECRET": STRIPE_SECRET,
                     "STRIPE_ACCEPT_TEST_EVENTS": "true", "WEBHOOK_FETCH": "true", "WEBHOOK_API_KEY": API_KEY,
                     "STRIPE_API_BASE": "stand-in"},
}


def _paste(banner, first, env):
    """Run the banner's block that starts with a line starting `first`, up to the next blank line, in bash."""
    block = re.search(rf"^{re.escape(first)}.*?(?=\n\n)", banner, re.S | re.M)
    assert block, f"no block starting {first!r} in the banner:\n{banner}"
    done = subprocess.run(["bash", "-c", block.group(0)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    return done.stdout + done.stderr


@pytest.mark.parametrize("name", SETTINGS)
def test_the_banners_demo_delivery_answers_processed_then_duplicate_and_credits_1000_cents(
        name, postgresql, redis_server, redis_client, tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith(NOT_INHERITED)}
    stand_in = {"STRIPE_LOCAL_PORT": str(free_port()), "STRIPE_LOCAL_DIR": str(tmp_path / "stripe")}
    env.update(stand_in, MAKE_RUN_DIR=str(tmp_path / "make-run"))  # never the checkout's .run/, the user's
    settings = dict(SETTINGS[name])
    if settings.get("STRIPE_API_BASE") == "stand-in":
        settings["STRIPE_API_BASE"] = f"http://127.0.0.1:{stand_in['STRIPE_LOCAL_PORT']}"
        subprocess.run([sys.executable, "-m", "devservers.stripe_local"], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=60)
    service = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=open(tmp_path / "stderr", "wb"), text=True,
                               env={**env, **settings, "PORT": str(free_port()), "DATABASE_URL": db_url(postgresql),
                                    "REDIS_URL": redis_server.url})
    try:
        try:
            banner = read_banner(service, START_TIMEOUT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(tmp_path / 'stderr').read_text()}") from None
        answers = [_paste(banner, "BODY=", env) for _ in range(2)]
        assert re.fullmatch(r'\{"event_id":"evt_demo_1","status":"processed"\}\nHTTP 200\n', answers[0]), answers
        assert re.fullmatch(r'\{"event_id":"evt_demo_1","status":"duplicate"\}\nHTTP 200\n', answers[1]), answers
        assert "(0 cents now, 1000 after that)" in banner
        balance = _paste(banner, "psql ", {**env, "DATABASE_URL": db_url(postgresql)})  # the shell's, as printed
        assert re.search(rf"^ {DEMO_USER} \|\s+1000$", balance, re.M), balance
    finally:
        service.terminate()
        service.wait(60)
        subprocess.run([sys.executable, "-m", "devservers.stripe_local", "stop"], cwd=ROOT, env=env,
                       capture_output=True, timeout=60)


# -- .run/env: the file a terminal sources --------------------------------------------------------------------------

WRITE_ENV = """import sys
from app.settings.config import from_env
from devservers.demo import write_env
write_env(__import__("pathlib").Path(sys.argv[1]), from_env({"DATABASE_URL": "postgresql://127.0.0.1:1/x",
          "REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SECRET": "dev-secret-change-me"}), "http://127.0.0.1:8123")
"""


def _write_env(path, then_wait=False):
    """path written by write_env in a process of its own, as make run does; one left running when then_wait."""
    script = WRITE_ENV + ("import time; print('written', flush=True); time.sleep(600)\n" if then_wait else "")
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if then_wait:
        assert proc.stdout.readline() == "written\n"
    else:
        assert proc.wait(60) == 0
    return proc


def _in_a_shell(command):
    return subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", command], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_the_env_file_gives_the_services_url_and_runs_flask_while_its_make_run_serves(tmp_path):
    env = tmp_path / "env"
    running = _write_env(env, then_wait=True)
    try:
        done = _in_a_shell(f". {env} && echo $LEDGER_URL && flask --version")
    finally:
        running.kill()
    assert done.returncode == 0, done
    assert done.stdout.startswith("http://127.0.0.1:8123\nPython "), done.stdout


def test_a_terminal_with_a_stale_env_file_is_told_so_in_one_line(tmp_path):
    env = tmp_path / "env"
    running = _write_env(env, then_wait=True)
    try:
        # make run started again meanwhile: the file is written anew (new ports), the terminal still has the old one's.
        restarted = _in_a_shell(f". {env} && {shlex.quote(sys.executable)} -c {shlex.quote(WRITE_ENV)} {env} "
                                "&& flask events list")
    finally:
        running.kill()
        running.wait(60)
    stopped = _in_a_shell(f". {env} && flask events list")  # the run that wrote it has ended
    assert (restarted.returncode, restarted.stdout) == (1, ""), restarted
    assert restarted.stderr == (f"flask: this terminal's settings are an earlier make run's ({env} was written again "
                                f"since): run . {env} again\n")
    assert (stopped.returncode, stopped.stdout) == (1, ""), stopped
    assert stopped.stderr == f"flask: the make run that wrote {env} has stopped: start it, then . {env} again\n"


def test_the_env_file_defines_the_docs_stripe_send_from_any_folder(tmp_path):
    env = tmp_path / "env"
    running = _write_env(env, then_wait=True)
    try:
        done = _in_a_shell(f". {env} && cd / && type stripe_send >/dev/null && stripe_send --help")
    finally:
        running.kill()
    assert done.returncode == 0, done
    assert done.stdout.startswith("usage: stripe_send "), done.stdout


@pytest.mark.unit
def test_a_fetching_source_against_stripes_own_api_gets_no_made_up_delivery():
    from app.settings.config import from_env
    from devservers.demo import banner

    config = from_env({"DATABASE_URL": "postgresql://127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1/0",
                       "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_SECRET": STRIPE_SECRET,
                       "WEBHOOK_FETCH": "true", "WEBHOOK_API_KEY": API_KEY})
    text = banner("http://127.0.0.1:8000", "evt_demo_1", 0, config, True, False)
    assert "No demo delivery: the default source reads each event from its provider's API" in text
    assert "curl " not in text and "BODY=" not in text
