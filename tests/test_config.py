"""app/config.py and the factory: typed settings, fail fast, clear messages."""

import base64
import subprocess
import sys

import pytest

from app import config, create_app
from app.config import ConfigError, Source
from devservers import ROOT

BASE = {"DATABASE_URL": "postgresql://x@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0",
        "WEBHOOK_SECRET": "s"}


def test_defaults_match_the_readme():
    parsed = config.from_env(BASE)
    assert parsed["LOCK_TTL_MS"] == 10000
    assert parsed["MAX_BODY_BYTES"] == 1048576
    assert parsed["WEBHOOK_SIGNATURE_SCHEME"] == "hmac-sha256"
    assert parsed["WEBHOOK_SECRET"] == (b"s",)
    assert parsed["WEBHOOK_TOLERANCE_SECONDS"] == 300
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
    ({"WEBHOOK_SIGNATURE_SCHEME": "Stripe"}, "WEBHOOK_SIGNATURE_SCHEME must be one of"),
    ({"WEBHOOK_TOLERANCE_SECONDS": "0"}, "WEBHOOK_TOLERANCE_SECONDS must be >= 1, got 0: the replay window"),
    ({"WEBHOOK_TOLERANCE_SECONDS": "-300"}, "WEBHOOK_TOLERANCE_SECONDS must be >= 1, got -300"),
    ({"WEBHOOK_TOLERANCE_SECONDS": "5m"}, "WEBHOOK_TOLERANCE_SECONDS must be an integer"),
])
def test_invalid_settings_are_refused_with_their_name(override, message):
    environ = {**BASE, **override}
    environ = {k: v for k, v in environ.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        config.from_env(environ)


def test_secrets_are_comma_separated_and_stripped():
    assert config.from_env({**BASE, "WEBHOOK_SECRET": " a ,b,"})["WEBHOOK_SECRET"] == (b"a", b"b")


@pytest.mark.parametrize("scheme", ["hmac-sha256", "stripe", "github"])
def test_secrets_are_used_as_written_outside_standard_webhooks(scheme):
    # Stripe's whsec_ secret is itself the HMAC key; it is not base64-decoded.
    parsed = config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": scheme, "WEBHOOK_SECRET": "whsec_abc=,k"})
    assert parsed["WEBHOOK_SECRET"] == (b"whsec_abc=", b"k")


def test_standard_webhooks_secrets_are_decoded_at_start_up():
    parsed = config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks",
                              "WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_YWI"})
    assert parsed["WEBHOOK_SECRET"] == (base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), b"ab")


@pytest.mark.parametrize("secrets, message", [
    ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "entry 0 .* must be written whsec_<base64>"),
    ("whsec_YWI, c2VjcmV0", "entry 1 .* must be written whsec_<base64>"),
    ("whsec_not*base64", "entry 0 .* is not valid base64"),
    ("whsec_YWJjZ", "entry 0 .* is not valid base64"),
    ("whsec_", "entry 0 .* empty key"),
])
def test_bad_standard_webhooks_secret_is_refused_without_echoing_it(secrets, message):
    with pytest.raises(ConfigError, match=message) as refused:
        config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks", "WEBHOOK_SECRET": secrets})
    for key in (s.strip().removeprefix("whsec_") for s in secrets.split(",")):
        assert not key or key not in str(refused.value)


def test_named_sources_are_parsed_with_their_own_settings():
    parsed = config.from_env({**BASE, "WEBHOOK_SOURCES": " stripe , billing-eu ,", "WEBHOOK_TOLERANCE_SECONDS": "60",
                              "WEBHOOK_STRIPE_SECRET": "whsec_new, whsec_old", "WEBHOOK_BILLING_EU_SECRET": "0042",
                              "WEBHOOK_BILLING_EU_SCHEME": "github", "WEBHOOK_BILLING_EU_TOLERANCE_SECONDS": "9"})
    assert parsed["SOURCES"] == {
        "default": Source("default", "hmac-sha256", (b"s",), 60),
        "stripe": Source("stripe", "stripe", (b"whsec_new", b"whsec_old"), 60),
        "billing-eu": Source("billing-eu", "github", (b"0042",), 9),
    }


def test_without_its_secret_the_default_source_is_off_when_named_sources_are_set():
    environ = {name: value for name, value in BASE.items() if name != "WEBHOOK_SECRET"}
    parsed = config.from_env({**environ, "WEBHOOK_SOURCES": "billing", "WEBHOOK_BILLING_SECRET": "b"})
    assert parsed["WEBHOOK_SECRET"] is None
    assert set(parsed["SOURCES"]) == {"billing"}


NAMED = {"WEBHOOK_SOURCES": "billing", "WEBHOOK_BILLING_SECRET": "b"}


@pytest.mark.parametrize("override, message", [
    ({"WEBHOOK_SOURCES": "Stripe"}, "WEBHOOK_SOURCES: 'Stripe' is not a source name"),
    ({"WEBHOOK_SOURCES": "billing,pay_outs"}, "WEBHOOK_SOURCES: 'pay_outs' is not a source name"),
    ({"WEBHOOK_SOURCES": "a b"}, "WEBHOOK_SOURCES: 'a b' is not a source name"),
    ({"WEBHOOK_SOURCES": "x" * 65}, "WEBHOOK_SOURCES: 'x{65}' is not a source name"),
    ({"WEBHOOK_SOURCES": "default"}, "WEBHOOK_SOURCES: 'default' is not a source name .*not 'default'"),
    ({"WEBHOOK_SOURCES": "billing,billing"}, "WEBHOOK_SOURCES names a source twice"),
    ({"WEBHOOK_SOURCES": "signature", "WEBHOOK_SIGNATURE_SECRET": "s"},
     "source 'signature' would be configured by WEBHOOK_SIGNATURE_SCHEME"),
    ({"WEBHOOK_SOURCES": "stripe"}, "WEBHOOK_STRIPE_SECRET is required for source 'stripe'"),
    ({**NAMED, "WEBHOOK_SOURCES": "billing,stripe-eu"}, "WEBHOOK_STRIPE_EU_SECRET is required for source 'stripe-eu'"),
    ({**NAMED, "WEBHOOK_BILLING_SECRET": " , "}, "WEBHOOK_BILLING_SECRET is empty"),
    ({**NAMED, "WEBHOOK_BILLING_SCHEME": "md5"}, "WEBHOOK_BILLING_SCHEME must be one of"),
    ({**NAMED, "WEBHOOK_BILLING_TOLERANCE_SECONDS": "0"}, "WEBHOOK_BILLING_TOLERANCE_SECONDS must be >= 1"),
    ({**NAMED, "WEBHOOK_BILLING_SCHEME": "standard-webhooks"}, "WEBHOOK_BILLING_SECRET entry 0 .* whsec_"),
    ({"WEBHOOK_SECRET": None, "WEBHOOK_SOURCES": " , "}, "WEBHOOK_SECRET is required but not set"),
])
def test_bad_sources_stop_create_app_with_one_line_naming_the_setting(override, message):
    environ = {k: v for k, v in {**BASE, **override}.items() if v is not None}
    with pytest.raises(ConfigError, match=message) as refused:
        create_app(environ)
    assert "\n" not in str(refused.value)


def test_timeouts_that_do_not_nest_are_reported():
    warnings = config.check_nesting(config.from_env({**BASE, "LOCK_TTL_MS": "500"}))
    assert warnings == ["PG_POOL_TIMEOUT_MS (3000) should be below LOCK_TTL_MS (500)"]


@pytest.mark.parametrize("override, message", [
    ({}, "WEBHOOK_SECRET is required but not set"),
    ({"WEBHOOK_SECRET": "s", "WEBHOOK_TOLERANCE_SECONDS": "0"}, "WEBHOOK_TOLERANCE_SECONDS must be >= 1"),
    ({"WEBHOOK_SECRET": "plain", "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks"}, "must be written whsec_"),
    ({"WEBHOOK_SOURCES": "stripe,github", "WEBHOOK_STRIPE_SECRET": "s"}, "WEBHOOK_GITHUB_SECRET is required"),
    ({"WEBHOOK_SOURCES": "Stripe"}, "WEBHOOK_SOURCES: 'Stripe' is not a source name"),
])
def test_gunicorn_refuses_to_start_with_a_clear_message(override, message):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": BASE["DATABASE_URL"], "REDIS_URL": BASE["REDIS_URL"], **override}
    result = subprocess.run([sys.executable, "-c", "import wsgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert message in result.stderr
