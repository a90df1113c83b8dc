"""What a setting's raw text may be: one parser per kind of value.
A parser returns the value or raises ConfigError with a message that names the setting and never repeats a secret."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from psycopg import ProgrammingError, pq
from psycopg.conninfo import conninfo_to_dict

from ..core.errors import ConfigError as ConfigError  # where the settings' modules import it from
from ..core.vocabulary import NoUser
from ..providers import SCHEMES
from . import conninfo

# A setting's parser: (its name, its raw text) -> its value, or ConfigError naming it.
Parser = Callable[[str, str], Any]


def integer(minimum: int, why: str = "") -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}{why}")
        return value

    return parse


def boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    return value == "true"


def text(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{name} is empty")
    return raw.strip()


def currency(name: str, raw: str) -> str:
    # ISO 4217, written as Stripe writes it: three lowercase letters.
    if not re.fullmatch(r"[A-Za-z]{3}", raw.strip()):
        raise ConfigError(f"{name} must be a three-letter ISO 4217 currency code, got {raw!r}")
    return raw.strip().lower()


def scheme(name: str, raw: str) -> str:
    if raw not in SCHEMES:
        raise ConfigError(f"{name} must be one of {', '.join(SCHEMES)}, got {raw!r}")
    return raw


def secrets(name: str, raw: str) -> tuple[bytes, ...]:
    """One secret, or several separated by commas (rotation); spaces around each are ignored."""
    # A comma always separates: a secret cannot hold one. `\,` is refused, not read as an escape, and so is an empty
    # entry, so that no list is read otherwise than it was written.
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


# libpq's own parameter names: the only quoted words of its parse errors
# that are repeated in ours (anything else quoted may be a password).
_LIBPQ_KEYWORDS = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}


def database_url(name: str, raw: str) -> str:
    url = text(name, raw)
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


def redis_url(name: str, raw: str) -> str:
    """Check the shape redis-py's from_url expects; the message never repeats the URL (it may hold a password)."""
    url = text(name, raw)
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


def api_key(name: str, raw: str) -> str | None:
    """A provider's API key, or None (unset: `flask reconcile` says so). Read as a string, never repeated."""
    key = raw.strip()
    if any(character.isspace() for character in key):
        raise ConfigError(f"{name} holds whitespace: an API key has none")
    return key or None


def api_base(name: str, raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{name} must be an http:// or https:// address, got {raw!r}")
    return raw.strip().rstrip("/")


def optional_api_base(name: str, raw: str) -> str | None:
    """An API address, or None (unset: the provider's own)."""
    return api_base(name, raw) if raw.strip() else None


def optional_boolean(name: str, raw: str) -> bool | None:
    """true or false, or None (unset: the scheme decides)."""
    return boolean(name, raw) if raw.strip() else None


# Stripe's: a metadata key is up to 40 characters, and has no square brackets.
METADATA_KEY = re.compile(r"[^\s\[\]]{1,40}")


def metadata_key(name: str, raw: str) -> str:
    if not METADATA_KEY.fullmatch(raw.strip()):
        raise ConfigError(f"{name} must be a metadata key of 1 to 40 characters, without spaces or []: got {raw!r}")
    return raw.strip()


def no_user(name: str, raw: str) -> NoUser:
    try:
        return NoUser(raw.strip().lower())
    except ValueError:
        raise ConfigError(f"{name} must be one of {', '.join(NoUser)}, got {raw!r}") from None


def cert_hosts(name: str, raw: str) -> frozenset[str]:
    """host or host:port entries (443 when none), lower case: where a PAYPAL-CERT-URL may point."""
    hosts = set()
    for entry in (e.strip().lower() for e in raw.split(",")):
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "443")
        if not re.fullmatch(r"[a-z0-9.-]{1,253}", host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{name} must be comma-separated host names, each with an optional :port, got {raw!r}")
        hosts.add(f"{host}:{int(port)}")
    return frozenset(hosts)


def ca_file(name: str, raw: str) -> Path | None:
    """A PEM file of trusted roots, or None (unset: certifi's bundle)."""
    if not raw.strip():
        return None
    path = Path(raw.strip()).resolve()
    if not path.is_file():
        raise ConfigError(f"{name} names no file: {path}")
    return path


def prepare_threshold(name: str, raw: str) -> int | None:
    # `off` (None to psycopg): never prepare, for poolers that cannot route
    # prepared statements (PgBouncer before 1.21 in transaction mode).
    if raw.strip().lower() == "off":
        return None
    return integer(0)(name, raw)
