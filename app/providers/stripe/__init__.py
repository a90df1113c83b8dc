"""Stripe: its signature scheme (scheme.py), its snapshot and thin events' money rules keyed in a Connect event's
account (rules.py, thin.py, accounts.py), and one API client that fetches and lists (api.py, pages.py, audit.py)."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...core.provider import EventById, Provider, envelope, with_statuses
from ...core.records import EventList, MoneyRecords
from ...core.vocabulary import Event, Headers, Rule, load
from . import pages
from .accounts import account_of, check_account, is_account, is_thin
from .api import API_BASE, StripeAccounts, StripeAPI, StripeEvents
from .rules import (
    CHARGE_REFUNDED,
    CHECKOUT_SESSION_EVENTS,
    DISPUTE_FUNDS_REINSTATED,
    DISPUTE_FUNDS_WITHDRAWN,
    PAYMENT_INTENT_SUCCEEDED,
    REFUND_EVENTS,
    REFUND_STATES,
    RULES,
)
from .scheme import NAME, SCHEME, SIGNATURE_HEADER, sign, verify
from .thin import (
    THIN_RULES,
    is_subscription_session,
    parse_thin,
    related_document,
    related_object,
    subscription_session_rule,
    thin_sha256,
    with_related,
)

if TYPE_CHECKING:
    from ..budget import Budget
    from ..outbound import Outbound

__all__ = ["CHARGE_REFUNDED", "CHECKOUT_SESSION_EVENTS", "DISPUTE_FUNDS_REINSTATED", "DISPUTE_FUNDS_WITHDRAWN",
           "NAME", "PAYMENT_INTENT_SUCCEEDED", "PROVIDER", "REFUND_EVENTS", "REFUND_STATES", "RULES", "SCHEME",
           "SIGNATURE_HEADER", "THIN_RULES", "Records", "StripeAPI", "account_of", "is_account", "is_thin", "parse",
           "related_object", "sign", "verify", "with_related"]


def parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """A thin event, or a snapshot event (its `account` checked)."""
    if is_thin(document):
        return parse_thin(document, body, source)
    check_account(document)
    return envelope(document, body, headers, source)


def _stored(event_id: str, event_type: str, document: dict[str, Any], fetched: bool, body: bytes,
            source: str) -> Event | None:
    """A stored thin event, with its related object when the row kept it (fetched)."""
    if event_type not in THIN_RULES:
        return None
    delivered = load(body) if fetched else document
    if not is_thin(delivered):
        return None
    thin = Event(event_id, event_type, {}, delivered, body, source)
    return with_related(thin, document) if fetched else thin


def _compared_by(event: Event) -> bytes | None:
    return thin_sha256(event) if is_thin(event.document) else None


def _subscription_or(rule: Rule) -> Rule:
    """rule, refined to SUBSCRIPTION_SESSION (THIN_SUBSCRIPTION_SESSION) for a subscription Session's event."""
    return rule._replace(refine=lambda event: subscription_session_rule(event) if is_subscription_session(event)
                         else rule)


def _needs_api(event: Event) -> bool:
    return is_thin(event.document) and related_object(event) is not None


class Records:
    """Stripe's API as the fetch step and the drain ask it: a thin event's related object, and with FETCH every
    event by id; a backlog of them read in pages (a PagedFetcher)."""

    name = NAME

    def __init__(self, api: StripeAPI, every_event: bool) -> None:
        self.api, self.every_event = api, every_event
        self._events = EventById(api, parse)

    def names(self, event: Event) -> str | None:
        if not is_thin(event.document):
            return self._events.names(event) if self.every_event else None
        related = related_object(event)
        if related is None:  # a type that moves no money (meters, accounts)
            return None
        where = f" in {related.context}" if related.context else ""
        return f"{related.type} {related.id}{where} (thin event {event.id})"

    def get(self, event: Event) -> bytes | None:
        related = related_object(event) if is_thin(event.document) else None
        return self._events.get(event) if related is None else self.api.related(related)

    def read(self, event: Event, body: bytes) -> Event:
        related = related_object(event) if is_thin(event.document) else None
        return self._events.read(event, body) if related is None else \
            with_related(event, related_document(body, related))

    def pageable(self, event: Event) -> bool:
        return pages.wanted(event, self.every_event) is not None

    def listed(self, events: Sequence[Event]) -> dict[str, bytes]:
        return pages.read(self.api, events, self.every_event)


def _api(base: str, key: str, outbound: "Outbound", budget: "Budget | None", every_event: bool) -> Records:
    return Records(StripeAPI(key, base, budget=budget, outbound=outbound), every_event)


def _event_list(api_key: str, base: str, key_setting: str, account: str | None, budget: "Budget | None") -> EventList:
    return StripeEvents(api_key, base, key_setting, account, budget)


def _accounts(api_key: str, base: str, key_setting: str, budget: "Budget | None") -> list[str]:
    return StripeAccounts(api_key, base, key_setting, budget).ids()


def _money_records(api_key: str, base: str, key_setting: str, account: str | None, metadata_key: str,
                   budget: "Budget | None") -> MoneyRecords:
    from .audit import StripeBalance  # the audit's alone

    return StripeBalance(api_key, base, key_setting, account, metadata_key, budget)


_RULES = {name: _subscription_or(rule) if name in CHECKOUT_SESSION_EVENTS else rule for name, rule in RULES.items()}
_THIN_RULES = {name: (_subscription_or(rule) if name.removeprefix("v1.") in CHECKOUT_SESSION_EVENTS else rule)
               ._replace(compared_by=_compared_by) for name, rule in THIN_RULES.items()}
PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, sign, parse=parse,
                    rules=with_statuses({**_RULES, **_THIN_RULES}, REFUND_STATES), stored=_stored, api=_api,
                    api_base=API_BASE, needs_api=_needs_api,
                    event_list=_event_list, money_records=_money_records, accounts=_accounts, is_account=is_account,
                    account_prefix="acct_", account_words="acct_ then letters and digits",
                    events_key="a Stripe restricted key that may read Events",
                    money_key="a Stripe restricted key that may read Balance", payouts=True,
                    api_key_words="a key that may read Events", api_base_setting="STRIPE_API_BASE")
