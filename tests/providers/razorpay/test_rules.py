"""The shape and rules of app/providers/razorpay/: the event id Razorpay's envelope gets, and each Razorpay event
type the rule table knows, an event as Razorpay sends it (tests/providers/razorpay/events.py), and the effect
docs/providers/razorpay.md's table says it has. Razorpay's scheme is tests/intake/test_signature.py's, and its
library's in tests/providers/razorpay/test_delivery.py."""

import hashlib
import json

import pytest

from app.intake.events import Event, InvalidEventError, Policy, State, effect_of, parse
from app.providers import razorpay
from tests.helpers import ALICE
from tests.providers.effects import NOTHING, credit, refused, refused_by, seen
from tests.providers.effects import dispute as disputed
from tests.providers.effects import refund as refunded
from tests.providers.razorpay.events import dispute_event, order_paid, payment_captured, refund_event

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

INR = Policy("inr")  # Razorpay's amounts are in the currency's subunits: paise
APPLIED, REVERSED = State.APPLIED, State.REVERSED
HEADER = "HQ9tqtn9mNxM5C"  # an x-razorpay-event-id, as Razorpay's own


def encode(document):
    return json.dumps(document).encode()


def effect(document, policy=INR):
    return effect_of(parse(encode(document), "razorpay", {"x-razorpay-event-id": HEADER}), policy)


def entity(document, name, **fields):
    """document with payload.<name>.entity's fields changed."""
    document["payload"][name]["entity"].update(fields)
    return document


# -- the event id: the unsigned header, bound to the signed body --------------------------------------------------

def test_the_event_id_is_the_header_a_dot_and_32_hex_digits_of_the_bodys_sha256():
    body = encode(payment_captured("pay_1"))
    event = parse(body, "razorpay", {"x-razorpay-event-id": HEADER})
    assert event.id == f"{HEADER}.{hashlib.sha256(body).hexdigest()[:32]}"
    assert (event.type, event.data) == ("payment.captured", json.loads(body)["payload"])


def test_one_header_with_another_body_is_another_event_and_so_is_one_body_under_another_header():
    body, other = encode(payment_captured("pay_1")), encode(payment_captured("pay_2"))
    ids = {parse(b, "razorpay", {"x-razorpay-event-id": h}).id for b in (body, other) for h in (HEADER, "HQ9other")}
    assert len(ids) == 4


def test_the_longest_header_makes_an_id_of_255_characters():
    event = parse(encode(payment_captured("pay_1")), "razorpay", {"x-razorpay-event-id": "h" * 222})
    assert len(event.id) == 255


@pytest.mark.parametrize("document, headers, message", [
    pytest.param(payment_captured("pay_1"), {}, "the x-razorpay-event-id header is missing", id="no-header"),
    pytest.param(payment_captured("pay_1"), {"x-razorpay-event-id": "h" * 223},
                 "the x-razorpay-event-id header must be 1 to 222 characters", id="a-header-of-223"),
    pytest.param({**payment_captured("pay_1"), "event": None}, {"x-razorpay-event-id": HEADER}, "'event' is missing",
                 id="no-event"),
    pytest.param({**payment_captured("pay_1"), "payload": []}, {"x-razorpay-event-id": HEADER},
                 "'payload' must be an object", id="a-payload-not-an-object"),
])
def test_an_envelope_without_its_event_payload_or_header_is_refused(document, headers, message):
    with pytest.raises(InvalidEventError) as refusal:
        parse(encode(document), "razorpay", headers)
    assert str(refusal.value) == message


# -- what each type moves ---------------------------------------------------------------------------------------

MOVES = [
    # payment.captured and order.paid carry one payment: credited once, by its id.
    pytest.param(payment_captured("pay_1", paise=50000), credit("pay_1", ALICE, 50000, "inr"), id="payment.captured"),
    pytest.param(order_paid("pay_1", paise=50000), credit("pay_1", ALICE, 50000, "inr"), id="order.paid"),
    pytest.param(payment_captured("pay_1", user=str(ALICE).upper()), credit("pay_1", ALICE, 50000, "inr"),
                 id="payment.captured-a-uuid-in-capitals"),
    # A Refund entity: the state its status says (pending and processed count it; failed gives it back).
    pytest.param(refund_event("refund.created", "rfnd_1", "pay_1", 4000, "pending"),
                 refunded("pay_1", "rfnd_1", 4000, "inr", APPLIED), id="refund.created-pending"),
    pytest.param(refund_event("refund.processed", "rfnd_1", "pay_1", 4000, "processed"),
                 refunded("pay_1", "rfnd_1", 4000, "inr", APPLIED), id="refund.processed"),
    pytest.param(refund_event("refund.failed", "rfnd_1", "pay_1", 4000, "failed"),
                 refunded("pay_1", "rfnd_1", 4000, "inr", REVERSED), id="refund.failed"),
    # A refund is in its payment's currency (apply_event checks): no setting refuses it.
    pytest.param(entity(refund_event("refund.processed", "rfnd_1", "pay_1", 4000, "processed"), "refund",
                        currency="USD"), refunded("pay_1", "rfnd_1", 4000, "usd", APPLIED),
                 id="refund.processed-another-currency"),
    # A lost dispute takes what Razorpay deducted from the merchant (amount_deducted), not what was disputed
    # (amount); a won one gives back what it deducted, and nothing when it deducted nothing (0, as for any
    # dispute not lost).
    pytest.param(dispute_event("payment.dispute.lost", "disp_1", "pay_1", 4000, "lost", deducted=4000),
                 disputed("pay_1", "disp_1", 4000, "inr", APPLIED), id="payment.dispute.lost"),
    pytest.param(dispute_event("payment.dispute.lost", "disp_1", "pay_1", 4000, "lost", deducted=2500),
                 disputed("pay_1", "disp_1", 2500, "inr", APPLIED), id="payment.dispute.lost-deducting-part"),
    pytest.param(dispute_event("payment.dispute.won", "disp_1", "pay_1", 4000, "won", deducted=2500),
                 disputed("pay_1", "disp_1", 2500, "inr", REVERSED), id="payment.dispute.won-giving-back"),
    pytest.param(dispute_event("payment.dispute.won", "disp_1", "pay_1", 4000, "won"), NOTHING,
                 id="payment.dispute.won-nothing-deducted"),
    # No funds move in a dispute's other states, also when Razorpay deducted the amount at onset: the ledger
    # follows the outcome.
    *(pytest.param(dispute_event(f"payment.dispute.{status}", "disp_1", "pay_1", 4000, status, deducted=deducted),
                   NOTHING, id=f"payment.dispute.{status}-deducted-{deducted}")
      for status in ("created", "under_review", "action_required", "closed") for deducted in (0, 4000)),
    # Types no rule knows.
    *(pytest.param(payment_captured("pay_1", status=status) | {"event": event_type}, NOTHING, id=event_type)
      for event_type, status in [("payment.authorized", "authorized"), ("payment.failed", "failed")]),
    pytest.param(refund_event("refund.speed_changed", "rfnd_1", "pay_1", 4000, "pending"), NOTHING,
                 id="refund.speed_changed"),
]


@pytest.mark.parametrize("document, expected", MOVES)
def test_each_razorpay_type_moves_what_the_table_says(document, expected):
    assert seen(effect(document)) == expected


def test_every_type_the_rule_table_knows_has_a_row_above():
    assert {*razorpay.RULES, "refund.created", "refund.failed"} <= {param.values[0]["event"] for param in MOVES}


def test_razorpay_has_no_test_mode_that_a_setting_refuses():
    """Test and live keys differ; the body says neither (docs/providers/razorpay.md)."""
    assert seen(effect(payment_captured("pay_1"), Policy("inr", accept_test_events=False))) == credit(
        "pay_1", ALICE, 50000, "inr")


def test_a_payment_in_a_currency_not_the_ledgers_is_refused_by_the_setting():
    assert seen(effect(payment_captured("pay_1"), Policy("usd"))) == refused_by(
        "LEDGER_CURRENCY", "payload.payment.entity.currency must be the ledger's currency, 'usd'",
        credit("pay_1", ALICE, 50000, "inr"))


# -- what a rule refuses whatever the settings ----------------------------------------------------------------

NO_USER = ("payload.payment.entity.notes.user_id must be a user's UUID or the application's key of one (1 to 255 "
           "characters)")


@pytest.mark.parametrize("document, problem", [
    # Razorpay sends notes as [] when it is empty.
    pytest.param(payment_captured("pay_1", notes=[]), NO_USER, id="payment-notes-empty"),
    pytest.param(entity(order_paid("pay_1"), "payment", notes=[]), NO_USER, id="order-paid-notes-empty"),
    pytest.param(payment_captured("pay_1", notes={"customer": "Gaurav"}), NO_USER, id="payment-notes-without-user"),
    pytest.param(payment_captured("pay_1", notes={"user_id": ""}), NO_USER, id="payment-notes-user-empty"),
    pytest.param(payment_captured("pay_1", paise=0), "payload.payment.entity.amount must be a positive integer",
                 id="payment-of-nothing"),
    pytest.param(entity(payment_captured("pay_1"), "payment", amount="500.00"),
                 "payload.payment.entity.amount must be a positive integer", id="payment-amount-a-decimal-string"),
    pytest.param(entity(payment_captured("pay_1"), "payment", currency=None),
                 "payload.payment.entity.currency must be a currency's three-letter code", id="payment-currency-null"),
    pytest.param(entity(payment_captured("pay_1"), "payment", id=None),
                 "payload.payment.entity.id must be a payment id of 1 to 255 characters", id="payment-id-null"),
    pytest.param(entity(refund_event("refund.processed", "rfnd_1", "pay_1", 4000, "processed"), "refund",
                        payment_id=None),
                 "payload.refund.entity.payment_id must be a payment id of 1 to 255 characters",
                 id="refund-no-payment"),
    pytest.param(refund_event("refund.processed", None, "pay_1", 4000, "processed"),
                 "payload.refund.entity.id must be an id of 1 to 255 characters", id="refund-no-id"),
    pytest.param(dispute_event("payment.dispute.lost", None, "pay_1", 4000, "lost"),
                 "payload.dispute.entity.id must be an id of 1 to 255 characters", id="dispute-no-id"),
    pytest.param(dispute_event("payment.dispute.lost", "disp_1", None, 4000, "lost"),
                 "payload.dispute.entity.payment_id must be a payment id of 1 to 255 characters",
                 id="dispute-no-payment"),
    # A lost dispute must say what Razorpay deducted.
    *(pytest.param(entity(dispute_event("payment.dispute.lost", "disp_1", "pay_1", 4000, "lost"), "dispute",
                          amount_deducted=deducted),
                   "payload.dispute.entity.amount_deducted must be a positive integer", id=f"lost-deducted-{name}")
      for name, deducted in [("nothing", 0), ("null", None), ("a-string", "4000"), ("negative", -4000)]),
    pytest.param(entity(dispute_event("payment.dispute.won", "disp_1", "pay_1", 4000, "won"), "dispute",
                        amount_deducted=None),
                 "payload.dispute.entity.amount_deducted must be a positive integer", id="won-deducted-null"),
])
def test_an_event_its_shape_refuses_names_the_field(document, problem):
    assert seen(effect(document)) == refused(problem)


# Razorpay's Refund statuses: pending, processed, failed (https://razorpay.com/docs/api/refunds/entity).
def test_a_refund_status_razorpay_does_not_send_is_refused_naming_razorpays_statuses():
    problem = seen(effect(refund_event("refund.processed", "rfnd_1", "pay_1", 4000, "reversed")))["problem"]
    label, _, statuses = problem.partition(" must be one of ")
    assert (label, set(statuses.split(", "))) == ("payload.refund.entity.status", {"pending", "processed", "failed"})


# -- fetched: a dispute's state is its record's status now ----------------------------------------------------------

def fetched(document, record):
    """The effect of document's event read with record, Razorpay's dispute now, in place of the delivered one (as
    razorpay.API.read and a stored event's fetched bytes put it: razorpay.with_entity)."""
    event = parse(encode(document), "razorpay", {"x-razorpay-event-id": HEADER})
    read = razorpay.with_entity(event.document, record)
    return effect_of(Event(event.id, event.type, read["payload"], read, event.body, event.source), INR)


def record(status, deducted=None):
    """Razorpay's dispute disp_1 of 40 rupees, as its API returns it now."""
    return dispute_event("payment.dispute.created", "disp_1", "pay_1", 4000, status, deducted)["payload"]["dispute"][
        "entity"]


@pytest.mark.parametrize("event_type", ["payment.dispute.lost", "payment.dispute.won"])
@pytest.mark.parametrize("now, expected", [
    # Lost (in pre-arbitration, say, after a win): a late won takes what the loss deducted, as the lost does.
    pytest.param(record("lost", 2500), disputed("pay_1", "disp_1", 2500, "inr", APPLIED), id="lost"),
    # Won: what was deducted comes back; nothing was (0, Razorpay's won): nothing moves, a late lost included.
    pytest.param(record("won", 2500), disputed("pay_1", "disp_1", 2500, "inr", REVERSED), id="won-giving-back"),
    pytest.param(record("won"), NOTHING, id="won-nothing-deducted"),
    # No outcome now (open again for pre-arbitration, under review, closed): nothing moves, also when Razorpay
    # deducted at onset; the outcome's own event moves the money.
    *(pytest.param(record(status, deducted), NOTHING, id=f"{status}-deducted-{deducted}")
      for status in ("open", "under_review", "closed") for deducted in (0, 4000)),
    pytest.param(record("reversed", 4000), refused(
        "payload.dispute.entity.status must be one of open, under_review, won, lost, closed (Razorpay's record of "
        "the dispute)"), id="a-status-razorpay-does-not-send"),
    pytest.param({k: v for k, v in record("lost", 4000).items() if k != "status"}, refused(
        "payload.dispute.entity.status must be one of open, under_review, won, lost, closed (Razorpay's record of "
        "the dispute)"), id="no-status"),
])
def test_a_fetched_dispute_moves_what_its_records_status_says_whatever_its_events_type(event_type, now, expected):
    delivered = dispute_event(event_type, "disp_1", "pay_1", 4000, event_type.rpartition(".")[2])
    assert seen(fetched(delivered, now)) == expected


def test_a_delivered_dispute_takes_its_state_from_its_events_type():
    """Not fetched, the entity is the one delivered with the event: its type says lost or won, as Razorpay sends it."""
    won = entity(dispute_event("payment.dispute.won", "disp_1", "pay_1", 4000, "won", 2500), "dispute",
                 status="lost")
    assert seen(effect(won)) == disputed("pay_1", "disp_1", 2500, "inr", REVERSED)
