"""Razorpay's events: their own shape and id, what each moves, and the entity each one's money is read from."""

import hashlib
from collections.abc import Callable
from typing import Any

from ...core.vocabulary import (
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    Headers,
    InvalidEventError,
    Kind,
    Rule,
    State,
    an_object,
    lower,
    text,
    uuid_text,
)
from .scheme import EVENT_ID_HEADER

# A Razorpay event id ends in this many hex digits of its body's SHA-256: 128
# bits, so no one can make a body that takes the id of one they have not seen.
RAZORPAY_DIGEST_HEX = 32
# The longest x-razorpay-event-id whose event id (header, dot, digest) fits MAX_ID_CHARS.
MAX_RAZORPAY_HEADER_CHARS = MAX_ID_CHARS - 1 - RAZORPAY_DIGEST_HEX
PAYMENT_EVENTS = ("payment.captured", "order.paid")
REFUND_EVENTS = ("refund.processed",)
DISPUTE_LOST = "payment.dispute.lost"
DISPUTE_WON = "payment.dispute.won"


def is_razorpay(document: dict[str, Any]) -> bool:
    """Whether a body is in Razorpay's own shape (refund.created and refund.failed are Stripe's names too)."""
    return "type" not in document and isinstance(document.get("payload"), dict)


def parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """The event in Razorpay's own shape: type its `event`, data its `payload`, id the header and the digest."""
    event_type = text(document.get("event"), "'event'", MAX_TYPE_CHARS)
    payload = document.get("payload")
    if not isinstance(payload, dict):
        raise InvalidEventError("'payload' must be an object")
    header_id = text(headers.get(EVENT_ID_HEADER), f"the {EVENT_ID_HEADER} header", MAX_RAZORPAY_HEADER_CHARS)
    # The header is not signed: the body's digest binds the id to the signed bytes.
    event_id = f"{header_id}.{hashlib.sha256(body).hexdigest()[:RAZORPAY_DIGEST_HEX]}"
    return Event(event_id, event_type, payload, document, body, source)


def entity(event: Event, name: str) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return an_object(an_object(an_object(event.document.get("payload")).get(name)).get("entity"))


def _read_payment(event: Event) -> Fields:
    """payment.captured and order.paid: the same payment, credited once by its id."""
    payment = entity(event, "payment")
    user_id = uuid_text(an_object(payment.get("notes")).get("user_id"))  # notes is [] when empty
    return Fields(payment.get("id"), user_id, payment.get("amount"), lower(payment.get("currency")), None)


# A Razorpay Refund's status -> what it says of the refund (Razorpay's Refund entity).
REFUND_STATES = {"pending": State.APPLIED, "processed": State.APPLIED, "failed": State.REVERSED}


def read_refund(event: Event) -> Fields:
    """A Refund entity, in any event that carries it."""
    refund = entity(event, "refund")
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_id"), None, refund.get("amount"), lower(refund.get("currency")), None,
                  refund.get("id"), state)


# A Dispute's status (Razorpay's Disputes entity, in its order) -> what it says of the dispute: lost takes what Razorpay
# deducted, won gives it back; open, under_review and closed have no outcome, and move nothing.
DISPUTE_STATUSES = ("open", "under_review", "won", "lost", "closed")
DISPUTE_STATES = {"won": State.REVERSED, "lost": State.APPLIED}


def _read_dispute(said: State) -> Callable[[Event], Fields | str | None]:
    """A Dispute entity moves what Razorpay deducted from the merchant (amount_deducted), not what was disputed:
    lost takes it, won gives it back. Delivered, its state is the event's (said); fetched, its record's status now."""
    def read(event: Event) -> Fields | str | None:
        dispute = entity(event, "dispute")
        state = said
        if is_fetched(event.document):
            status = dispute.get("status")
            if not (isinstance(status, str) and status in DISPUTE_STATUSES):
                return (f"payload.dispute.entity.status must be one of {', '.join(DISPUTE_STATUSES)} (Razorpay's "
                        "record of the dispute)")
            if status not in DISPUTE_STATES:  # no outcome now: the outcome's own event moves the money
                return None
            state = DISPUTE_STATES[status]
        deducted = dispute.get("amount_deducted")
        # Nothing deducted (0, as for any dispute not lost): a win gives nothing back, and leaves a later loss, in
        # pre-arbitration, to take. 0 the int: not False, not 0.0.
        if state == State.REVERSED and type(deducted) is int and deducted == 0:
            return None
        return Fields(dispute.get("payment_id"), None, deducted, lower(dispute.get("currency")), None,
                      dispute.get("id"), state)
    return read


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("payload.refund.entity.payment_id", None, "payload.refund.entity.amount",
                       "payload.refund.entity.currency", None, "payload.refund.entity.id",
                       "payload.refund.entity.status")
_DISPUTE_LABELS = Fields("payload.dispute.entity.payment_id", None, "payload.dispute.entity.amount_deducted",
                         "payload.dispute.entity.currency", None, "payload.dispute.entity.id", None)
RULES = {
    **{paid: Rule(Kind.CREDIT, _read_payment, Fields(
        "payload.payment.entity.id", "payload.payment.entity.notes.user_id", "payload.payment.entity.amount",
        "payload.payment.entity.currency", None)) for paid in PAYMENT_EVENTS},
    **{refund: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund in REFUND_EVENTS},
    DISPUTE_LOST: Rule(Kind.DISPUTE, _read_dispute(State.APPLIED), _DISPUTE_LABELS),
    DISPUTE_WON: Rule(Kind.DISPUTE, _read_dispute(State.REVERSED), _DISPUTE_LABELS),
}


# Where with_entity marks a document fetched: a key of ours, in no body Razorpay sends.
_FETCHED = "_webhook_ledger_fetched"
# The entity each event's money is read from (payload.<entity>.entity): the one fetched. Razorpay's API has no
# event by id; its Fetch a Payment, Fetch Refund and Fetch a Dispute With ID return these (docs/providers/razorpay.md).
ENTITIES = {**{paid: "payment" for paid in PAYMENT_EVENTS},
            **{refund: "refund" for refund in ("refund.created", *REFUND_EVENTS, "refund.failed")},
            DISPUTE_LOST: "dispute", DISPUTE_WON: "dispute"}


def is_entity(document: dict[str, Any]) -> bool:
    """Whether a document is one of the entities ENTITIES names, as Razorpay's API returns it."""
    return document.get("entity") in ENTITIES.values() and isinstance(document.get("id"), str)


def with_entity(document: dict[str, Any], entity: dict[str, Any]) -> dict[str, Any]:
    """The delivered event's document with the entity Razorpay's API returned in its place, marked fetched: what the
    money is read from, on receipt and from the stored bytes alike."""
    return {**document, "payload": {**an_object(document.get("payload")), entity["entity"]: {"entity": entity}},
            _FETCHED: True}


def is_fetched(document: dict[str, Any]) -> bool:
    """Whether a document's entity is Razorpay's record now (with_entity), not the one delivered."""
    return document.get(_FETCHED) is True

