"""Typed configuration: environment variables parsed once into a frozen Settings, failing fast.

Its imports are light (no Flask): gunicorn's master runs `check()` in a child process.
"""

import base64
import binascii
import enum
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import SplitResult, urlsplit

import click
from psycopg import ProgrammingError, pq
from psycopg.conninfo import conninfo_to_dict

from . import conninfo
from .events import DEFAULT_SOURCE, NoUser, Policy, Users
from .signature import SCHEMES

if TYPE_CHECKING:
    from flask import Flask

# Standard Webhooks secrets are written whsec_<base64 of the key>.
WHSEC_PREFIX = "whsec_"
# The shortest HMAC key accepted (under standard-webhooks, once decoded).
# A captured delivery lets anyone search for the key offline (its signature
# is an HMAC of bytes they have); 16 bytes can carry 128 bits, out of reach
# of such a search. Providers issue longer ones: Stripe whsec_ + 32
# characters, Standard Webhooks keys of 24 to 64 bytes, GitHub any string.
MIN_SECRET_BYTES = 16


# schema.sql is kept at the top of the repository, and shipped inside this
# package as flaskr ships its schema: app/schema.sql is a symlink to it in
# the checkout and a copy in the wheel, so an installed host finds it from
# any directory. SCHEMA_PATH names another file.
DEFAULT_SCHEMA_PATH = Path(__file__).resolve().parent / "schema.sql"


class ConfigError(click.ClickException):
    """A setting is missing or invalid; the message names it, never a secret.

    A ClickException, so that a `flask` command prints it as one line and
    exits with EX_CONFIG instead of a traceback (Flask builds the app before
    the command runs, outside any code of ours).
    """

    # sysexits.h's EX_CONFIG: a supervisor tells a configuration error from a crash (1).
    exit_code = os.EX_CONFIG

    def format_message(self) -> str:
        return f"configuration error: {self.message}"


class UnknownSourceError(LookupError):
    """No source of that name is configured: answered 404."""


# Also in schema.sql's CHECK on webhook_events.source.
SOURCE_NAME = re.compile(r"[a-z0-9-]{1,64}")
# Each named source's settings: WEBHOOK_<NAME>_<key>.
SOURCE_SETTINGS = ("SECRET", "SCHEME", "TOLERANCE_SECONDS", "MOVED_FROM", "API_KEY", "USER_METADATA_KEY", "NO_USER")


@dataclass(frozen=True)
class Source:
    """One sender: its name, signature scheme, secrets (keys, as the scheme uses them) and replay window.

    moved_from names the source whose events these are (WEBHOOK_<NAME>_MOVED_FROM):
    a provider moved to this route keeps its events' identity, (source, id).
    """

    name: str
    scheme: str
    secrets: tuple[bytes, ...]
    tolerance: int
    moved_from: str | None = None
    # The provider's API key, for `flask reconcile` (WEBHOOK_<NAME>_API_KEY); never in a repr.
    api_key: str | None = field(default=None, repr=False)
    # How its payments name their user (WEBHOOK_<NAME>_USER_METADATA_KEY, WEBHOOK_<NAME>_NO_USER).
    users: Users = Users()

    @property
    def event_source(self) -> str:
        """The source its events are stored, locked and deduplicated under."""
        return self.moved_from or self.name


# A setting's parser: (its name, its raw text) -> its value, or ConfigError naming it.
Parser = Callable[[str, str], Any]


def _int(minimum: int, why: str = "") -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}{why}")
        return value

    return parse


def _secrets(name: str, raw: str) -> tuple[bytes, ...]:
    """One secret, or several separated by commas (rotation); spaces around each are ignored.

    A comma always separates: a secret cannot hold one. `\\,` is refused, not
    read as an escape, and so is an empty entry, so that no list is read
    otherwise than it was written.
    """
    # Read as a string, never JSON-parsed: a digits-only secret stays a secret.
    entries = [s.strip() for s in raw.split(",")]
    if not any(entries):
        raise ConfigError(f"{name} is empty; set at least one signing secret")
    if "\\," in raw:
        raise ConfigError(f"{name} holds \\, but a comma cannot be escaped: it always separates two secrets")
    for index, secret in enumerate(entries):
        if not secret:
            raise ConfigError(f"{name} entry {index} (counted from 0) is empty: a comma always separates two secrets")
    return tuple(s.encode("utf-8") for s in entries)


def _long_enough(name: str, keys: tuple[bytes, ...], unit: str = "bytes") -> tuple[bytes, ...]:
    """Refuse a key shorter than MIN_SECRET_BYTES; the message names it by index, never by value."""
    for index, key in enumerate(keys):
        if len(key) < MIN_SECRET_BYTES:
            split = " (a comma always separates two secrets)" if len(keys) > 1 else ""
            raise ConfigError(f"{name} entry {index} (counted from 0) is shorter than {MIN_SECRET_BYTES} {unit}{split}")
    return keys


def _keys(name: str, secrets: tuple[bytes, ...], scheme: str) -> tuple[bytes, ...]:
    """The HMAC keys of a parsed secrets setting, as its scheme uses them (decoded under standard-webhooks)."""
    if scheme == "standard-webhooks":
        return _long_enough(name, _whsec_keys(name, secrets), f"bytes once decoded from {WHSEC_PREFIX}<base64>")
    return _long_enough(name, secrets)


def _scheme(name: str, raw: str) -> str:
    if raw not in SCHEMES:
        raise ConfigError(f"{name} must be one of {', '.join(SCHEMES)}, got {raw!r}")
    return raw


def _currency(name: str, raw: str) -> str:
    # ISO 4217, written as Stripe writes it: three lowercase letters.
    if not re.fullmatch(r"[A-Za-z]{3}", raw.strip()):
        raise ConfigError(f"{name} must be a three-letter ISO 4217 currency code, got {raw!r}")
    return raw.strip().lower()


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    return value == "true"


def _source_names(name: str, raw: str) -> tuple[str, ...]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for source in names:
        if not SOURCE_NAME.fullmatch(source) or source == DEFAULT_SOURCE:
            raise ConfigError(f"{name}: {source!r} is not a source name (1-64 lowercase letters, digits and -; "
                              f"not {DEFAULT_SOURCE!r})")
    if len(set(names)) != len(names):
        raise ConfigError(f"{name} names a source twice")
    for source in names:
        # "signature" would read its scheme from WEBHOOK_SIGNATURE_SCHEME, the default source's.
        taken = [f"{_prefix(source)}{key}" for key in SOURCE_SETTINGS if f"{_prefix(source)}{key}" in SETTINGS]
        if taken:
            raise ConfigError(f"{name}: source {source!r} would be configured by {taken[0]}, another setting")
    return tuple(names)


def _prefix(source: str) -> str:
    return f"WEBHOOK_{source.upper().replace('-', '_')}_"


def _text(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{name} is empty")
    return raw.strip()


# libpq's own parameter names: the only quoted words of its parse errors
# that are repeated in ours (anything else quoted may be a password).
_LIBPQ_KEYWORDS = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}


def _database_url(name: str, raw: str) -> str:
    url = _text(name, raw)
    try:
        params = conninfo_to_dict(url)  # libpq's own parser: what the pool will be given
    except ProgrammingError as exc:
        reason = re.sub(r'"([^"]*)"', lambda m: m[0] if m[1] in _LIBPQ_KEYWORDS else '"..."', str(exc).strip())
        raise ConfigError(f"{name} is not a PostgreSQL URL or key=value conninfo string: {reason}") from None
    try:
        conninfo.check(params)  # what libpq checks only when it connects
    except conninfo.BadValueError as exc:
        raise ConfigError(f"{name} {exc}") from None
    return url


REDIS_SCHEMES = ("redis", "rediss", "unix")


def _redis_url(name: str, raw: str) -> str:
    """Check the shape redis-py's from_url expects; the message never repeats the URL (it may hold a password)."""
    url = _text(name, raw)
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        raise ConfigError(f"{name} must start with redis://, rediss:// or unix://")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port when it is read
    except ValueError:
        raise ConfigError(f"{name} has a port that is not a number") from None
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"{name} names no socket path after unix://")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"{name} names no host")
    database = parts.path.strip("/") if parts.scheme != "unix" else None
    if database and not database.isdigit():
        raise ConfigError(f"{name} has a database number that is not a number")
    return url


def _api_key(name: str, raw: str) -> str | None:
    """A provider's API key, or None (unset: `flask reconcile` says so). Read as a string, never repeated."""
    key = raw.strip()
    if any(character.isspace() for character in key):
        raise ConfigError(f"{name} holds whitespace: an API key has none")
    return key or None


def _api_base(name: str, raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{name} must be an http:// or https:// address, got {raw!r}")
    return raw.strip().rstrip("/")


# Stripe's: a metadata key is up to 40 characters, and has no square brackets.
METADATA_KEY = re.compile(r"[^\s\[\]]{1,40}")


def _metadata_key(name: str, raw: str) -> str:
    if not METADATA_KEY.fullmatch(raw.strip()):
        raise ConfigError(f"{name} must be a metadata key of 1 to 40 characters, without spaces or []: got {raw!r}")
    return raw.strip()


def _no_user(name: str, raw: str) -> NoUser:
    try:
        return NoUser(raw.strip().lower())
    except ValueError:
        raise ConfigError(f"{name} must be one of {', '.join(NoUser)}, got {raw!r}") from None


def _schema_path(name: str, raw: str) -> Path:
    # A relative path is taken from the current directory, as any command's file argument.
    return Path(raw.strip()).resolve() if raw.strip() else DEFAULT_SCHEMA_PATH


def _prepare_threshold(name: str, raw: str) -> int | None:
    # `off` (None to psycopg): never prepare, for poolers that cannot route
    # prepared statements (PgBouncer before 1.21 in transaction mode).
    if raw.strip().lower() == "off":
        return None
    return _int(0)(name, raw)


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


# name -> (parser, default). A default of None means the setting is required.
# The timeouts nest so that the inner one fails first with a clean answer:
# lock wait < statement < pool acquire < Redis lock TTL <= gunicorn timeout.
SETTINGS: dict[str, tuple[Parser, str | None]] = {
    "DATABASE_URL": (_database_url, None),
    "REDIS_URL": (_redis_url, None),
    # A Redis Cluster needs redis-py's cluster client (slot routing, MOVED);
    # a plain client answers MOVED for most keys. Off: one Redis server.
    "REDIS_CLUSTER": (_bool, "false"),
    # Required unless WEBHOOK_SOURCES names sources (then the default source is off).
    "WEBHOOK_SECRET": (_secrets, None),
    "WEBHOOK_SIGNATURE_SCHEME": (_scheme, "hmac-sha256"),
    "WEBHOOK_SOURCES": (_source_names, ""),
    # Stripe's and Standard Webhooks' own default: a signed timestamp older
    # (or further ahead) than this is a replay (or a forged clock).
    # stripe-python reads 0 as "do not check"; here the window is never off.
    "WEBHOOK_TOLERANCE_SECONDS": (_int(1, ": the replay window cannot be switched off"), "300"),
    # Long enough to cover a delivery's whole transaction (see the nesting above).
    "LOCK_TTL_MS": (_int(1), "10000"),
    "MAX_BODY_BYTES": (_int(1), "1048576"),
    # A row lock held by a twin delivery is given up first: 503, retry later.
    "PG_LOCK_TIMEOUT_MS": (_int(1), "1000"),
    "PG_STATEMENT_TIMEOUT_MS": (_int(1), "2000"),
    # Waiting for a pooled connection (or a dead server) ends in 503 after this.
    "PG_POOL_TIMEOUT_MS": (_int(1), "3000"),
    # One connection per gunicorn thread: a request never waits for another's.
    "PG_POOL_SIZE": (_int(1), "4"),
    # psycopg's own default: a statement run 5 times on a connection is
    # prepared, saving its parsing; `off` behind a pooler that cannot route them.
    "PG_PREPARE_THRESHOLD": (_prepare_threshold, "5"),
    # Well under a second, so a dead Redis degrades the service, not stalls it.
    "REDIS_TIMEOUT_MS": (_int(1), "250"),
    # How long Redis remembers a committed event, so that its re-deliveries
    # skip PostgreSQL; older ones are answered by PostgreSQL, as after a flush.
    "REDIS_DONE_TTL_SECONDS": (_int(1), "86400"),
    # Told to a 409/503 sender: the twin's transaction or an outage is short.
    "RETRY_AFTER_SECONDS": (_int(1), "1"),
    # Payments in another currency are refused (422), never credited as if in this one.
    "LEDGER_CURRENCY": (_currency, "usd"),
    # Stripe's test-mode events (livemode false) are refused (422) unless this is true.
    "STRIPE_ACCEPT_TEST_EVENTS": (_bool, "false"),
    # `flask reconcile`'s key for the default source: a Stripe restricted key
    # that may read Events. Unset: the command says so (serving needs none).
    "WEBHOOK_API_KEY": (_api_key, ""),
    # The default source's PaymentIntent metadata key that names the user
    # (a named source's: WEBHOOK_<NAME>_USER_METADATA_KEY, default this one).
    "WEBHOOK_USER_METADATA_KEY": (_metadata_key, "user_id"),
    # What a payment naming no user (no metadata, no linked customer) gets:
    # refuse (422, as before: nothing is silently dropped) or ignore (2xx,
    # recorded). A named source's: WEBHOOK_<NAME>_NO_USER, default this one.
    "WEBHOOK_NO_USER": (_no_user, "refuse"),
    # Stripe's API address; the tests point it at a loopback stand-in.
    "STRIPE_API_BASE": (_api_base, "https://api.stripe.com"),
    # An hourly timer runs reconcile: three hours without a success is two
    # runs missed and the third late, worth a ticket (the alert reads it).
    "RECONCILE_MAX_AGE_SECONDS": (_int(60), "10800"),
    # Where `flask init-db` reads the schema: the package's own unless set.
    "SCHEMA_PATH": (_schema_path, ""),
}


@dataclass(frozen=True)
class Settings:
    """Every setting, parsed and checked: one field per row of SETTINGS (its name in lower case), and what they make.

    Built once, by from_env(); create_app keeps it in app.extensions (Settings.of).
    Read below Needs.SERVICE (`read`), the required settings it left unread are None.
    """

    database_url: str
    redis_url: str | None  # None: not read (below Needs.REDIS)
    redis_cluster: bool
    # The default source's keys, as its scheme uses them; None when it is off (only named sources).
    webhook_secret: tuple[bytes, ...] | None
    webhook_signature_scheme: str
    webhook_sources: tuple[str, ...]
    webhook_tolerance_seconds: int
    lock_ttl_ms: int
    max_body_bytes: int
    pg_lock_timeout_ms: int
    pg_statement_timeout_ms: int
    pg_pool_timeout_ms: int
    pg_pool_size: int
    pg_prepare_threshold: int | None  # None: never prepare (`off`)
    redis_timeout_ms: int
    redis_done_ttl_seconds: int
    retry_after_seconds: int
    ledger_currency: str
    stripe_accept_test_events: bool
    webhook_api_key: str | None = field(repr=False)  # None: unset
    webhook_user_metadata_key: str
    webhook_no_user: NoUser
    stripe_api_base: str
    reconcile_max_age_seconds: int
    schema_path: Path
    # Every source served, by name: the default one (when it has a secret), then the named ones. Read-only.
    sources: Mapping[str, Source]
    policy: Policy
    read: Needs = Needs.SERVICE  # what from_env was asked to read

    @staticmethod
    def of(app: "Flask") -> "Settings":
        """The settings create_app built the app from."""
        settings: Settings = app.extensions[EXTENSION]
        return settings


# Settings' key in app.extensions; and, for an app read below Needs.SERVICE, why each level above failed.
EXTENSION = "settings"
PROBLEMS = "settings_problems"


def from_env(environ: Mapping[str, str] | None = None, needs: Needs = Needs.SERVICE) -> Settings:
    """The settings that needs reads, parsed from environ (default os.environ); ConfigError names the first bad one.

    Below Needs.SERVICE the required settings that level does not read are not
    looked at (their fields are None, `sources` is empty), nor are the sources'.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    named = _source_names("WEBHOOK_SOURCES", environ.get("WEBHOOK_SOURCES", ""))
    for name, (parse, default) in SETTINGS.items():
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
    sources: dict[str, Source] = {}
    if needs == Needs.SERVICE:
        if values["WEBHOOK_SECRET"] is not None:
            values["WEBHOOK_SECRET"] = _keys("WEBHOOK_SECRET", values["WEBHOOK_SECRET"],
                                             values["WEBHOOK_SIGNATURE_SCHEME"])
        sources = _sources(values, named, environ)
        _refuse_shared_secrets(sources)
    return Settings(**{name.lower(): value for name, value in values.items()},
                    sources=MappingProxyType(sources),
                    policy=Policy(values["LEDGER_CURRENCY"], values["STRIPE_ACCEPT_TEST_EVENTS"],
                                  MappingProxyType({s.event_source: s.users for s in sources.values()})),
                    read=needs)


def from_env_as_far_as_it_goes(environ: Mapping[str, str]) -> tuple[Settings, dict[Needs, ConfigError]]:
    """The settings at the highest level environ allows, and why each level above it failed.

    For `flask` commands, each of which declares what it needs (commands.needs).
    ConfigError when even Needs.DATABASE fails.
    """
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


def _sources(values: Mapping[str, Any], named: tuple[str, ...], environ: Mapping[str, str]) -> dict[str, Source]:
    """Every source served, by name: the default one (when it has a secret), then the named ones."""
    sources = {}
    if values["WEBHOOK_SECRET"] is not None:
        sources[DEFAULT_SOURCE] = Source(DEFAULT_SOURCE, values["WEBHOOK_SIGNATURE_SCHEME"],
                                         values["WEBHOOK_SECRET"], values["WEBHOOK_TOLERANCE_SECONDS"],
                                         api_key=values["WEBHOOK_API_KEY"],
                                         users=Users(values["WEBHOOK_USER_METADATA_KEY"], values["WEBHOOK_NO_USER"]))
    for name in named:
        prefix = _prefix(name)
        raw_secret = environ.get(prefix + "SECRET")
        if raw_secret is None:
            raise ConfigError(f"{prefix}SECRET is required for source {name!r} (named in WEBHOOK_SOURCES)")
        scheme = _scheme(prefix + "SCHEME", environ.get(prefix + "SCHEME", name if name in SCHEMES else "hmac-sha256"))
        secrets = _keys(prefix + "SECRET", _secrets(prefix + "SECRET", raw_secret), scheme)
        raw_tolerance = environ.get(prefix + "TOLERANCE_SECONDS")
        tolerance: int = (values["WEBHOOK_TOLERANCE_SECONDS"] if raw_tolerance is None
                          else SETTINGS["WEBHOOK_TOLERANCE_SECONDS"][0](prefix + "TOLERANCE_SECONDS", raw_tolerance))
        moved_from = environ.get(prefix + "MOVED_FROM")
        key = environ.get(prefix + "USER_METADATA_KEY")
        no_user = environ.get(prefix + "NO_USER")
        users = Users(values["WEBHOOK_USER_METADATA_KEY"] if key is None
                      else _metadata_key(prefix + "USER_METADATA_KEY", key),
                      values["WEBHOOK_NO_USER"] if no_user is None else _no_user(prefix + "NO_USER", no_user),
                      prefix + "USER_METADATA_KEY" if key is not None else "WEBHOOK_USER_METADATA_KEY")
        sources[name] = Source(name, scheme, secrets, tolerance,
                               None if moved_from is None else _moved_from(prefix + "MOVED_FROM", moved_from, name),
                               _api_key(prefix + "API_KEY", environ.get(prefix + "API_KEY", "")), users)
    for source in sources.values():
        earlier = sources.get(source.moved_from) if source.moved_from is not None else None
        if earlier is not None and earlier.moved_from is not None:
            # One step, so that a source's events have one name whatever route they came by.
            raise ConfigError(f"{_prefix(source.name)}MOVED_FROM names {earlier.name!r}, itself moved from "
                              f"{earlier.moved_from!r}: write {earlier.moved_from}")
    return sources


def _moved_from(name: str, raw: str, source: str) -> str:
    """The name of the source a provider was moved from; it need not be served any more."""
    old = raw.strip()
    if old != DEFAULT_SOURCE and not SOURCE_NAME.fullmatch(old):
        raise ConfigError(f"{name}: {old!r} is not a source name (1-64 lowercase letters, digits and -)")
    if old == source:
        raise ConfigError(f"{name} names the source itself")
    return old


def _refuse_shared_secrets(sources: Mapping[str, Source]) -> None:
    """Refuse a key that verifies for two sources with different events: one delivery would be credited twice."""
    owners: dict[bytes, Source] = {}
    for source in sources.values():
        for key in source.secrets:
            other = owners.setdefault(key, source)
            if other.event_source != source.event_source:
                raise ConfigError(
                    f"{_secret_setting(other.name)} and {_secret_setting(source.name)} share a secret: a delivery "
                    f"signed with it would be credited once per source; give each its own, or, to move a provider "
                    f"from {other.name!r} to {source.name!r}, "
                    f"set {_prefix(source.name)}MOVED_FROM={other.event_source}")


def api_key_setting(source: str) -> str:
    """The setting that holds source's API key (`flask reconcile`)."""
    return "WEBHOOK_API_KEY" if source == DEFAULT_SOURCE else f"{_prefix(source)}API_KEY"


def _secret_setting(source: str) -> str:
    return "WEBHOOK_SECRET" if source == DEFAULT_SOURCE else f"{_prefix(source)}SECRET"


def _whsec_keys(name: str, secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return tuple(_whsec_key(i, s, name) for i, s in enumerate(secrets))


def _whsec_key(index: int, secret: bytes, name: str = "WEBHOOK_SECRET") -> bytes:
    """Decode a Standard Webhooks secret to its key; the message names it by index, never by value."""
    where = f"{name} entry {index} (counted from 0)"
    if not secret.startswith(WHSEC_PREFIX.encode()):
        raise ConfigError(f"{where} must be written {WHSEC_PREFIX}<base64> under standard-webhooks")
    encoded = secret[len(WHSEC_PREFIX):]
    try:
        # Padding is often left off; validate=True refuses anything outside the alphabet.
        key = base64.b64decode(encoded + b"=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ConfigError(f"{where} is not valid base64 after {WHSEC_PREFIX}") from None
    if not key:
        raise ConfigError(f"{where} has an empty key after {WHSEC_PREFIX}")
    return key


def parse(mapping: Mapping[str, object]) -> Settings:
    """Validate a test's config dict the same way as the environment."""
    return from_env({name: str(value) for name, value in mapping.items()})


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
