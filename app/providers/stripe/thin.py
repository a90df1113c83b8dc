"""Stripe's thin events (object v2.core.event): no data until their related object is fetched, then read by the
snapshot rules of their twins (docs/providers/stripe.md, "Thin events")."""

import hashlib
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from ...core.errors import ProviderUnavailableError
from ...core.vocabulary import (
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Rule,
    State,
    an_object,
    is_cents,
    is_id,
    load,
    text,
)
from .accounts import CONTEXT, is_thin
from .rules import (
    CHARGE_REFUNDED,
    CHECKOUT_SESSION_EVENTS,
    PAYMENT_INTENT_SUCCEEDED,
    REFUND_EVENTS,
    REFUND_LABELS,
    RULES,
    SUBSCRIPTION_SESSION,
    in_account,
    read_charge_refunded,
    read_dispute,
    read_refund,
)

# The API version a thin event's related object is fetched in (Stripe-Version): the one the snapshot rules read.
THIN_FETCH_VERSION = "2025-03-31.basil"
# Where Stripe's API retrieves each object a thin event's money is read from, by related_object.type.
THIN_OBJECTS = {"payment_intent": "/v1/payment_intents/", "charge": "/v1/charges/", "refund": "/v1/refunds/",
                "dispute": "/v1/disputes/", "checkout.session": "/v1/checkout/sessions/"}


class Related(NamedTuple):
    """The object a thin event's money is read from: its type (a THIN_OBJECTS key), id and account context."""

    type: str
    id: str
    context: str | None


def parse_thin(document: dict[str, Any], body: bytes, source: str) -> Event:
    """A thin event (object v2.core.event): no data until its related object is fetched (with_related)."""
    event_id = text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    context = document.get("context")
    if context is not None and not (isinstance(context, str) and CONTEXT.fullmatch(context)):
        raise InvalidEventError("'context' must be an account context (acct_..., or acct_.../acct_...)")
    if event_type in THIN_RULES:
        related = an_object(document.get("related_object"))
        if related.get("type") != THIN_RELATED[event_type]:
            raise InvalidEventError(f"'related_object.type' must be {THIN_RELATED[event_type]!r} in {event_type}")
        if not is_id(related.get("id")):
            raise InvalidEventError(f"'related_object.id' must be an id of 1 to {MAX_ID_CHARS} characters")
    return Event(event_id, event_type, {}, document, body, source)


def related_object(event: Event) -> Related | None:
    """What a thin event parse_thin returned moves money by; None for a type that moves none (meters, accounts)."""
    if event.type not in THIN_RULES:
        return None
    related = event.document["related_object"]
    return Related(related["type"], related["id"], event.document.get("context"))


def with_related(event: Event, obj: dict[str, Any]) -> Event:
    """The thin event with its related object's current state as data.object, as the snapshot rules read it."""
    document = {**event.document, "api_version": THIN_FETCH_VERSION}
    return Event(event.id, event.type, {"object": obj}, document, event.body, event.source)


def thin_sha256(event: Event) -> bytes:
    """What a thin event's copies compare by: its type and the object it names, in its account."""
    related = an_object(event.document.get("related_object"))
    names = ["thin", event.type, related.get("type"), related.get("id"), event.document.get("context")]
    return hashlib.sha256(json.dumps(names, separators=(",", ":")).encode()).digest()


def _read_thin_charge(event: Event) -> Fields | str | None:
    """The Charge's current total refunded; none left (its refunds failed since) moves nothing: their events say so."""
    if an_object(event.data.get("object")).get("amount_refunded") == 0:
        return None
    return read_charge_refunded(event)


def _read_thin_dispute(floor: State | None) -> Callable[[Event], Fields | None]:
    """A Dispute's current state: its balance transactions show the funds withdrawn (negative) and reinstated
    (positive); floor is what the event's type itself says happened (funds_withdrawn, funds_reinstated)."""
    def read(event: Event) -> Fields | None:
        dispute = an_object(event.data.get("object"))
        moved = dispute.get("balance_transactions")
        amounts = [an_object(t).get("amount") for t in moved] if isinstance(moved, list) else []
        reinstated = floor == State.REVERSED or any(is_cents(a) for a in amounts)
        withdrawn = floor == State.APPLIED or any(isinstance(a, int) and a < 0 for a in amounts)
        if not (reinstated or withdrawn):
            return None  # no funds moved yet (an inquiry, a prevented dispute)
        return read_dispute(State.REVERSED if reinstated else State.APPLIED)(event)
    return read


def _thin_labels(labels: Fields) -> Fields:
    return Fields(*(label.replace("data.object.", "related_object.") if isinstance(label, str) else label
                    for label in labels))


# Each thin type that moves money (its snapshot twin's name with "v1."): the related object's type, and the rule
# that reads the object's current state. A thin dispute type takes whichever step the dispute has reached.
_THIN = {
    "v1." + PAYMENT_INTENT_SUCCEEDED: ("payment_intent", RULES[PAYMENT_INTENT_SUCCEEDED]),
    "v1." + CHARGE_REFUNDED: ("charge", RULES[CHARGE_REFUNDED]._replace(read=in_account(_read_thin_charge))),
    **{"v1." + refund_event: ("refund", Rule(Kind.REFUND, read_refund, REFUND_LABELS))
       for refund_event in REFUND_EVENTS},
    **{"v1.charge.dispute." + name: ("dispute", Rule(Kind.DISPUTE, in_account(_read_thin_dispute(floor)),
                                                     REFUND_LABELS._replace(state=None)))
       for name, floor in (("created", None), ("updated", None), ("closed", None),
                           ("funds_withdrawn", State.APPLIED), ("funds_reinstated", State.REVERSED))},
    # A Session, fetched, is read as its snapshot is: a paid payment Session credits its PaymentIntent, the key its
    # v1.payment_intent.succeeded credits too (a subscription Session links: subscription_session_rule).
    **{"v1." + session_event: ("checkout.session", RULES[session_event]) for session_event in CHECKOUT_SESSION_EVENTS},
}
THIN_RELATED = {thin_type: related for thin_type, (related, _) in _THIN.items()}
THIN_RULES = {thin_type: rule._replace(labels=_thin_labels(rule.labels)) for thin_type, (_, rule) in _THIN.items()}
THIN_SUBSCRIPTION_SESSION = SUBSCRIPTION_SESSION._replace(labels=_thin_labels(SUBSCRIPTION_SESSION.labels))


def is_subscription_session(event: Event) -> bool:
    """A subscription Session's event, snapshot or thin (its Session fetched: a thin one's data is empty before)."""
    return event.type.removeprefix("v1.") in CHECKOUT_SESSION_EVENTS \
        and an_object(event.data.get("object")).get("mode") == "subscription"


def subscription_session_rule(event: Event) -> Rule:
    """SUBSCRIPTION_SESSION, with a thin event's labels (related_object.*) for a thin one."""
    return THIN_SUBSCRIPTION_SESSION if is_thin(event.document) else SUBSCRIPTION_SESSION


def related_document(body: bytes, related: Related) -> dict[str, Any]:
    """The object Stripe's API answered for related, or ProviderUnavailableError when it is not that object."""
    try:
        document = load(body)
    except InvalidJSONError as exc:
        raise ProviderUnavailableError(f"Stripe's API answered with a {related.type} that does not parse: {exc}") \
            from None
    if (document.get("object"), document.get("id")) != (related.type, related.id):
        raise ProviderUnavailableError(f"Stripe's API answered with another object than {related.type} {related.id}")
    return document
