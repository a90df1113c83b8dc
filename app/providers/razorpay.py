"""Razorpay: its signature scheme, its events' shape and money rules.
An event's id is its unsigned header bound to the body's digest (docs/providers.md, "razorpay")."""

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.signing import Certificates, hex_digest, mac, match, required
from ..core.vocabulary import (
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

SCHEME = "razorpay"
SIGNATURE_HEADER = "X-Razorpay-Signature"
EVENT_ID_HEADER = "x-razorpay-event-id"
# A Razorpay event id ends in this many hex digits of its body's SHA-256: 128
# bits, so no one can make a body that takes the id of one they have not seen.
RAZORPAY_DIGEST_HEX = 32
# The longest x-razorpay-event-id whose event id (header, dot, digest) fits MAX_ID_CHARS.
MAX_RAZORPAY_HEADER_CHARS = MAX_ID_CHARS - 1 - RAZORPAY_DIGEST_HEX
PAYMENT_EVENTS = ("payment.captured", "order.paid")
REFUND_EVENTS = ("refund.processed",)
DISPUTE_LOST = "payment.dispute.lost"
DISPUTE_WON = "payment.dispute.won"


# -- the scheme ---------------------------------------------------------------------------------

def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    return match(secrets, [body], [hex_digest(required(headers, SIGNATURE_HEADER).strip(), SIGNATURE_HEADER)])


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """What Razorpay sends with body: its signature, and the event id beside it, unsigned (msg_id, when given)."""
    return {SIGNATURE_HEADER: mac(secrets[0], body).hex(), **({EVENT_ID_HEADER: msg_id} if msg_id else {})}


# -- the shape ----------------------------------------------------------------------------------

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


# -- the rules ----------------------------------------------------------------------------------

def _entity(event: Event, name: str) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return an_object(an_object(an_object(event.document.get("payload")).get(name)).get("entity"))


def _read_payment(event: Event) -> Fields:
    """payment.captured and order.paid: the same payment, credited once by its id."""
    payment = _entity(event, "payment")
    user_id = uuid_text(an_object(payment.get("notes")).get("user_id"))  # notes is [] when empty
    return Fields(payment.get("id"), user_id, payment.get("amount"), lower(payment.get("currency")), None)


# A Razorpay Refund's status -> what it says of the refund (Razorpay's Refund entity).
REFUND_STATES = {"pending": State.APPLIED, "processed": State.APPLIED, "failed": State.REVERSED}


def read_refund(event: Event) -> Fields:
    """A Refund entity, in any event that carries it."""
    refund = _entity(event, "refund")
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_id"), None, refund.get("amount"), lower(refund.get("currency")), None,
                  refund.get("id"), state)


def _read_dispute(state: State) -> Callable[[Event], Fields]:
    """Razorpay deducts a dispute's amount when it is lost (amount_deducted), and gives nothing back before."""
    def read(event: Event) -> Fields:
        dispute = _entity(event, "dispute")
        return Fields(dispute.get("payment_id"), None, dispute.get("amount"), lower(dispute.get("currency")), None,
                      dispute.get("id"), state)
    return read


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("payload.refund.entity.payment_id", None, "payload.refund.entity.amount",
                       "payload.refund.entity.currency", None, "payload.refund.entity.id",
                       "payload.refund.entity.status")
_DISPUTE_LABELS = Fields("payload.dispute.entity.payment_id", None, "payload.dispute.entity.amount",
                         "payload.dispute.entity.currency", None, "payload.dispute.entity.id", None)
RULES = {
    **{paid: Rule(Kind.CREDIT, _read_payment, Fields(
        "payload.payment.entity.id", "payload.payment.entity.notes.user_id", "payload.payment.entity.amount",
        "payload.payment.entity.currency", None)) for paid in PAYMENT_EVENTS},
    **{refund: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund in REFUND_EVENTS},
    DISPUTE_LOST: Rule(Kind.DISPUTE, _read_dispute(State.APPLIED), _DISPUTE_LABELS),
    DISPUTE_WON: Rule(Kind.DISPUTE, _read_dispute(State.REVERSED), _DISPUTE_LABELS),
}
