"""Stripe's snapshot events' money rules, each keyed in a Connect event's account, Checkout's among them
(docs/providers/stripe.md, "Connect", "Checkout")."""

import re
from collections.abc import Callable

from ...core.vocabulary import MAX_ID_CHARS, Event, Fields, Kind, Metadata, Rule, State, an_object, is_cents, lower
from .accounts import account_of, is_account

PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
CHARGE_REFUNDED = "charge.refunded"
# Stripe's Refund object, in each event that carries it (docs/providers/stripe.md).
REFUND_EVENTS = ("refund.created", "refund.updated", "refund.failed", "charge.refund.updated")
DISPUTE_FUNDS_WITHDRAWN = "charge.dispute.funds_withdrawn"
DISPUTE_FUNDS_REINSTATED = "charge.dispute.funds_reinstated"
# Checkout Sessions whose payment_status may say paid (docs/providers/stripe.md, "Checkout").
CHECKOUT_SESSION_EVENTS = ("checkout.session.completed", "checkout.session.async_payment_succeeded")
# The first Stripe API version whose charge.refunded no longer counts an
# authorisation released by a partial capture or a cancellation.
STRIPE_BASIL = "2025-03-31"


# -- Connect: a connected account's keys ---------------------------------------------------------

def in_account(read: Callable[[Event], Fields | str | None]) -> Callable[[Event], Fields | str | None]:
    """read, with the keys it reads in the event's connected account: acct_X/pi_Y, acct_X/re_Y, acct_X/du_Y and
    the customer acct_X/cus_Y (a connected account's objects are its own); a platform event's keys as they are."""
    def scoped(event: Event) -> Fields | str | None:
        fields = read(event)
        account = account_of(event)
        if account is None or not isinstance(fields, Fields):
            return fields
        if not is_account(account):  # a relayed event's, unchecked by the stripe scheme's parse
            return "account must be a connected account's id (acct_ and letters or digits)"
        ids = (fields.payment_id, fields.movement_id, fields.customer)
        longer = [key for key in ids if isinstance(key, str) and len(key) > MAX_ID_CHARS]
        if longer:
            return f"the id {longer[0]!r} in account {account} is over {MAX_ID_CHARS} characters"
        keys = [f"{account}/{key}" if isinstance(key, str) and key else key for key in ids]  # MAX_KEY_CHARS at most
        return fields._replace(payment_id=keys[0], movement_id=keys[1], customer=keys[2], account=account)
    return scoped


# -- the rules ----------------------------------------------------------------------------------

def _read_payment_intent(event: Event) -> Fields:
    """Its user is named by its metadata (Checkout: payment_intent_data.metadata), else by its customer's link
    (Billing's invoice PaymentIntents carry no subscription metadata, but name the customer)."""
    intent = an_object(event.data.get("object"))
    metadata = Metadata(an_object(intent.get("metadata")))
    return Fields(intent.get("id"), metadata, intent.get("amount_received"), lower(intent.get("currency")),
                  _livemode(event), customer=intent.get("customer"))


def read_charge_refunded(event: Event) -> Fields | str | None:
    """The Charge's total refunded, of what was captured: before API version 2025-03-31.basil a partial capture or a
    cancellation counts the authorisation it releases in amount_refunded (and sends charge.refunded), since not."""
    # A charge never captured moved no money; one without amount_captured (older API versions) is read as captured
    # whole unless `captured` is false.
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


def _read_refund(event: Event) -> Fields | None:
    """A Refund object, in any event that carries it."""
    refund = an_object(event.data.get("object"))
    if refund.get("reason") == "expired_uncaptured_charge":
        return None  # Stripe's own, for an authorisation that expired uncaptured: no money moved
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_intent"), None, refund.get("amount"), lower(refund.get("currency")),
                  _livemode(event), refund.get("id"), state)


read_refund = in_account(_read_refund)  # app/intake/events.py's refund.created and refund.failed read it too


def read_dispute(state: State) -> Callable[[Event], Fields]:
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


# -- Checkout ---------------------------------------------------------------------------------

class SessionMetadata(Metadata):
    """A Checkout Session's metadata and client_reference_id, both hashed: the user is the metadata's value of the
    source's key, else the client_reference_id."""

    def __init__(self, metadata: dict[str, object], client_reference_id: object) -> None:
        super().__init__(metadata=metadata, client_reference_id=client_reference_id)

    def get(self, key: str, default: object = None) -> object:
        value = an_object(self["metadata"]).get(key)
        return self["client_reference_id"] if value is None else value

    def label(self, key: str) -> str:
        """Where get(key) read the user from, for a 422's message."""
        return "data.object.client_reference_id" if an_object(self["metadata"]).get(key) is None \
            else f"data.object.metadata.{key}"


def _read_checkout_session(event: Event) -> Fields | None:
    """A paid Session in payment mode credits its PaymentIntent (the key payment_intent.succeeded credits too)
    with its amount_total; unpaid (a delayed payment method), no_payment_required and setup Sessions move nothing,
    and subscription Sessions are SUBSCRIPTION_SESSION's (a subscription's money is its invoices' PaymentIntents)."""
    session = an_object(event.data.get("object"))
    if session.get("mode") != "payment" or session.get("payment_status") != "paid":
        return None
    metadata = SessionMetadata(an_object(session.get("metadata")), session.get("client_reference_id"))
    return Fields(session.get("payment_intent"), metadata, session.get("amount_total"), lower(session.get("currency")),
                  _livemode(event), customer=session.get("customer"))


# A subscription Session's payment_status that says its subscription started: paid, or nothing to pay (a trial, a
# 100% discount). unpaid (a delayed payment method) waits for async_payment_succeeded.
SUBSCRIPTION_STARTED = ("paid", "no_payment_required")


def _read_subscription_session(event: Event) -> Fields | None:
    """A completed subscription Session links its customer to its user (the metadata's key, else the
    client_reference_id, as a payment Session's credit): no money, and nothing when it names no customer."""
    session = an_object(event.data.get("object"))
    if session.get("status") != "complete" or session.get("payment_status") not in SUBSCRIPTION_STARTED \
            or session.get("customer") is None:
        return None
    metadata = SessionMetadata(an_object(session.get("metadata")), session.get("client_reference_id"))
    return Fields(None, metadata, None, None, _livemode(event), customer=session.get("customer"))


CHECKOUT_SESSION_LABELS = Fields("data.object.payment_intent", "data.object.metadata or client_reference_id",
                                 "data.object.amount_total", "data.object.currency", "livemode",
                                 customer="data.object.customer")
# The rule of a subscription Session (each Checkout rule refines to it by the Session's mode: _subscription_or).
SUBSCRIPTION_SESSION = Rule(Kind.LINK, in_account(_read_subscription_session),
                            CHECKOUT_SESSION_LABELS._replace(payment_id=None, amount=None, currency=None))


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("data.object.payment_intent", None, "data.object.amount", "data.object.currency",
                       "livemode", "data.object.id", "data.object.status")
RULES = {
    PAYMENT_INTENT_SUCCEEDED: Rule(Kind.CREDIT, in_account(_read_payment_intent), Fields(
        "data.object.id", "data.object.metadata", "data.object.amount_received", "data.object.currency",
        "livemode", customer="data.object.customer")),
    CHARGE_REFUNDED: Rule(Kind.REFUNDED_TOTAL, in_account(read_charge_refunded), Fields(
        "data.object.payment_intent", None, "data.object.amount_refunded", "data.object.currency", "livemode")),
    **{refund_event: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund_event in REFUND_EVENTS},
    DISPUTE_FUNDS_WITHDRAWN: Rule(Kind.DISPUTE, in_account(read_dispute(State.APPLIED)),
                                  REFUND_LABELS._replace(state=None)),
    DISPUTE_FUNDS_REINSTATED: Rule(Kind.DISPUTE, in_account(read_dispute(State.REVERSED)),
                                   REFUND_LABELS._replace(state=None)),
    **{session_event: Rule(Kind.CREDIT, in_account(_read_checkout_session), CHECKOUT_SESSION_LABELS)
       for session_event in CHECKOUT_SESSION_EVENTS},
}
