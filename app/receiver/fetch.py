"""The fetch step: a provider's API asked on receipt for what a notification cannot prove
(docs/providers/README.md, "What is signed and what is fetched")."""

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from ..core.errors import ProviderRefusedError
from ..core.provider import Fetcher
from ..core.signing import Certificates
from ..intake.events import Effect, Event, Policy, effect_of
from ..providers import PROVIDERS
from ..providers import of as provider_of
from ..providers.budget import Budget
from ..providers.outbound import Outbound
from ..settings.config import Settings
from ..settings.sources import Source, api_key_setting
from ..store import ledger
from ..store.ledger import Refetch

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

EXTENSION = "fetch"


class Fetched(NamedTuple):
    """The event the money is decided from, its effect, and the provider's bytes of it (None: none fetched)."""

    event: Event
    effect: Effect
    body: bytes | None = None
    contradicts: bool = False  # the provider's record moves other money than the notification said


class NoAPIKeyError(ProviderRefusedError):
    """An event whose money is read from its provider's API (a thin event) reached a source with no API key: 503,
    counted as a call refused for credentials ("no_api_key"), until the key is set."""


class Providers:
    """The process's calls to providers: each scheme's certificates, where its verify needs them, and each source's
    API."""

    def __init__(self, outbound: Outbound, certificates: dict[str, Certificates], fetchers: dict[str, Fetcher],
                 sources: "Mapping[str, Source]", budgets: "list[Budget]") -> None:
        self.sources = sources
        self.budgets = budgets  # one per provider account
        self.outbound = outbound
        self.certificates = certificates  # by scheme: what its verify is passed beyond the secrets
        self.fetchers = fetchers  # by source name: the sources that ask their provider's API

    def serving(self, event_source: str) -> Source | None:
        """A served source of event_source's events that can ask its provider (its settings are the service's)."""
        return next((s for s in self.sources.values() if s.event_source == event_source and s.name in self.fetchers),
                    None)

    def asks(self, source: Source, event: Event) -> bool:
        """Whether fetch asks event's provider (a thin event's object, or a fetching source's record)."""
        api = self.fetchers.get(source.name)
        return provider_of(source.scheme).needs_api(event) if api is None else api.names(event) is not None

    def fetch(self, source: Source, event: Event, policy: Policy, listed: bytes | None = None) -> Fetched:
        """event as its provider's API has it when source asks it (else event itself), and its effect; listed: the
        record's bytes as a page of the provider's list carried them, read as the API's answer would be."""
        # ProviderUnavailableError (503) when the provider cannot answer now, or refuses our credentials (its subclass
        # ProviderRefusedError: an alert). An event the provider has no record of has the unknown effect, its problem
        # saying so (422, recorded).
        api = self.fetchers.get(source.name)
        provider = provider_of(source.scheme)
        if api is None and provider.needs_api(event):
            self.outbound.observe(provider.scheme, "no_api_key", 0.0)
            raise NoAPIKeyError(f"source {source.name} received event {event.id}, whose money is read from "
                                f"{provider.name}'s API: set {api_key_setting(source.name)}")
        what = None if api is None else api.names(event)
        if api is None or what is None:
            return Fetched(event, effect_of(event, policy))
        body = api.get(event) if listed is None else listed
        if body is None:
            # Any later effect of the id replaces this one (money.sql): a body forged under a genuine event's id
            # before the genuine one exists cannot keep it from applying.
            return Fetched(event, Effect(None, sha256=ledger.UNKNOWN_EFFECT, problem=(
                f"{api.name}'s API has no {what}: nothing applied; a retry, or `flask events replay`, "
                f"applies it once {api.name} has it")))
        record = api.read(event, body)
        effect = effect_of(record, policy)
        if provider.needs_api(event):  # a notification that names no money (a thin event) contradicts none
            return Fetched(record, effect, body)
        # Another account is another record: its keys differ, and so would the money of a type that moves any.
        contradicts = effect.sha256 != effect_of(event, policy).sha256 \
            or record.document.get("account") != event.document.get("account")
        if contradicts:
            log.warning("%s's record of event %s (source %s) moves other money than its notification: it decides",
                        api.name, event.id, source.name)
        return Fetched(record, effect, body, contradicts)


def refetch(app: "Flask", event_source: str, policy: Policy) -> "Refetch | None":
    """How `flask events replay` asks again for an event of event_source that its provider had no record of;
    None unless a served source of those events fetches (its settings are the service's)."""
    calls = of(app)
    served = calls.serving(event_source)
    if served is None:
        return None

    def ask(event: Event) -> tuple[Event, Effect, bytes | None]:
        return calls.fetch(served, event, policy)[:3]
    return ask


def init_app(app: "Flask") -> None:
    """The process's outbound calls (no connection is opened until a delivery needs one)."""
    settings = Settings.of(app)

    def observe(provider: str, result: str, seconds: float) -> None:
        metrics = app.extensions.get("metrics")  # made by the first request: a `flask` command counts nothing
        if metrics is not None:
            metrics.observe_call(provider, result, seconds)

    outbound = Outbound(settings.provider_slots, settings.provider_deadline_ms / 1000, observe)
    fetchers: dict[str, Fetcher] = {}
    budgets: dict[tuple[str, str], Budget] = {}
    for source in settings.sources.values():
        provider = provider_of(source.scheme)
        if source.api_key is None or provider.api is None:
            continue
        # One budget per provider account (its provider and key), however many sources name it; Redis shares it
        # between hosts.
        account = (source.scheme, source.api_key)
        budget = budgets[account] = budgets.get(account) or Budget(
            app.extensions.get("redis"), source.scheme, source.api_key, source.api_rate, source.api_rate_total)
        base = source.api_base
        api = provider.api(base or "", source.api_key, outbound, budget, source.fetch)
        if api is not None:
            fetchers[source.name] = api
    certificates = {scheme: provider.certificates(settings, outbound) for scheme, provider in PROVIDERS.items()
                    if provider.certificates is not None}
    app.extensions[EXTENSION] = Providers(outbound, certificates, fetchers, settings.sources, list(budgets.values()))


def of(app: "Flask") -> Providers:
    """The providers init_app made for the app."""
    providers: Providers = app.extensions[EXTENSION]
    return providers
