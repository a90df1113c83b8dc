"""Stripe: its signature scheme, its events' money rules, and its API, an event by id
(docs/providers.md, "stripe")."""

import re
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote

from ..core.signing import Certificates, SignatureError, check_timestamp, hex_digest, mac, match, required
from ..core.vocabulary import Event, Fields, Kind, Metadata, Rule, State, an_object, is_cents, lower
from .outbound import Outbound, record

SCHEME = "stripe"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "Stripe"
# The header that tells its deliveries apart, named to a delivery sent to a source of another scheme.
SIGNATURE_HEADER = "Stripe-Signature"
PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
CHARGE_REFUNDED = "charge.refunded"
# Stripe's Refund object, in each event that carries it (docs/providers.md).
REFUND_EVENTS = ("refund.created", "refund.updated", "refund.failed", "charge.refund.updated")
DISPUTE_FUNDS_WITHDRAWN = "charge.dispute.funds_withdrawn"
DISPUTE_FUNDS_REINSTATED = "charge.dispute.funds_reinstated"
# The first Stripe API version whose charge.refunded no longer counts an
# authorisation released by a partial capture or a cancellation.
STRIPE_BASIL = "2025-03-31"


# -- the scheme ---------------------------------------------------------------------------------

def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    name = SIGNATURE_HEADER
    stamps, signatures = [], []
    for item in required(headers, name).split(","):
        key, equals, value = item.strip().partition("=")
        if not equals:
            raise SignatureError(f"malformed {name} header: expected comma-separated key=value pairs")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            signatures.append(hex_digest(value, name))
        # v0 (Stripe's test scheme) and keys added later are ignored, as Stripe's own verifier does.
    if len(stamps) != 1:
        raise SignatureError(f"malformed {name} header: expected exactly one t=<timestamp>")
    if not signatures:
        raise SignatureError(f"{name} header has no v1 signature")
    check_timestamp(stamps[0], name, tolerance, now)
    return match(secrets, [stamps[0].encode(), b".", body], signatures)


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """The header Stripe sends with body: one v1 per secret, as while a secret rolls."""
    t = str(timestamp)
    v1 = ",".join(f"v1={mac(s, t.encode(), b'.', body).hex()}" for s in secrets)
    return {SIGNATURE_HEADER: f"t={t},{v1}"}


# -- the rules ----------------------------------------------------------------------------------

def _read_payment_intent(event: Event) -> Fields:
    """Its user is named by its metadata (Checkout: payment_intent_data.metadata), else by its customer's link
    (Billing's invoice PaymentIntents carry no subscription metadata, but name the customer)."""
    intent = an_object(event.data.get("object"))
    metadata = Metadata(an_object(intent.get("metadata")))
    return Fields(intent.get("id"), metadata, intent.get("amount_received"), lower(intent.get("currency")),
                  _livemode(event), customer=intent.get("customer"))


def _read_charge_refunded(event: Event) -> Fields | str | None:
    """The Charge's total refunded, of what was captured.

    Before API version 2025-03-31.basil, a partial capture or a cancellation
    counts the authorisation it releases in amount_refunded (and sends
    charge.refunded); since, it does not. A charge never captured moved no
    money. A charge without amount_captured (older API versions) is read
    as captured whole unless `captured` is false.
    """
    charge = an_object(event.data.get("object"))
    total, amount, captured = charge.get("amount_refunded"), charge.get("amount"), charge.get("amount_captured")
    if captured is None and charge.get("captured") is False or captured == 0 and is_cents(captured, zero=True):
        return None
    if is_cents(total) and is_cents(amount) and is_cents(captured) and captured < amount:
        before_basil = _stripe_before(event.document.get("api_version"), STRIPE_BASIL)
        if before_basil is None:
            return "api_version must name a Stripe API version to read the refunds of a partially captured charge"
        if before_basil:
            total -= amount - captured
            if total <= 0:
                return None  # only the released authorisation
    return Fields(charge.get("payment_intent"), None, total, lower(charge.get("currency")), _livemode(event))


# A Refund's status -> what it says of the refund (Stripe's Refund object).
REFUND_STATES = {"pending": State.APPLIED, "requires_action": State.APPLIED, "succeeded": State.APPLIED,
                 "failed": State.REVERSED, "canceled": State.REVERSED}


def read_refund(event: Event) -> Fields | None:
    """A Refund object, in any event that carries it."""
    refund = an_object(event.data.get("object"))
    if refund.get("reason") == "expired_uncaptured_charge":
        return None  # Stripe's own, for an authorisation that expired uncaptured: no money moved
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_intent"), None, refund.get("amount"), lower(refund.get("currency")),
                  _livemode(event), refund.get("id"), state)


def _read_dispute(state: State) -> Callable[[Event], Fields]:
    def read(event: Event) -> Fields:
        dispute = an_object(event.data.get("object"))
        return Fields(dispute.get("payment_intent"), None, dispute.get("amount"), lower(dispute.get("currency")),
                      _livemode(event), dispute.get("id"), state)
    return read


def _livemode(event: Event) -> bool:
    return event.document.get("livemode") is True


def _stripe_before(api_version: object, version: str) -> bool | None:
    """Whether a Stripe API version ("2024-06-20", "2025-03-31.basil") is older than version; None if unreadable."""
    if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
        return None
    return api_version[:10] < version


_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(\.[a-z]+)?")


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("data.object.payment_intent", None, "data.object.amount", "data.object.currency",
                       "livemode", "data.object.id", "data.object.status")
RULES = {
    PAYMENT_INTENT_SUCCEEDED: Rule(Kind.CREDIT, _read_payment_intent, Fields(
        "data.object.id", "data.object.metadata", "data.object.amount_received", "data.object.currency",
        "livemode", customer="data.object.customer")),
    CHARGE_REFUNDED: Rule(Kind.REFUNDED_TOTAL, _read_charge_refunded, Fields(
        "data.object.payment_intent", None, "data.object.amount_refunded", "data.object.currency", "livemode")),
    **{refund_event: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund_event in REFUND_EVENTS},
    DISPUTE_FUNDS_WITHDRAWN: Rule(Kind.DISPUTE, _read_dispute(State.APPLIED), REFUND_LABELS._replace(state=None)),
    DISPUTE_FUNDS_REINSTATED: Rule(Kind.DISPUTE, _read_dispute(State.REVERSED), REFUND_LABELS._replace(state=None)),
}


# -- the API ------------------------------------------------------------------------------------

class API:
    """Stripe's API for one source: its base address and key (never in a repr, a log line or an answer)."""

    name = NAME

    def __init__(self, base: str, key: str, outbound: Outbound) -> None:
        self.base = base
        self._authorization = f"Bearer {key}"
        self.outbound = outbound

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event_id: str) -> bytes | None:
        """The event's bytes as Stripe's API returns them, or None when Stripe has no such event (404)."""
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            reply = self.outbound.request(SCHEME, "GET", f"{self.base}/v1/events/{quote(event_id, safe='')}",
                                          deadline, headers={"Authorization": self._authorization})
        return record(reply, NAME, "its event")
