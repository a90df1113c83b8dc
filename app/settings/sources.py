"""The sources: who may send deliveries, each with its route, scheme, secrets and policy.
The default source is configured by the global settings (config.py), each named one by WEBHOOK_<NAME>_<key>; what a
scheme asks of them (its keys, its API key, whether and where it fetches) is its Provider's (app/core/provider.py)."""

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.vocabulary import DEFAULT_SOURCE, Users
from ..providers import SCHEMES, of
from . import parsers
from .parsers import ConfigError

# Also in schema.sql's CHECK on webhook_events.source.
SOURCE_NAME = re.compile(r"[a-z0-9-]{1,64}")
# Each named source's settings: WEBHOOK_<NAME>_<key> (read says which default to the default source's).
SOURCE_SETTINGS = ("SECRET", "SCHEME", "TOLERANCE_SECONDS", "MOVED_FROM", "API_KEY", "USER_METADATA_KEY", "NO_USER",
                   "API_BASE", "FETCH", "API_RATE", "API_RATE_TOTAL")


@dataclass(frozen=True)
class Source:
    """One sender: its name, signature scheme, secrets (keys, as the scheme uses them) and replay window."""

    name: str
    scheme: str
    secrets: tuple[bytes, ...]
    tolerance: int
    # The source whose events these are (WEBHOOK_<NAME>_MOVED_FROM): a provider moved to this route keeps its
    # events' identity, (source, id).
    moved_from: str | None = None
    # The provider's API key, for `flask reconcile`, the audit and the fetch (WEBHOOK_<NAME>_API_KEY); never in a repr.
    api_key: str | None = field(default=None, repr=False)
    # How its payments name their user (WEBHOOK_<NAME>_USER_METADATA_KEY, WEBHOOK_<NAME>_NO_USER).
    users: Users = Users()
    # Whether each event is fetched from the provider's API (WEBHOOK_<NAME>_FETCH), and that API's address
    # (_api_base: always set when its provider has an API).
    fetch: bool = False
    api_base: str | None = None
    # Its provider account's budget, requests a second per endpoint and in all (WEBHOOK_<NAME>_API_RATE, _TOTAL).
    api_rate: int = 10
    api_rate_total: int = 20

    @property
    def event_source(self) -> str:
        """The source its events are stored, locked and deduplicated under."""
        return self.moved_from or self.name


# A named source's budget, as WEBHOOK_API_RATE's.
RATE = parsers.integer(1)
# The replay window of a named source, as WEBHOOK_TOLERANCE_SECONDS's.
TOLERANCE = parsers.integer(1, ": the replay window cannot be switched off")


def names(name: str, raw: str, taken: Collection[str]) -> tuple[str, ...]:
    """The named sources of WEBHOOK_SOURCES; none may be configured by a setting in taken (the global ones)."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for source in names:
        if not SOURCE_NAME.fullmatch(source) or source == DEFAULT_SOURCE:
            raise ConfigError(f"{name}: {source!r} is not a source name (1-64 lowercase letters, digits and -; "
                              f"not {DEFAULT_SOURCE!r})")
    if len(set(names)) != len(names):
        raise ConfigError(f"{name} names a source twice")
    for source in names:
        # "signature" would read its scheme from WEBHOOK_SIGNATURE_SCHEME, the default source's.
        clashes = [f"{prefix(source)}{key}" for key in SOURCE_SETTINGS if f"{prefix(source)}{key}" in taken]
        if clashes:
            raise ConfigError(f"{name}: source {source!r} would be configured by {clashes[0]}, another setting")
    return tuple(names)


def prefix(source: str) -> str:
    return f"WEBHOOK_{source.upper().replace('-', '_')}_"


def keys(name: str, secrets: tuple[bytes, ...], scheme: str) -> tuple[bytes, ...]:
    """The entries of a parsed secrets setting as its scheme's verify uses them (its provider's keys)."""
    return of(scheme).keys(name, secrets)


def read(values: Mapping[str, Any], named: tuple[str, ...], environ: Mapping[str, str]) -> dict[str, Source]:
    """Every source served, by name: the default one (when it has a secret), then the named ones."""
    # values are the global settings, parsed (config.SETTINGS's names): the default source's, and the defaults of a
    # named source's own; environ is read for WEBHOOK_<NAME>_<key> of each name in named.
    sources = {}
    if values["WEBHOOK_SECRET"] is not None:
        scheme = values["WEBHOOK_SIGNATURE_SCHEME"]
        secrets = keys("WEBHOOK_SECRET", values["WEBHOOK_SECRET"], scheme)
        sources[DEFAULT_SOURCE] = Source(DEFAULT_SOURCE, scheme, secrets, values["WEBHOOK_TOLERANCE_SECONDS"],
                                         api_key=values["WEBHOOK_API_KEY"],
                                         users=Users(values["WEBHOOK_USER_METADATA_KEY"], values["WEBHOOK_NO_USER"]),
                                         fetch=_fetch("WEBHOOK_", scheme, values["WEBHOOK_FETCH"],
                                                      values["WEBHOOK_API_KEY"]),
                                         api_base=_api_base(values["WEBHOOK_API_BASE"], scheme, values),
                                         api_rate=values["WEBHOOK_API_RATE"],
                                         api_rate_total=values["WEBHOOK_API_RATE_TOTAL"])
    for name in named:
        own = prefix(name)
        raw_secret = environ.get(own + "SECRET")
        if raw_secret is None:
            raise ConfigError(f"{own}SECRET is required for source {name!r} (named in WEBHOOK_SOURCES)")
        scheme = parsers.scheme(own + "SCHEME",
                                environ.get(own + "SCHEME", name if name in SCHEMES else "hmac-sha256"))
        secrets = keys(own + "SECRET", parsers.secrets(own + "SECRET", raw_secret), scheme)
        raw_tolerance = environ.get(own + "TOLERANCE_SECONDS")
        tolerance: int = (values["WEBHOOK_TOLERANCE_SECONDS"] if raw_tolerance is None
                          else TOLERANCE(own + "TOLERANCE_SECONDS", raw_tolerance))
        moved_from = environ.get(own + "MOVED_FROM")
        key = environ.get(own + "USER_METADATA_KEY")
        no_user = environ.get(own + "NO_USER")
        users = Users(values["WEBHOOK_USER_METADATA_KEY"] if key is None
                      else parsers.metadata_key(own + "USER_METADATA_KEY", key),
                      values["WEBHOOK_NO_USER"] if no_user is None else parsers.no_user(own + "NO_USER", no_user),
                      own + "USER_METADATA_KEY" if key is not None else "WEBHOOK_USER_METADATA_KEY")
        api_key = parsers.api_key(own + "API_KEY", environ.get(own + "API_KEY", ""))
        fetch = parsers.optional_boolean(own + "FETCH", environ.get(own + "FETCH", ""))
        rates = [values[f"WEBHOOK_{key}"] if environ.get(own + key) is None else RATE(own + key, environ[own + key])
                 for key in ("API_RATE", "API_RATE_TOTAL")]
        sources[name] = Source(name, scheme, secrets, tolerance,
                               None if moved_from is None else _moved_from(own + "MOVED_FROM", moved_from, name),
                               api_key, users, _fetch(own, scheme, fetch, api_key),
                               _api_base(parsers.optional_api_base(own + "API_BASE", environ.get(own + "API_BASE", "")),
                                         scheme, values),
                               *rates)
    for source in sources.values():
        earlier = sources.get(source.moved_from) if source.moved_from is not None else None
        if earlier is not None and earlier.moved_from is not None:
            # One step, so that a source's events have one name whatever route they came by.
            raise ConfigError(f"{prefix(source.name)}MOVED_FROM names {earlier.name!r}, itself moved from "
                              f"{earlier.moved_from!r}: write {earlier.moved_from}")
    return sources


def _fetch(own: str, scheme: str, fetch: bool | None, api_key: str | None) -> bool:
    """Whether a source of scheme fetches each event (own: its settings' prefix), refusing what cannot be."""
    provider = of(scheme)
    if fetch is None:
        fetch = provider.must_fetch is not None
    if fetch and provider.api is None:
        raise ConfigError(f"{own}FETCH: the {scheme} scheme has no provider API to fetch events from")
    if provider.must_fetch is not None and not fetch:
        raise ConfigError(f"{own}FETCH cannot be false under {scheme}: {provider.must_fetch}")
    if fetch and api_key is None:
        written = f", {provider.api_key_written}" if provider.api_key_written else ""
        raise ConfigError(f"{own}API_KEY is required to fetch events under {scheme}: {provider.api_key_words}{written}")
    pattern = provider.api_key_pattern
    if fetch and api_key is not None and pattern and not re.fullmatch(pattern, api_key):
        raise ConfigError(f"{own}API_KEY must be {provider.api_key_words} written {provider.api_key_written}")
    return fetch


def _api_base(own: str | None, scheme: str, values: Mapping[str, Any]) -> str | None:
    """A source's provider API address: its own setting's, else the global setting its provider names
    (STRIPE_API_BASE), else its provider's own (None: it has no API)."""
    provider = of(scheme)
    if own is not None:
        return own
    return values[provider.api_base_setting] if provider.api_base_setting is not None else provider.api_base


def _moved_from(name: str, raw: str, source: str) -> str:
    """The name of the source a provider was moved from; it need not be served any more."""
    old = raw.strip()
    if old != DEFAULT_SOURCE and not SOURCE_NAME.fullmatch(old):
        raise ConfigError(f"{name}: {old!r} is not a source name (1-64 lowercase letters, digits and -)")
    if old == source:
        raise ConfigError(f"{name} names the source itself")
    return old


def refuse_shared_secrets(sources: Mapping[str, Source]) -> None:
    """Refuse a key that verifies for two sources with different events: one delivery would be credited twice."""
    owners: dict[bytes, Source] = {}
    for source in sources.values():
        for key in source.secrets:
            other = owners.setdefault(key, source)
            if other.event_source != source.event_source:
                raise ConfigError(
                    f"{secret_setting(other.name)} and {secret_setting(source.name)} share a secret: a delivery "
                    f"signed with it would be credited once per source; give each its own, or, to move a provider "
                    f"from {other.name!r} to {source.name!r}, "
                    f"set {prefix(source.name)}MOVED_FROM={other.event_source}")


def api_key_setting(source: str) -> str:
    """The setting that holds source's API key (`flask reconcile`)."""
    return "WEBHOOK_API_KEY" if source == DEFAULT_SOURCE else f"{prefix(source)}API_KEY"


def secret_setting(source: str) -> str:
    """The setting that holds source's signing secrets."""
    return "WEBHOOK_SECRET" if source == DEFAULT_SOURCE else f"{prefix(source)}SECRET"
