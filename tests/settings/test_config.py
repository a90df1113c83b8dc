"""app/settings/config.py and the factory: typed settings, fail fast, clear messages."""

import base64
import dataclasses
import socket
from pathlib import Path

import pytest

from app import create_app
from app.intake.events import Users
from app.providers import PROVIDERS
from app.settings import config
from app.settings.config import ConfigError, Needs, Settings, Source

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

BASE = {"DATABASE_URL": "postgresql://x@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0",
        "WEBHOOK_SECRET": "default-secret-0123456789"}


def test_defaults_match_the_readme():
    parsed = config.from_env(BASE)
    assert parsed.lock_ttl_ms == 10000
    assert parsed.max_body_bytes == 1048576
    assert parsed.webhook_signature_scheme == "hmac-sha256"
    assert parsed.webhook_secret == (b"default-secret-0123456789",)
    assert parsed.webhook_tolerance_seconds == 300
    assert parsed.redis_cluster is False
    assert parsed.pg_prepare_threshold == 5  # psycopg's own default
    assert config.check_nesting(parsed) == []


def test_every_setting_is_declared_with_its_meaning():
    for name, (_, _, meaning) in config.SETTINGS.items():
        assert meaning.strip(), name


def test_every_settings_default_parses():
    for name, (parse, default, _) in config.SETTINGS.items():
        if default is not None:
            parse(name, default)  # a default that did not parse would stop every host that leaves it unset


def test_settings_are_one_frozen_object_with_a_field_per_setting():
    parsed = config.from_env(BASE)
    names = {field.name for field in dataclasses.fields(Settings)}
    assert names == {name.lower() for name in config.SETTINGS} | {"sources", "policy", "read"}
    assert (parsed.schema_path, parsed.policy) == \
        (config.DEFAULT_SCHEMA_PATH, config.Policy("usd", False, {"default": Users()}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.lock_ttl_ms = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        parsed.sources["other"] = parsed.sources["default"]  # type: ignore[index]


def test_the_factory_keeps_the_settings_a_test_dict_makes_as_the_environment_would():
    app = create_app({**BASE, "LOCK_TTL_MS": 9000, "SCHEMA_PATH": "schema.sql"})
    assert Settings.of(app) == config.from_env({**BASE, "LOCK_TTL_MS": "9000", "SCHEMA_PATH": "schema.sql"})
    assert Settings.of(app).lock_ttl_ms == 9000 and Settings.of(app).schema_path == Path("schema.sql").resolve()
    assert app.config["MAX_CONTENT_LENGTH"] == Settings.of(app).max_body_bytes + 1
    assert "LOCK_TTL_MS" not in app.config  # one place to read a setting from


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
    ({"DATABASE_URL": "db.internal"}, "DATABASE_URL is not a PostgreSQL URL or key=value conninfo string"),
    ({"DATABASE_URL": "http://db.internal/ledger"}, "DATABASE_URL is not a PostgreSQL URL"),
    ({"DATABASE_URL": "postgresql://db/ledger?sslmod=require"}, "DATABASE_URL is not .* invalid URI query parameter"),
    ({"DATABASE_URL": "postgresql://db:five/ledger"}, 'DATABASE_URL has a value that libpq refuses: .* "port"'),
    ({"DATABASE_URL": "host=db port=5432x"}, 'DATABASE_URL has a value that libpq refuses: .* "port"'),
    ({"DATABASE_URL": "  "}, "DATABASE_URL is empty"),
    ({"REDIS_URL": "cache.internal:6379"}, "REDIS_URL must start with redis://, rediss:// or unix://"),
    ({"REDIS_URL": "http://cache.internal"}, "REDIS_URL must start with redis://"),
    ({"REDIS_URL": "redis://cache:port/0"}, "REDIS_URL has a port that is not a number"),
    ({"REDIS_URL": "redis:///0"}, "REDIS_URL names no host"),
    ({"REDIS_URL": "redis://cache/zero"}, "REDIS_URL has a database number that is not a number"),
    ({"REDIS_URL": "unix://"}, "REDIS_URL names no socket path"),
    ({"REDIS_CLUSTER": "yes"}, "REDIS_CLUSTER must be true or false"),
    ({"REDIS_CLUSTER": "true", "REDIS_URL": "unix:///run/redis.sock"}, "REDIS_URL must be redis:// or rediss://"),
    ({"REDIS_CLUSTER": "true", "REDIS_URL": "redis://cache:7000/3"}, "REDIS_URL must name database 0 or none"),
    ({"PG_PREPARE_THRESHOLD": "never"}, "PG_PREPARE_THRESHOLD must be an integer"),
    ({"PG_PREPARE_THRESHOLD": "-1"}, "PG_PREPARE_THRESHOLD must be >= 0"),
])
def test_invalid_settings_are_refused_with_their_name(override, message):
    environ = {**BASE, **override}
    environ = {k: v for k, v in environ.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        config.from_env(environ)


REFUSED = "DATABASE_URL has a value that libpq refuses: "


@pytest.mark.parametrize("url, message", [
    # What app/settings/conninfo.py checks itself: libpq does not, or not without reaching the network.
    ("postgresql://ledger:pw@s3cret@db/ledger", "DATABASE_URL has a host name holding @ "
                                                "\\(a password holding @, / or \\? must write it %40"),
    ("hostaddr=s3cret.internal", "DATABASE_URL has a hostaddr that is not an IP address"),
    ("host=db connect_timeout=5s3cret", "DATABASE_URL has a connect_timeout that is not a number"),
    # What libpq refuses itself, on a connection to a socket that does not exist.
    ("postgresql://db/ledger?sslmode=s3cret", REFUSED + 'invalid sslmode value: "..."$'),
    ("postgresql://db:70000/ledger", REFUSED + 'invalid port number: "..."$'),
    ("postgresql://db/ledger?target_session_attrs=s3cret", REFUSED + "invalid target_session_attrs value"),
    ("postgresql://db/ledger?require_auth=s3cret", REFUSED + "invalid require_auth value"),
    ("postgresql://db/ledger?ssl_min_protocol_version=s3cret", REFUSED + 'invalid "ssl_min_protocol_version" value'),
    ("host=s3cret-a,s3cret-b port=1,2,3", REFUSED + "could not match 3 port numbers to 2 hosts$"),
    ("host=db service=s3cret", REFUSED + 'definition of service "..." not found'),
    # ... and on a connection to a loopback port of the check's own, which answers nothing.
    ("postgresql://db/ledger?gssencmode=s3cret", REFUSED + "invalid gssencmode value"),
    ("host=db keepalives=s3cret", REFUSED + 'invalid integer value "..." for connection option "keepalives"$'),
    ("host=db tcp_user_timeout=s3cret", REFUSED + '.* for connection option "tcp_user_timeout"$'),
])
def test_values_libpq_refuses_only_when_connecting_are_refused_at_start_without_them(url, message):
    with pytest.raises(ConfigError, match=message) as refused:
        create_app({**BASE, "DATABASE_URL": url})
    assert "s3cret" not in str(refused.value)


def test_libpqs_check_reaches_no_server_that_the_url_or_the_environment_names(monkeypatch):
    """libpq checks the values on connections that go nowhere: not to the URL's host, nor to PGHOSTADDR's."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        monkeypatch.setenv("PGHOSTADDR", "127.0.0.1")
        monkeypatch.setenv("PGPORT", str(port))
        for url in (f"postgresql://ledger@127.0.0.1:{port}/ledger", f"host=127.0.0.1 port={port}", "dbname=ledger",
                    f"hostaddr=127.0.0.1 port={port} dbname=ledger"):
            config.from_env({**BASE, "DATABASE_URL": url})
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.parametrize("url", [
    "postgresql://ledger@db.internal/ledger", "postgres://ledger:pw@db.internal:6432/ledger?sslmode=require",
    "host=db.internal port=6432 dbname=ledger user=ledger", "postgresql://ledger@/ledger?host=/run/postgresql",
    "postgresql://db1:5432,db2:5433/ledger?target_session_attrs=read-write",
    "postgresql://db/ledger?keepalives_idle=30&tcp_user_timeout=60000",
    "postgresql://ledger:p%40ss@db.internal/ledger", "postgresql://db1,db2:5433/ledger",
    "host=@pg-abstract dbname=ledger", "hostaddr=10.0.0.5,::1 host=a,b dbname=ledger",
    "postgresql://my_db/ledger?sslmode=verify-full&target_session_attrs=prefer-standby&require_auth=!password",
    # Refused by libpq over a local socket, or without a Kerberos credential cache yet: valid all the same.
    "postgresql://db/ledger?gssencmode=require", "postgresql://db/ledger?requirepeer=postgres",
    "postgresql://db/ledger?sslmode=verify-full&sslrootcert=/nonexistent/root.crt&sslnegotiation=direct",
    "host=db connect_timeout=2.5",
])
def test_database_urls_that_libpq_accepts_are_accepted(url):
    assert config.from_env({**BASE, "DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize("url, cluster", [
    ("redis://cache.internal:6379/0", "false"), ("rediss://:pw@cache.internal/2", "false"),
    ("unix:///run/redis/redis.sock?db=1", "false"), ("redis://user:pw@[::1]:6379", "false"),
    ("redis://node-1.internal:7000", "true"), ("rediss://node-1.internal:7000/0", "TRUE"),
])
def test_redis_urls_that_redis_py_accepts_are_accepted(url, cluster):
    parsed = config.from_env({**BASE, "REDIS_URL": url, "REDIS_CLUSTER": cluster})
    assert (parsed.redis_url, parsed.redis_cluster) == (url, cluster == "TRUE" or cluster == "true")


@pytest.mark.parametrize("raw, threshold", [("off", None), ("OFF", None), ("0", 0), ("5", 5), ("100", 100)])
def test_prepare_threshold_is_an_integer_or_off(raw, threshold):
    assert config.from_env({**BASE, "PG_PREPARE_THRESHOLD": raw}).pg_prepare_threshold == threshold


@pytest.mark.parametrize("name, url", [
    ("DATABASE_URL", "postgresql://ledger:pg-s3cret@[::1/ledger"),
    ("DATABASE_URL", "host=db password=pg-s3cret garbage"),
    ("DATABASE_URL", "postgresql://ledger:pg-s3cret@db:pg-s3cret/ledger"),
    # libpq's parser reads an unescaped @ as the end of the password: the rest becomes the host.
    ("DATABASE_URL", "postgresql://ledger:pg@s3cret@db/ledger"),
    ("DATABASE_URL", "postgresql://ledger:pg/s3cret@db/ledger"),
    ("REDIS_URL", "http://:pg-s3cret@cache/0"),
    ("REDIS_URL", "redis://:pg-s3cret@cache:pg-s3cret/0"),
])
def test_a_bad_url_is_refused_without_repeating_its_password(name, url):
    with pytest.raises(ConfigError, match=name) as refused:
        config.from_env({**BASE, name: url})
    assert "pg-s3cret" not in refused.value.format_message()


def test_secrets_are_comma_separated():
    parsed = config.from_env({**BASE, "WEBHOOK_SECRET": "new-secret-0123456789,old-secret-0123456789"})
    assert parsed.webhook_secret == (b"new-secret-0123456789", b"old-secret-0123456789")


def test_each_secret_is_stripped_of_the_spaces_around_it():
    parsed = config.from_env({**BASE, "WEBHOOK_SECRET": " new-secret-0123456789 ,old-secret-0123456789"})
    assert parsed.webhook_secret == (b"new-secret-0123456789", b"old-secret-0123456789")


LONG = "a-secret-of-16-b"  # MIN_SECRET_BYTES exactly


def _assert_refused_without_echo(scheme, secrets, message):
    with pytest.raises(ConfigError, match=message) as refused:
        config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": scheme, "WEBHOOK_SECRET": secrets})
    assert LONG not in str(refused.value) and "short" not in str(refused.value).replace("shorter", "")


@pytest.mark.parametrize("scheme, secrets, message", [
    ("hmac-sha256", "s", "WEBHOOK_SECRET entry 0 .* is shorter than 16 bytes$"),
    ("github", LONG[:-1], "WEBHOOK_SECRET entry 0 .* is shorter than 16 bytes$"),
    ("stripe", f"{LONG},whsec_short", "entry 1 .* shorter than 16 bytes \\(a comma always separates two secrets\\)"),
    ("standard-webhooks", "whsec_" + base64.b64encode(b"k" * 15).decode(),
     "entry 0 .* shorter than 16 bytes once decoded"),
])
def test_a_short_secret_is_refused_without_echoing_it(scheme, secrets, message):
    _assert_refused_without_echo(scheme, secrets, message)


# A secret holding a comma would be split in two weaker ones: the syntax leaves no doubt, and refuses the rest.
@pytest.mark.parametrize("secrets, message", [
    (f"{LONG},,{LONG}", "WEBHOOK_SECRET entry 1 .* is empty: a comma always separates two secrets"),
    (f"{LONG},", "WEBHOOK_SECRET entry 1 .* is empty"),
    (f"{LONG}\\,{LONG}", "WEBHOOK_SECRET holds \\\\, but a comma cannot be escaped"),
])
def test_an_ambiguous_secret_list_is_refused_without_echoing_it(secrets, message):
    _assert_refused_without_echo("hmac-sha256", secrets, message)


def test_the_shortest_secret_accepted_is_16_bytes_of_key():
    decoded = "whsec_" + base64.b64encode(b"k" * 16).decode()
    assert config.from_env({**BASE, "WEBHOOK_SECRET": LONG}).webhook_secret == (LONG.encode(),)
    assert config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks",
                            "WEBHOOK_SECRET": decoded}).webhook_secret == (b"k" * 16,)


@pytest.mark.parametrize("scheme", ["hmac-sha256", "stripe", "github"])
def test_secrets_are_used_as_written_outside_standard_webhooks(scheme):
    # Stripe's whsec_ secret is itself the HMAC key; it is not base64-decoded.
    parsed = config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": scheme,
                              "WEBHOOK_SECRET": "whsec_abcdefghijkl=,k0123456789abcdef"})
    assert parsed.webhook_secret == (b"whsec_abcdefghijkl=", b"k0123456789abcdef")


def test_standard_webhooks_secrets_are_decoded_at_start_up():
    parsed = config.from_env({**BASE, "WEBHOOK_SIGNATURE_SCHEME": "standard-webhooks",
                              "WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_YS1zZWNyZXQtb2YtMTYtYg"})
    assert parsed.webhook_secret == (base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), b"a-secret-of-16-b")


@pytest.mark.parametrize("secrets, message", [
    ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "entry 0 .* must be written whsec_<base64>"),
    ("whsec_YS1zZWNyZXQtb2YtMTYtYg, c2VjcmV0", "entry 1 .* must be written whsec_<base64>"),
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
                              "WEBHOOK_STRIPE_SECRET": "whsec_new_0123456789, whsec_old_0123456789",
                              "WEBHOOK_BILLING_EU_SECRET": "0042000000000000",
                              "WEBHOOK_BILLING_EU_SCHEME": "github", "WEBHOOK_BILLING_EU_TOLERANCE_SECONDS": "9"})
    assert parsed.sources == {
        "default": Source("default", "hmac-sha256", (BASE["WEBHOOK_SECRET"].encode(),), 60),
        "stripe": Source("stripe", "stripe", (b"whsec_new_0123456789", b"whsec_old_0123456789"), 60,
                         api_base="https://api.stripe.com"),  # STRIPE_API_BASE's default
        "billing-eu": Source("billing-eu", "github", (b"0042000000000000",), 9),
    }


# A source's provider API address is read once, with the settings: its own setting's, else the global setting its
# provider names (STRIPE_API_BASE), else the provider's own; a scheme without an API has none.
@pytest.mark.parametrize("scheme, environ, api_base", [
    ("hmac-sha256", {}, None),
    ("stripe", {}, "https://api.stripe.com"),
    ("stripe", {"STRIPE_API_BASE": "http://127.0.0.1:9/"}, "http://127.0.0.1:9"),
    ("stripe", {"STRIPE_API_BASE": "http://127.0.0.1:9", "API_BASE": "https://own.test/v1/"}, "https://own.test/v1"),
    ("razorpay", {"STRIPE_API_BASE": "http://127.0.0.1:9"}, "https://api.razorpay.com"),
    ("razorpay", {"API_BASE": "https://own.test"}, "https://own.test"),
])
@pytest.mark.parametrize("prefix", ["WEBHOOK_", "WEBHOOK_SRC_"])
def test_a_sources_api_address_is_read_with_the_settings(scheme, environ, api_base, prefix):
    named = {"WEBHOOK_SOURCES": "src", "WEBHOOK_SRC_SCHEME": scheme} if prefix == "WEBHOOK_SRC_" \
        else {"WEBHOOK_SIGNATURE_SCHEME": scheme}
    own = {prefix + name if name == "API_BASE" else name: value for name, value in environ.items()}
    parsed = config.from_env({**BASE, **named, f"{prefix}SECRET": LONG, **own})
    assert parsed.sources["default" if prefix == "WEBHOOK_" else "src"].api_base == api_base


def test_every_global_api_address_a_provider_names_is_a_declared_setting():
    named = [provider.api_base_setting for provider in PROVIDERS.values() if provider.api_base_setting is not None]
    assert named and set(named) <= set(config.SETTINGS)


@pytest.mark.parametrize("environ, message", [
    ({"WEBHOOK_FETCH": "true"}, "WEBHOOK_FETCH: the hmac-sha256 scheme has no provider API to fetch events from"),
    ({"WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_SECRET": LONG, "WEBHOOK_FETCH": "true"},
     "WEBHOOK_API_KEY is required to fetch events under stripe: a key that may read Events"),
])
def test_a_fetch_that_cannot_be_is_refused_naming_the_setting(environ, message):
    with pytest.raises(ConfigError) as refused:
        config.from_env({**BASE, **environ})
    assert refused.value.format_message() == f"configuration error: {message}"


def test_without_its_secret_the_default_source_is_off_when_named_sources_are_set():
    environ = {name: value for name, value in BASE.items() if name != "WEBHOOK_SECRET"}
    parsed = config.from_env({**environ, "WEBHOOK_SOURCES": "billing", "WEBHOOK_BILLING_SECRET": "billing-secret-0123"})
    assert parsed.webhook_secret is None
    assert set(parsed.sources) == {"billing"}


NAMED = {"WEBHOOK_SOURCES": "billing", "WEBHOOK_BILLING_SECRET": "billing-secret-0123"}


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
        create_app(environ, needs=Needs.SERVICE)
    assert "\n" not in str(refused.value)


def test_timeouts_that_do_not_nest_are_reported():
    warnings = config.check_nesting(config.from_env({**BASE, "LOCK_TTL_MS": "500"}))
    assert warnings == ["PG_POOL_TIMEOUT_MS (3000) should be below LOCK_TTL_MS (500)"]


# -- one secret, one source: a delivery verifies for one source's events only --

SHARED = "shared-secret-0123456789"


@pytest.mark.parametrize("override, message", [
    ({"WEBHOOK_SECRET": f"default-secret-0123456789,{SHARED}", "WEBHOOK_SOURCES": "billing",
      "WEBHOOK_BILLING_SECRET": SHARED}, "WEBHOOK_SECRET and WEBHOOK_BILLING_SECRET share a secret: .* "
                                         "set WEBHOOK_BILLING_MOVED_FROM=default"),
    # Whatever the schemes: hmac-sha256 and github sign the same bytes the same way.
    ({"WEBHOOK_SOURCES": "stripe,github", "WEBHOOK_STRIPE_SECRET": SHARED, "WEBHOOK_GITHUB_SECRET": f" {SHARED}"},
     "WEBHOOK_STRIPE_SECRET and WEBHOOK_GITHUB_SECRET share a secret"),
    ({"WEBHOOK_SOURCES": "a,b", "WEBHOOK_A_SECRET": SHARED, "WEBHOOK_B_SECRET": SHARED, "WEBHOOK_A_MOVED_FROM": "old"},
     "WEBHOOK_A_SECRET and WEBHOOK_B_SECRET share a secret: .* set WEBHOOK_B_MOVED_FROM=old"),
    ({**NAMED, "WEBHOOK_BILLING_MOVED_FROM": "Default"}, "WEBHOOK_BILLING_MOVED_FROM: 'Default' is not a source name"),
    ({**NAMED, "WEBHOOK_BILLING_MOVED_FROM": "billing"}, "WEBHOOK_BILLING_MOVED_FROM names the source itself"),
    ({"WEBHOOK_SOURCES": "a,b", "WEBHOOK_A_SECRET": SHARED, "WEBHOOK_B_SECRET": "b-secret-0123456789",
      "WEBHOOK_A_MOVED_FROM": "default", "WEBHOOK_B_MOVED_FROM": "a"},
     "WEBHOOK_B_MOVED_FROM names 'a', itself moved from 'default': write default"),
])
def test_a_secret_shared_by_two_sources_stops_the_app_with_one_line_naming_both(override, message):
    with pytest.raises(ConfigError, match=message) as refused:
        create_app({**BASE, **override}, needs=Needs.SERVICE)
    assert "\n" not in str(refused.value) and SHARED not in str(refused.value)


# stripe moved from default and keeps its secret; github moved from a source no longer served.
MOVED = {**BASE, "WEBHOOK_SECRET": SHARED, "WEBHOOK_SOURCES": "stripe,github",
         "WEBHOOK_STRIPE_SECRET": SHARED, "WEBHOOK_STRIPE_MOVED_FROM": " default ",
         "WEBHOOK_GITHUB_SECRET": "github-secret-0123456789", "WEBHOOK_GITHUB_MOVED_FROM": "gone"}


def test_a_moved_source_may_share_the_old_sources_secret():
    sources = config.from_env(MOVED).sources  # refuse_shared_secrets lets it through
    assert sources["stripe"].secrets == sources["default"].secrets == (SHARED.encode(),)


def test_a_moved_source_shares_the_old_sources_events():
    sources = config.from_env(MOVED).sources
    assert [(s.name, s.event_source) for s in sources.values()] == [
        ("default", "default"), ("stripe", "default"), ("github", "gone")]  # the old source need not be served
    assert sources["stripe"].moved_from == "default" and sources["default"].moved_from is None
