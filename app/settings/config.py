"""Typed configuration: each setting declared once, the environment parsed once into a frozen Settings, failing fast.
It imports no Flask: gunicorn's master runs `check()` in a child process (docs/deploying.md, "With gunicorn")."""

import enum
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn
from urllib.parse import SplitResult, urlsplit

from ..core.vocabulary import DEFAULT_SOURCE, NoUser, Policy
from . import parsers, sources
from .parsers import ConfigError, Parser
from .sources import Source

if TYPE_CHECKING:
    from flask import Flask

# schema.sql is kept at the top of the repository, and shipped inside this
# package as flaskr ships its schema: app/schema.sql is a symlink to it in
# the checkout and a copy in the wheel, so an installed host finds it from
# any directory. SCHEMA_PATH names another file.
DEFAULT_SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema.sql"




def _schema_path(name: str, raw: str) -> Path:
    # A relative path is taken from the current directory, as any command's file argument.
    return Path(raw.strip()).resolve() if raw.strip() else DEFAULT_SCHEMA_PATH


class Needs(enum.IntEnum):
    """What a part of the app reads of the settings; each level reads all that the one below it reads."""

    # DATABASE_URL and every setting with a default: the commands that read and write PostgreSQL only.
    DATABASE = 1
    # And REDIS_URL: `flask redis forget-done`.
    REDIS = 2
    # Every setting, sources and secrets included: serving, and the commands that apply events.
    SERVICE = 3


# The required settings (no default) that a level leaves unread.
UNREAD_BELOW = {Needs.DATABASE: ("REDIS_URL", "WEBHOOK_SECRET"), Needs.REDIS: ("WEBHOOK_SECRET",)}


class Setting(NamedTuple):
    """One setting: how its text is parsed, its default (None: required) and what it means."""

    parse: Parser
    default: str | None
    meaning: str


_SETTING = "setting"  # the key of a Settings field's metadata that declares it


def setting(parse: Parser, default: str | None, meaning: str) -> dict[str, Setting]:
    """A Settings field's metadata that declares it a setting: parsed by parse from its text, or default's."""
    return {_SETTING: Setting(parse, default, meaning)}


@dataclass(frozen=True)
class Settings:
    """Every setting, parsed and checked, and what they make: the sources and the policy."""
    # Each setting is declared once, as a field (its name in lower case, its type) whose setting() gives its parser,
    # default (None: required) and meaning; SETTINGS, from_env() and docs/configuration.md's table follow from it.
    # Read below Needs.SERVICE, the required settings left unread are None. The timeouts nest so that the inner one
    # fails first: lock wait < statement < pool acquire < Redis lock TTL <= gunicorn timeout.

    database_url: str = field(metadata=setting(parsers.database_url, None, "PostgreSQL, directly or through PgBouncer"))
    # None: not read (below Needs.REDIS).
    redis_url: str | None = field(metadata=setting(
        parsers.redis_url, None, "Redis, one server or any node of a cluster"))
    # A Redis Cluster needs redis-py's cluster client (slot routing, MOVED);
    # a plain client answers MOVED for most keys. Off: one Redis server.
    redis_cluster: bool = field(metadata=setting(parsers.boolean, "false", "talk to a Redis Cluster"))
    # The default source's keys, as its scheme uses them; None when it is off
    # (required unless WEBHOOK_SOURCES names sources: then the default source is off).
    webhook_secret: tuple[bytes, ...] | None = field(metadata=setting(
        parsers.secrets, None, "the default source's signing secrets"))
    webhook_signature_scheme: str = field(metadata=setting(
        parsers.scheme, "hmac-sha256", "the default source's signature scheme"))
    webhook_sources: tuple[str, ...] = field(metadata=setting(
        lambda name, raw: sources.names(name, raw, SETTINGS), "", "the named sources, each on /api/webhooks/<name>"))
    # Stripe's and Standard Webhooks' own default: a signed timestamp older
    # (or further ahead) than this is a replay (or a forged clock).
    # stripe-python reads 0 as "do not check"; here the window is never off.
    webhook_tolerance_seconds: int = field(metadata=setting(
        sources.TOLERANCE, "300", "the replay window of timestamped schemes"))
    # Long enough to cover a delivery's whole transaction (see the nesting above).
    lock_ttl_ms: int = field(metadata=setting(parsers.integer(1), "10000", "lifetime of the per-event Redis lock"))
    max_body_bytes: int = field(metadata=setting(parsers.integer(1), "1048576", "larger bodies are answered 413"))
    # A row lock held by a twin delivery is given up first: 503, retry later.
    pg_lock_timeout_ms: int = field(metadata=setting(parsers.integer(1), "1000", "longest wait for a row lock"))
    pg_statement_timeout_ms: int = field(metadata=setting(parsers.integer(1), "2000", "longest statement"))
    # Waiting for a pooled connection (or a dead server) ends in 503 after this.
    pg_pool_timeout_ms: int = field(metadata=setting(
        parsers.integer(1), "3000", "longest wait for a pooled connection"))
    # One connection per gunicorn thread: a request never waits for another's.
    pg_pool_size: int = field(metadata=setting(parsers.integer(1), "4", "connections per worker process"))
    # psycopg's own default: a statement run 5 times on a connection is
    # prepared, saving its parsing; `off` (None) behind a pooler that cannot route them.
    pg_prepare_threshold: int | None = field(metadata=setting(
        parsers.prepare_threshold, "5", "executions of a statement before psycopg prepares it"))
    # Well under a second, so a dead Redis degrades the service, not stalls it.
    redis_timeout_ms: int = field(metadata=setting(parsers.integer(1), "250", "Redis connect and socket timeout"))
    # Older committed events are answered by PostgreSQL, as after a flush.
    redis_done_ttl_seconds: int = field(metadata=setting(
        parsers.integer(1), "86400", "how long Redis remembers a committed event"))
    # Told to a 409/503 sender: the twin's transaction or an outage is short.
    retry_after_seconds: int = field(metadata=setting(parsers.integer(1), "1", "Retry-After of a 409 or 503"))
    # Payments in another currency are refused (422), never credited as if in this one.
    ledger_currency: str = field(metadata=setting(parsers.currency, "usd", "the ledger's currency (ISO 4217)"))
    # `flask reconcile`'s key for the default source: a Stripe restricted key
    # that may read Events. Unset (None): the command says so (serving needs none).
    webhook_api_key: str | None = field(repr=False, metadata=setting(
        parsers.api_key, "", "the default source's provider API key"))
    # A named source's is WEBHOOK_<NAME>_USER_METADATA_KEY, default this one.
    webhook_user_metadata_key: str = field(metadata=setting(
        parsers.metadata_key, "user_id", "the PaymentIntent metadata key that names the user"))
    # refuse (422: nothing is silently dropped) or ignore (2xx,
    # recorded). A named source's: WEBHOOK_<NAME>_NO_USER, default this one.
    webhook_no_user: NoUser = field(metadata=setting(parsers.no_user, "refuse", "what a payment naming no user gets"))
    # The default source's provider API address; unset, the global setting its provider names, else the
    # provider's own (sources.py reads each source's with the settings).
    webhook_api_base: str | None = field(metadata=setting(
        parsers.optional_api_base, "", "the default source's provider API address"))
    # Unset: its provider decides (one whose signature does not cover the body fetches always); refused where the
    # provider has no API.
    webhook_fetch: bool | None = field(metadata=setting(
        parsers.optional_boolean, "", "fetch each event from the default source's provider API"))
    # The provider account's budget, shared by every host (app/providers/budget.py), for the default source and by
    # default for each named one (WEBHOOK_<NAME>_API_RATE, _API_RATE_TOTAL). Stripe allows 25 requests a second per
    # endpoint and 100 in all in live mode, 25 in a sandbox (https://docs.stripe.com/rate-limits), shared with the
    # merchant's own application (its checkout creates PaymentIntents): 10 and 20 leave it 60% of each endpoint
    # and 80% of the live account, and stay under a sandbox's 25 in all.
    webhook_api_rate: int = field(metadata=setting(
        parsers.integer(1), "10", "requests a second to one endpoint of the default source's provider account"))
    webhook_api_rate_total: int = field(metadata=setting(
        parsers.integer(1), "20", "requests a second in all to the default source's provider account"))
    # Total, connection to last byte: a provider host that drips is cut here.
    # Well under gunicorn's timeout and the senders' (PayPal waits about 10 s).
    provider_deadline_ms: int = field(metadata=setting(
        parsers.integer(1), "3000", "longest call to a provider's API, connection to last byte"))
    # Fewer than a worker's threads (GUNICORN_THREADS, 4): a slow provider never holds them all.
    provider_slots: int = field(metadata=setting(
        parsers.integer(1), "2", "calls to providers' APIs at once per worker process; more are 503"))
    # An hourly timer runs reconcile: three hours without a success is two
    # runs missed and the third late, worth a ticket (the alert reads it).
    reconcile_max_age_seconds: int = field(metadata=setting(
        parsers.integer(60), "10800", "longest time without a successful reconcile before the alert"))
    # The package's own unless set.
    schema_path: Path = field(metadata=setting(_schema_path, "", "where `flask init-db` reads the schema"))
    # -- one provider's own settings: declared here as every other, so that each is one typed field whose parser,
    # default and meaning SETTINGS and docs/configuration.md's table read; its provider reads them from Settings.
    # Stripe's test-mode events (livemode false) are refused (422) unless this is true.
    stripe_accept_test_events: bool = field(metadata=setting(
        parsers.boolean, "false", "credit Stripe's test-mode events"))
    # Stripe's API for a source without its own _API_BASE (its Provider.api_base_setting); the tests point it at a
    # loopback stand-in.
    stripe_api_base: str = field(metadata=setting(parsers.api_base, "https://api.stripe.com", "Stripe's API address"))
    # PayPal's hosts (host:port); the tests name their loopback stand-in. Any other is 401, nothing fetched.
    paypal_cert_hosts: frozenset[str] = field(metadata=setting(
        parsers.cert_hosts, "api.paypal.com,api-m.paypal.com,api.sandbox.paypal.com,api-m.sandbox.paypal.com",
        "the hosts a PAYPAL-CERT-URL may name (app/providers/paypal/)"))
    # None: certifi's bundle.
    paypal_ca_file: Path | None = field(metadata=setting(
        parsers.ca_file, "", "the roots PayPal's certificates and their host's TLS must chain to"))
    # Every source served, by name: the default one (when it has a secret), then the named ones. Read-only.
    sources: Mapping[str, Source]
    policy: Policy
    read: Needs = Needs.SERVICE  # what from_env was asked to read

    @staticmethod
    def of(app: "Flask") -> "Settings":
        """The settings create_app built the app from."""
        settings: Settings = app.extensions[EXTENSION]
        return settings


# Each setting's name -> its declaration, in the order of Settings' fields.
SETTINGS: dict[str, Setting] = {
    declared.name.upper(): declared.metadata[_SETTING] for declared in fields(Settings) if _SETTING in declared.metadata
}


# Settings' key in app.extensions; and, for an app read below Needs.SERVICE, why each level above failed.
EXTENSION = "settings"
PROBLEMS = "settings_problems"


def from_env(environ: Mapping[str, str] | None = None, needs: Needs = Needs.SERVICE) -> Settings:
    """The settings that needs reads, parsed from environ (default os.environ); ConfigError names the first bad one.
    Below Needs.SERVICE, what that level does not read is None (and `sources` empty)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    named = sources.names("WEBHOOK_SOURCES", environ.get("WEBHOOK_SOURCES", ""), SETTINGS)
    for name, (parse, default, _) in SETTINGS.items():
        raw = environ.get(name, default)
        if default is None and name in UNREAD_BELOW.get(needs, ()):
            values[name] = None  # a required setting this level does not read
            continue
        if raw is None and name == "WEBHOOK_SECRET" and named:
            values[name] = None  # the default source is off: POST /api/webhooks answers 404
            continue
        if raw is None:
            raise ConfigError(f"{name} is required but not set")
        values[name] = parse(name, raw)
    if values["REDIS_CLUSTER"] and values["REDIS_URL"] is not None:
        _cluster_url(urlsplit(values["REDIS_URL"]))
    served: dict[str, Source] = {}
    if needs == Needs.SERVICE:
        served = sources.read(values, named, environ)
        sources.refuse_shared_secrets(served)
        if DEFAULT_SOURCE in served:
            values["WEBHOOK_SECRET"] = served[DEFAULT_SOURCE].secrets  # its keys, as its scheme uses them
    return Settings(**{name.lower(): value for name, value in values.items()},
                    sources=MappingProxyType(served),
                    policy=Policy(values["LEDGER_CURRENCY"], values["STRIPE_ACCEPT_TEST_EVENTS"],
                                  MappingProxyType({s.event_source: s.users for s in served.values()})),
                    read=needs)


def from_env_as_far_as_it_goes(environ: Mapping[str, str]) -> tuple[Settings, dict[Needs, ConfigError]]:
    """The settings at the highest level environ allows and why each level above it failed, for `flask` commands
    (commands.needs); ConfigError when even Needs.DATABASE fails."""
    problems: dict[Needs, ConfigError] = {}
    for needs in sorted(Needs, reverse=True):
        try:
            return from_env(environ, needs), problems
        except ConfigError as exc:
            if needs == Needs.DATABASE:
                raise
            problems[needs] = exc
    raise AssertionError("unreachable: Needs.DATABASE returns or raises")


def _cluster_url(parts: SplitResult) -> None:
    if parts.scheme == "unix":
        raise ConfigError("REDIS_URL must be redis:// or rediss:// when REDIS_CLUSTER=true")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError("REDIS_URL must name database 0 or none when REDIS_CLUSTER=true (a cluster has no other)")


def check_nesting(settings: Settings) -> list[str]:
    """Return warnings for timeouts that do not nest (inner must fail first)."""
    chain = ["PG_LOCK_TIMEOUT_MS", "PG_STATEMENT_TIMEOUT_MS", "PG_POOL_TIMEOUT_MS", "LOCK_TTL_MS"]
    values = {name: getattr(settings, name.lower()) for name in chain}
    return [
        f"{inner} ({values[inner]}) should be below {outer} ({values[outer]})"
        for inner, outer in zip(chain, chain[1:], strict=False)
        if values[inner] >= values[outer]
    ]


def check() -> NoReturn:
    """Exit 0 when the environment's settings parse, else EX_CONFIG with the one-line message on stderr.

    gunicorn.conf.py runs it in a child process, so that no module of the app enters gunicorn's master.
    """
    try:
        from_env()
    except ConfigError as exc:
        sys.stderr.write(exc.format_message() + "\n")
        sys.exit(exc.exit_code)
    sys.exit(0)
