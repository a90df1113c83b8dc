"""Razorpay: its signature scheme, its events' shape and money rules, and its API, the entity an event names.
An event's id is its unsigned header bound to the body's digest (docs/providers/razorpay.md)."""

from typing import TYPE_CHECKING, Any

from ...core.provider import Provider, envelope, recorded, with_statuses
from ...core.vocabulary import Event, Headers, Kind, Rule, load
from ..outbound import Outbound
from .api import API, API_BASE
from .rules import REFUND_LABELS, REFUND_STATES, RULES, is_entity, is_razorpay, parse, read_refund, with_entity
from .scheme import NAME, SCHEME, SIGNATURE_HEADER, sign, verify

if TYPE_CHECKING:
    from ..budget import Budget
    from .audit import RazorpaySettlements

__all__ = ["API", "API_BASE", "NAME", "PROVIDER", "RULES", "SCHEME", "is_razorpay", "parse", "sign", "verify",
           "with_entity"]


def _parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """Razorpay's own shape, or the common one when the body names its type."""
    return envelope(document, body, headers, source) if "type" in document else parse(document, body, headers, source)


def _stored(event_id: str, event_type: str, document: dict[str, Any], fetched: bool, body: bytes,
            source: str) -> Event | None:
    """A stored event whose kept bytes are the entity Razorpay's API returned, read in its delivered event."""
    if not (fetched and is_entity(document)):
        return None
    return recorded(event_id, event_type, with_entity(load(body), document), body, source)


def _api(base: str, key: str, outbound: Outbound, budget: "Budget | None", every_event: bool) -> API | None:
    return API(base, key, outbound, budget) if every_event else None


def _money_records(api_key: str, base: str, key_setting: str, account: str | None, metadata_key: str,
                   budget: "Budget | None") -> "RazorpaySettlements":
    from .audit import RazorpaySettlements
    return RazorpaySettlements(api_key, base, key_setting, budget)


PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, sign, parse=_parse,
                    rules=with_statuses({**RULES, **{refund: Rule(Kind.REFUND, read_refund, REFUND_LABELS)
                                                     for refund in ("refund.created", "refund.failed")}},
                                        REFUND_STATES),
                    owns=is_razorpay, stored=_stored, api=_api, api_base=API_BASE,
                    money_records=_money_records, money_key="a Razorpay API key, <key id>:<key secret>",
                    # HTTP Basic's: the key id (rzp_live_..., rzp_test_...), a colon, the key secret.
                    api_key_words="Razorpay's API key", api_key_written="<key id>:<key secret>",
                    api_key_pattern="[^:]+:.+")
