"""The fetch step: a provider's API asked on receipt for what a notification cannot prove
(docs/providers/README.md, "What is signed and what is fetched")."""

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..core.vocabulary import load
from ..intake.events import Effect, Event, InvalidEventError, InvalidJSONError, Policy, effect_of, parse
from ..providers import paypal, razorpay, stripe
from ..providers.budget import Budget
from ..providers.outbound import Outbound, ProviderRefusedError, ProviderUnavailableError
from ..settings.config import Settings
from ..settings.sources import Source, api_key_setting
from ..store import ledger
from ..store.ledger import Refetch

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

EXTENSION = "fetch"


class Fetcher(Protocol):
    """How the fetch step asks a provider for the record an event's money is read from."""

    name: str  # the provider's, in messages

    def names(self, event: Event) -> str | None: ...  # the record, in messages ("event evt_1"); None: none to ask

    def get(self, event: Event) -> bytes | None: ...  # its bytes; None: the provider has no such record

    def read(self, event: Event, body: bytes) -> Event: ...  # event, its money as the record says


class ByEventId:
    """A Fetcher over an API that answers an event by its id (Stripe's, PayPal's): the record is the event."""

    def __init__(self, api: "stripe.API | paypal.API", scheme: str) -> None:
        self.api, self.scheme, self.name = api, scheme, api.name

    def names(self, event: Event) -> str | None:
        return f"event {event.id}"

    def get(self, event: Event) -> bytes | None:
        return self.api.event(event)

    def read(self, event: Event, body: bytes) -> Event:
        return as_fetched(event, body, self.scheme, self.name)


class Fetched(NamedTuple):
    """The event the money is decided from, its effect, and the provider's bytes of it (None: none fetched)."""

    event: Event
    effect: Effect
    body: bytes | None = None
    contradicts: bool = False  # the provider's record moves other money than the notification said


class NoAPIKeyError(ProviderRefusedError):
    """A thin event that moves money reached a source with no API key to fetch its object with: 503, counted as
    a call refused for credentials ("no_api_key"), until the key is set."""


class Providers:
    """The process's calls to providers: the PayPal certificates and each fetching source's API."""

    def __init__(self, outbound: Outbound, certificates: paypal.Certificates, fetchers: dict[str, Fetcher],
                 stripe_apis: dict[str, stripe.API], sources: "Mapping[str, Source]", budgets: "list[Budget]") -> None:
        self.sources = sources
        self.budgets = budgets  # one per provider account
        self.outbound = outbound
        self.certificates = certificates
        self.fetchers = fetchers  # by source name: the sources that fetch each event
        self.stripe_apis = stripe_apis  # by source name: the stripe sources with an API key (thin events' objects)

    def serving(self, event_source: str) -> Source | None:
        """A served source of event_source's events that can ask its provider (its settings are the service's)."""
        return next((s for s in self.sources.values()
                     if s.event_source == event_source and (s.name in self.fetchers or s.name in self.stripe_apis)),
                    None)

    def asks(self, source: Source, event: Event) -> bool:
        """Whether fetch asks event's provider (a thin event's object, or a fetching source's record)."""
        if source.scheme == stripe.SCHEME and stripe.is_thin(event.document):
            return stripe.related_object(event) is not None
        api = self.fetchers.get(source.name)
        return api is not None and api.names(event) is not None

    def fetch(self, source: Source, event: Event, policy: Policy, listed: bytes | None = None) -> Fetched:
        """event as its provider's API has it, when source fetches; event itself otherwise; and its effect.
        listed: the record's bytes as a page of the provider's list carried them (app/receiver/pages.py), read
        here as the API's answer for it would be, without asking again.

        ProviderUnavailableError (503) when the provider cannot answer now, or
        refuses our credentials (its subclass ProviderRefusedError: an alert).
        An event the provider has no record of has the unknown effect, its
        problem saying so (422, recorded).
        """
        if source.scheme == stripe.SCHEME and stripe.is_thin(event.document):
            return self._thin(source, event, policy, listed)
        said = effect_of(event, policy)
        api = self.fetchers.get(source.name)
        what = None if api is None else api.names(event)
        if api is None or what is None:
            return Fetched(event, said)
        body = api.get(event) if listed is None else listed
        if body is None:
            # Any later effect of the id replaces this one (money.sql): a body forged under a genuine event's id
            # before the genuine one exists cannot keep it from applying.
            return Fetched(event, Effect(None, sha256=ledger.UNKNOWN_EFFECT, problem=(
                f"{api.name}'s API has no {what}: nothing applied; a retry, or `flask events replay`, "
                f"applies it once {api.name} has it")))
        record = api.read(event, body)
        effect = effect_of(record, policy)
        # Another account is another record: its keys differ, and so would the money of a type that moves any.
        contradicts = effect.sha256 != said.sha256 or record.document.get("account") != event.document.get("account")
        if contradicts:
            log.warning("%s's record of event %s (source %s) moves other money than its notification: it decides",
                        api.name, event.id, source.name)
        return Fetched(record, effect, body, contradicts)


    def _thin(self, source: Source, event: Event, policy: Policy, listed: bytes | None = None) -> Fetched:
        """A thin event with its related object as Stripe's API has it now, in the event's account context."""
        related = stripe.related_object(event)
        if related is None:  # a type that moves no money (meters, accounts): stored and acknowledged
            return Fetched(event, effect_of(event, policy))
        api = self.stripe_apis.get(source.name)
        if api is None:
            self.outbound.observe(stripe.SCHEME, "no_api_key", 0.0)
            raise NoAPIKeyError(f"source {source.name} received thin event {event.id}, whose money is read from "
                                f"Stripe's API: set {api_key_setting(source.name)}")
        body = api.related(related) if listed is None else listed
        if body is None:
            where = f" in {related.context}" if related.context else ""
            return Fetched(event, Effect(None, sha256=ledger.UNKNOWN_EFFECT, problem=(
                f"Stripe's API has no {related.type} {related.id}{where} (thin event {event.id}): nothing applied; "
                f"a retry, or `flask events replay`, applies it once Stripe has it")))
        record = stripe.with_related(event, related_document(body, related))
        return Fetched(record, effect_of(record, policy), body)


def related_document(body: bytes, related: stripe.Related) -> dict[str, Any]:
    """The object Stripe's API answered for related, or ProviderUnavailableError when it is not that object."""
    try:
        document = load(body)
    except InvalidJSONError as exc:
        raise ProviderUnavailableError(f"Stripe's API answered with a {related.type} that does not parse: {exc}") \
            from None
    if (document.get("object"), document.get("id")) != (related.type, related.id):
        raise ProviderUnavailableError(f"Stripe's API answered with another object than {related.type} {related.id}")
    return document


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


def as_fetched(event: Event, body: bytes, scheme: str, provider: str) -> Event:
    """event with the document its provider's API returned (body): its id, source and delivered bytes kept."""
    try:
        record = parse(body, scheme, None, event.source)
    except (InvalidJSONError, InvalidEventError) as exc:
        raise ProviderUnavailableError(f"{provider}'s API answered with an event that does not parse: {exc}") from None
    if record.id != event.id:
        raise ProviderUnavailableError(f"{provider}'s API answered with another event than the one asked for")
    return Event(event.id, record.type, record.data, record.document, event.body, event.source)


def init_app(app: "Flask") -> None:
    """The process's outbound calls (no connection is opened until a delivery needs one)."""
    settings = Settings.of(app)

    def observe(provider: str, result: str, seconds: float) -> None:
        metrics = app.extensions.get("metrics")  # made by the first request: a `flask` command counts nothing
        if metrics is not None:
            metrics.observe_call(provider, result, seconds)

    outbound = Outbound(settings.provider_slots, settings.provider_deadline_ms / 1000, observe)
    fetchers: dict[str, Fetcher] = {}
    stripe_apis: dict[str, stripe.API] = {}
    budgets: dict[tuple[str, str], Budget] = {}
    for source in settings.sources.values():
        if source.api_key is None:
            continue
        # One budget per provider account (its provider and key), however many sources name it; Redis shares it
        # between hosts.
        account = (source.scheme, source.api_key)
        budget = budgets[account] = budgets.get(account) or Budget(
            app.extensions.get("redis"), source.scheme, source.api_key, source.api_rate, source.api_rate_total)
        if source.scheme == paypal.SCHEME:
            fetchers[source.name] = ByEventId(paypal.API(source.api_base or paypal.API_BASE, source.api_key, outbound,
                                                         budget), source.scheme)
        elif source.scheme == razorpay.SCHEME:
            fetchers[source.name] = razorpay.API(source.api_base or razorpay.API_BASE, source.api_key, outbound,
                                                 budget)
        elif source.scheme == stripe.SCHEME:  # thin events' objects, whether or not it fetches every event
            stripe_apis[source.name] = stripe.API(source.api_base or settings.stripe_api_base, source.api_key, outbound,
                                                  budget)
            fetchers[source.name] = ByEventId(stripe_apis[source.name], source.scheme)
        if not source.fetch:
            fetchers.pop(source.name, None)
    certificates = paypal.Certificates(settings.paypal_cert_hosts, outbound, settings.paypal_ca_file)
    app.extensions[EXTENSION] = Providers(outbound, certificates, fetchers, stripe_apis, settings.sources,
                                          list(budgets.values()))


def of(app: "Flask") -> Providers:
    """The providers init_app made for the app."""
    providers: Providers = app.extensions[EXTENSION]
    return providers
