"""What the rule tables compare: an Effect's fields as a dict, and the effects expected, written as a table's
rows (a credit, a running total, a refund, a dispute, nothing, a refusal)."""

import dataclasses

from app.intake.events import Kind

# Left out of a comparison: the hash is compared by the tests of what two deliveries share, and users is the
# per-source setting a Stripe credit was read under (tests/providers/stripe/test_rules.py).
_NOT_COMPARED = ("sha256", "users")


def seen(effect):
    """effect's fields, the None ones left out: a row names every field it expects, and any other fails it."""
    values = {field.name: getattr(effect, field.name) for field in dataclasses.fields(effect)}
    return {name: value for name, value in values.items() if value is not None and name not in _NOT_COMPARED}


def _row(**fields):
    return {name: value for name, value in fields.items() if value is not None}


def credit(payment_id, user, cents, currency, customer=None):
    """A payment credited to user, once; with user None, apply_event decides by the customer's link or NO_USER."""
    return _row(kind=Kind.CREDIT, payment_id=payment_id, user_id=user, amount_cents=cents, currency=currency,
                customer_id=customer)


def link(customer, user):
    """A customer linked to user (a subscription's Checkout Session), no money: apply_event links it unless it is."""
    return _row(kind=Kind.LINK, customer_id=customer, user_id=user)


def running_total(payment_id, cents, currency):
    """A payment's total refunded so far (charge.refunded, payment.refunded): the highest one counts."""
    return _row(kind=Kind.REFUNDED_TOTAL, payment_id=payment_id, amount_cents=cents, currency=currency)


def refund(payment_id, refund_id, cents, currency, state):
    """A refund object of the payment, in the state its status says."""
    return _row(kind=Kind.REFUND, payment_id=payment_id, movement_id=refund_id, amount_cents=cents,
                currency=currency, state=state)


def dispute(payment_id, dispute_id, cents, currency, state):
    """A dispute of the payment: its funds withdrawn (applied) or reinstated (reversed)."""
    return _row(kind=Kind.DISPUTE, payment_id=payment_id, movement_id=dispute_id, amount_cents=cents,
                currency=currency, state=state)


# A type, or an event, that moves no money: stored and acknowledged, nothing applied.
NOTHING = {}


def refused(problem):
    """An effect that cannot apply whatever the settings: 422, its problem the message."""
    return {"problem": problem}


def refused_by(setting, problem, applies):
    """The effect that applies, refused by a setting: 422 until the setting allows it."""
    return {**applies, "setting": setting, "problem": problem}
