"""PayPal's events: their own shape, and what each moves (Payments v2's captures and refunds, Disputes v1)."""

import re
from typing import Any

from ...core.vocabulary import (
    CURRENCY,
    CURRENCY_EXPONENTS,
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    InvalidEventError,
    Kind,
    Rule,
    State,
    an_object,
    lower,
    minor_units,
    text,
    uuid_text,
)

CAPTURE_COMPLETED = "PAYMENT.CAPTURE.COMPLETED"
REFUND_EVENTS = ("PAYMENT.CAPTURE.REFUNDED", "PAYMENT.CAPTURE.REVERSED")
DISPUTE_RESOLVED = "CUSTOMER.DISPUTE.RESOLVED"  # CUSTOMER.DISPUTE.CREATED and .UPDATED move nothing


def parse(document: dict[str, Any], body: bytes, source: str) -> Event:
    """The event in PayPal's own shape: id its `id` (WH-...), type its `event_type`, data its `resource`."""
    event_id = text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = text(document.get("event_type"), "'event_type'", MAX_TYPE_CHARS)
    resource = document.get("resource")
    if not isinstance(resource, dict):
        raise InvalidEventError("'resource' must be an object")
    return Event(event_id, event_type, resource, document, body, source)


def _resource(event: Event) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return an_object(event.document.get("resource"))


def money_of(money: object, label: str) -> tuple[object, object, str | None]:
    """A Money object's amount in minor units and its currency (lower case), or why the amount is not exact (a 422).
    A value or currency that is no amount or code is left as sent, for app/intake/events.py to name."""
    value, code = an_object(money).get("value"), an_object(money).get("currency_code")
    units = minor_units(value, code)
    if units is None and isinstance(value, str) and isinstance(code, str) and CURRENCY.fullmatch(code.lower()):
        exponent = CURRENCY_EXPONENTS.get(code.upper(), 2)
        return value, code.lower(), (f"{label}.value must be a decimal amount of {code.upper()} exact in its minor "
                                     f"units ({exponent} decimals), got {value[:40]!r}")
    return (value if units is None else units), lower(code), None


def _read_capture(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.COMPLETED: the Capture, credited once by its id, to the user its custom_id names."""
    capture = _resource(event)
    amount, currency, problem = money_of(capture.get("amount"), "resource.amount")
    return problem or Fields(capture.get("id"), uuid_text(capture.get("custom_id")), amount, currency, None)


# A PayPal Refund's status -> what it says of the refund (Payments v2, the refund's `status`).
REFUND_STATES = {"PENDING": State.APPLIED, "COMPLETED": State.APPLIED, "FAILED": State.REVERSED,
                        "CANCELLED": State.REVERSED}
# A Refund's capture: its `up` link, https://api.paypal.com/v2/payments/captures/<capture id>.
_CAPTURE_LINK = re.compile(r"https://[^/]+/v2/payments/captures/([^/?#]+)")


def _read_refund(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.REFUNDED and .REVERSED: a Refund of a capture, keyed by its own id, its amount debited."""
    refund = _resource(event)
    amount, currency, problem = money_of(refund.get("amount"), "resource.amount")
    if problem:
        return problem
    links = refund.get("links")
    ups = [link.get("href") for link in links if isinstance(link, dict) and link.get("rel") == "up"] \
        if isinstance(links, list) else []
    capture = _CAPTURE_LINK.fullmatch(ups[0]) if len(ups) == 1 and isinstance(ups[0], str) else None
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(capture[1] if capture else None, None, amount, currency, None, refund.get("id"), state)


# A resolved Dispute's outcome -> what it does to the merchant's funds (Disputes v1, dispute_outcome.outcome_code):
# the buyer's win (the merchant accepting the claim among them) takes what the buyer was refunded; the seller's,
# the buyer's cancelling, a claim denied, or PayPal paying out itself, gives back what a loss took. NONE, no
# outcome, is refused: the ledger does not guess one.
DISPUTE_OUTCOMES = {"RESOLVED_BUYER_FAVOUR": State.APPLIED, "ACCEPTED": State.APPLIED,
                           "RESOLVED_SELLER_FAVOUR": State.REVERSED, "DENIED": State.REVERSED,
                           "CANCELED_BY_BUYER": State.REVERSED, "RESOLVED_WITH_PAYOUT": State.REVERSED}


def _read_dispute(event: Event) -> Fields | str:
    """CUSTOMER.DISPUTE.RESOLVED: the buyer's win takes what the buyer got back (dispute_outcome.amount_refunded, maybe
    part of dispute_amount) from its transaction's payment once; the seller's gives back what a loss took."""
    dispute = _resource(event)
    outcome = an_object(dispute.get("dispute_outcome"))
    code = outcome.get("outcome_code")
    state = DISPUTE_OUTCOMES.get(code) if isinstance(code, str) else None
    if state is None:
        return f"resource.dispute_outcome.outcome_code must be one of {', '.join(DISPUTE_OUTCOMES)}"
    transactions = dispute.get("disputed_transactions")
    if not isinstance(transactions, list) or len(transactions) != 1:
        return "resource.disputed_transactions must name exactly one transaction"
    if state == State.APPLIED and outcome.get("amount_refunded") is None:
        return ("resource.dispute_outcome.amount_refunded is missing: a dispute resolved for the buyer takes what "
                "the buyer was refunded, and PayPal's record does not say")
    amount, currency, problem = money_of(outcome.get("amount_refunded"), "resource.dispute_outcome.amount_refunded") \
        if state == State.APPLIED else money_of(dispute.get("dispute_amount"), "resource.dispute_amount")
    return problem or Fields(an_object(transactions[0]).get("seller_transaction_id"), None, amount, currency, None,
                             dispute.get("dispute_id"), state)


RULES = {
    CAPTURE_COMPLETED: Rule(Kind.CREDIT, _read_capture, Fields(
        "resource.id", "resource.custom_id", "resource.amount.value", "resource.amount.currency_code", None)),
    **{refund: Rule(Kind.REFUND, _read_refund, Fields(
        "resource.links[rel=up] (the capture's URL)", None, "resource.amount.value", "resource.amount.currency_code",
        None, "resource.id", "resource.status")) for refund in REFUND_EVENTS},
    DISPUTE_RESOLVED: Rule(Kind.DISPUTE, _read_dispute, Fields(
        "resource.disputed_transactions[0].seller_transaction_id", None,
        "resource.dispute_outcome.amount_refunded.value (the buyer's win) or resource.dispute_amount.value",
        "resource.dispute_outcome.amount_refunded.currency_code (the buyer's win) or "
        "resource.dispute_amount.currency_code", None, "resource.dispute_id", "resource.dispute_outcome")),
}
