"""A configuration error stops the service: real gunicorn (the committed
gunicorn.conf.py), its master included, `flask` commands and wsgi.py alone,
each with one line naming the setting and no traceback."""

import os
import subprocess
import sys

import pytest

from devservers import ROOT, free_port

# Starts gunicorn and `flask` (no PostgreSQL, no Redis): processes of their own, so not in `make check`.
pytestmark = pytest.mark.core

GOOD = {"DATABASE_URL": "postgresql://ledger:pg-s3cret@127.0.0.1:1/ledger", "REDIS_URL": "redis://127.0.0.1:1/0",
        "WEBHOOK_SECRET": "whsec-startup-test"}
EX_CONFIG = 78  # sysexits.h, as gunicorn.conf.py and `flask` exit on a configuration error


def _env(**override):
    env = {"PATH": os.environ["PATH"], **GOOD, **override}
    return {name: value for name, value in env.items() if value is not None}


def _gunicorn(env, conf=ROOT / "gunicorn.conf.py", workers=4):
    """Run gunicorn until it exits (or 30 s: a restart loop fails the test); return (status, output lines)."""
    env = {**env, "PORT": str(free_port()), "WEB_CONCURRENCY": str(workers)}
    try:
        done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", str(conf), "wsgi:app"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"gunicorn still running after 30 s (a worker restart loop?): {exc.output[-2000:]}")
    return done.returncode, done.stdout.splitlines()


@pytest.mark.parametrize("override, setting", [
    ({"WEBHOOK_SECRET": None}, "WEBHOOK_SECRET is required"),
    ({"DATABASE_URL": "postgresql://ledger:pg-s3cret@[::1/ledger"}, "DATABASE_URL is not a PostgreSQL URL"),
    ({"DATABASE_URL": "mysql://ledger:pg-s3cret@db/ledger"}, "DATABASE_URL is not a PostgreSQL URL"),
    ({"REDIS_URL": "http://:pg-s3cret@cache:6379/0"}, "REDIS_URL must start with redis://"),
    ({"REDIS_CLUSTER": "yes"}, "REDIS_CLUSTER must be true or false"),
    ({"PG_PREPARE_THRESHOLD": "never"}, "PG_PREPARE_THRESHOLD must be an integer"),
    ({"DATABASE_URL": "postgresql://ledger:pg-s3cret@x@127.0.0.1/ledger"}, "DATABASE_URL has a host name holding @"),
    # The log line is JSON: libpq's quotes in it are escaped.
    ({"DATABASE_URL": "host=127.0.0.1 keepalives=pg-s3cret"}, "DATABASE_URL has a value that libpq refuses: "
                                                              "invalid integer value"),
    ({"DATABASE_URL": "postgresql://ledger:pg-s3cret@127.0.0.1/ledger?sslmode=pg-s3cret"},
     "DATABASE_URL has a value that libpq refuses: invalid sslmode value"),
    ({"WEBHOOK_SECRET": "pg-s3cret"}, "WEBHOOK_SECRET entry 0 (counted from 0) is shorter than 16 bytes"),
    ({"WEBHOOK_SOURCES": "billing", "WEBHOOK_BILLING_SECRET": GOOD["WEBHOOK_SECRET"]},
     "WEBHOOK_SECRET and WEBHOOK_BILLING_SECRET share a secret"),
])
def test_misconfigured_gunicorn_master_exits_at_once_with_one_line(override, setting):
    status, lines = _gunicorn(_env(**override))
    assert status == EX_CONFIG, lines
    named = [line for line in lines if "configuration error" in line]
    assert len(named) == 1 and setting in named[0], lines
    output = "\n".join(lines)
    assert "Traceback" not in output
    assert "Booting worker" not in output  # stopped in the master, before any fork
    assert "pg-s3cret" not in output


def test_worker_config_error_stops_the_master_too(tmp_path):
    """The second line of defence (wsgi.py exits 3, gunicorn's boot error) without the master's check."""
    conf = tmp_path / "no-master-check.conf.py"
    conf.write_text(f"exec(open({str(ROOT / 'gunicorn.conf.py')!r}).read())\n"
                    "_settings_problem = lambda: None  # the master lets the workers find it\n")
    status, lines = _gunicorn(_env(WEBHOOK_SECRET=None), conf=conf, workers=1)
    assert status == 3, lines  # gunicorn.arbiter.Arbiter.WORKER_BOOT_ERROR: the master halted
    assert sum("configuration error: WEBHOOK_SECRET is required" in line for line in lines) == 1, lines
    assert sum("Booting worker" in line for line in lines) == 1, lines  # no restart loop


def test_master_never_imports_the_app_package(tmp_path):
    """A HUP must load new code: the master checks the settings in a child process, importing nothing of the app."""
    probe = ("import runpy, sys; conf = runpy.run_path('gunicorn.conf.py');"
             "print(conf['_settings_problem']()); print(sorted(m for m in sys.modules if 'app' == m.split('.')[0]))")
    env = _env(PG_POOL_SIZE="0", PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["configuration error: PG_POOL_SIZE must be >= 1, got 0", "[]"], done


def test_reading_the_settings_imports_no_providers_sdk():
    """An SDK is imported on its provider's first call (STYLE 37), not by reading settings that name every provider."""
    probe = ("import sys; from app.settings import config; config.from_env();"
             "print(sorted(m for m in ('stripe', 'razorpay', 'requests', 'flask', 'redis') if m in sys.modules))")
    env = _env(WEBHOOK_SOURCES="stripe,razorpay,paypal", WEBHOOK_STRIPE_SECRET="whsec_startup_test_0123",
               WEBHOOK_STRIPE_FETCH="true", WEBHOOK_STRIPE_API_KEY="rk_test_startup",
               WEBHOOK_RAZORPAY_SECRET="razorpay-startup-0123", WEBHOOK_RAZORPAY_FETCH="true",
               WEBHOOK_RAZORPAY_API_KEY="rzp_test_key:secret", WEBHOOK_PAYPAL_SECRET="WEBHOOK_ID",
               WEBHOOK_PAYPAL_API_KEY="client:secret")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["[]"], done


@pytest.mark.parametrize("command", [["events", "list"], ["redis", "forget-done"], ["init-db"], ["run"]])
def test_flask_commands_refuse_a_bad_setting_with_one_line(command):
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", *command], cwd=ROOT,
                          env=_env(LOCK_TTL_MS="10s"), capture_output=True, text=True, timeout=30)
    assert done.returncode == EX_CONFIG, done
    assert done.stderr.strip() == "Error: configuration error: LOCK_TTL_MS must be an integer, got '10s'", done
    assert done.stdout == ""


@pytest.mark.parametrize("override, message", [
    ({}, "WEBHOOK_SECRET is required but not set"),
    ({"WEBHOOK_SECRET": "default-secret-0123456789", "WEBHOOK_TOLERANCE_SECONDS": "0"},
     "WEBHOOK_TOLERANCE_SECONDS must be >= 1"),
    ({"WEBHOOK_SECRET": "plain", "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks"}, "must be written whsec_"),
    ({"WEBHOOK_SOURCES": "stripe,github", "WEBHOOK_STRIPE_SECRET": "whsec_0123456789abcdef"},
     "WEBHOOK_GITHUB_SECRET is required"),
    ({"WEBHOOK_SOURCES": "Stripe"}, "WEBHOOK_SOURCES: 'Stripe' is not a source name"),
])
def test_wsgi_refuses_to_load_with_gunicorns_boot_error_in_one_line(override, message):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": "postgresql://x@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0",
           **override}
    result = subprocess.run([sys.executable, "-c", "import wsgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    # gunicorn's WORKER_BOOT_ERROR: its master stops (test_worker_config_error_stops_the_master_too)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert result.stderr.startswith("webhook-ledger: configuration error: ")
