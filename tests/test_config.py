"""app/config.py and the factory: typed settings, fail fast, clear messages."""

import subprocess
import sys

import pytest

from app import config
from app.config import ConfigError

from .servers import ROOT

BASE = {"DATABASE_URL": "postgresql://x@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0",
        "WEBHOOK_SECRET": "s"}


def test_defaults_match_the_readme():
    parsed = config.from_env(BASE)
    assert parsed["LOCK_TTL_MS"] == 10000
    assert parsed["MAX_BODY_BYTES"] == 1048576
    assert parsed["WEBHOOK_SIGNATURE_SCHEME"] == "hmac-sha256"
    assert parsed["WEBHOOK_SECRET"] == (b"s",)
    assert config.check_nesting(parsed) == []


@pytest.mark.parametrize("override, message", [
    ({"WEBHOOK_SECRET": None}, "WEBHOOK_SECRET is required"),
    ({"WEBHOOK_SECRET": " , "}, "WEBHOOK_SECRET is empty"),
    ({"DATABASE_URL": None}, "DATABASE_URL is required"),
    ({"REDIS_URL": None}, "REDIS_URL is required"),
    ({"LOCK_TTL_MS": "ten"}, "LOCK_TTL_MS must be an integer"),
    ({"LOCK_TTL_MS": "0"}, "LOCK_TTL_MS must be >= 1"),
    ({"MAX_BODY_BYTES": "-1"}, "MAX_BODY_BYTES must be >= 1"),
    ({"WEBHOOK_SIGNATURE_SCHEME": "md5"}, "WEBHOOK_SIGNATURE_SCHEME must be one of"),
])
def test_invalid_settings_are_refused_with_their_name(override, message):
    environ = {**BASE, **override}
    environ = {k: v for k, v in environ.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        config.from_env(environ)


def test_secrets_are_comma_separated_and_stripped():
    assert config.from_env({**BASE, "WEBHOOK_SECRET": " a ,b,"})["WEBHOOK_SECRET"] == (b"a", b"b")


def test_timeouts_that_do_not_nest_are_reported():
    warnings = config.check_nesting(config.from_env({**BASE, "LOCK_TTL_MS": "500"}))
    assert warnings == ["PG_POOL_TIMEOUT_MS (3000) should be below LOCK_TTL_MS (500)"]


def test_gunicorn_refuses_to_start_without_secret():
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": BASE["DATABASE_URL"], "REDIS_URL": BASE["REDIS_URL"]}
    result = subprocess.run([sys.executable, "-c", "import wsgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "WEBHOOK_SECRET is required but not set" in result.stderr
