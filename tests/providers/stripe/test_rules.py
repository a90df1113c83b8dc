"""app/providers/stripe/rules.py's rules: each Stripe event type the rule table knows, an Event as Stripe sends it
(tests/providers/stripe/events.py, built by stripe-python), and the effect docs/providers/stripe.md's table says it has.
Stripe's scheme (verify, sign) is tests/intake/test_signature.py's, against stripe-python."""

import pytest

from app.intake.events import Policy, State, Users, effect_of, parse
from app.providers import stripe
from tests.helpers import ALICE, BOB
from tests.providers.effects import NOTHING, credit, link, refused, refused_by, running_total, seen
from tests.providers.effects import dispute as disputed
from tests.providers.effects import refund as refunded
from tests.providers.stripe.events import (
    ASYNC_FAILED,
    ASYNC_SUCCEEDED,
    BEFORE_BASIL,
    charge_refunded,
    checkout_session,
    dispute,
    event,
    intent_succeeded,
    invoice_intent_succeeded,
    refund,
)

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

USD = Policy("usd")
APPLIED, REVERSED = State.APPLIED, State.REVERSED
ACACIA = "2024-10-28.acacia"  # the first version that sends refund.* for every refund
CLOVER = "2025-09-30.clover"  # a version after basil


def body(evt):
    """The bytes Stripe sends (stripe_events.stripe_signed's)."""
    return str(evt).encode()


def effect(evt, policy=USD, source="default"):
    return effect_of(parse(body(evt), "stripe", source=source), policy)


def changed(evt, **fields):
    """evt with its data.object's fields changed."""
    evt.data.object.update(fields)
    return evt


def without(evt, *names):
    """evt with its data.object's fields left out."""
    for name in names:
        del evt.data.object[name]
    return evt


# -- what each type moves ---------------------------------------------------------------------------------------

MOVES = [
    # payment_intent.succeeded: the user its metadata names, else its customer's link (apply_event), by what
    # was captured (amount_received).
    pytest.param(intent_succeeded("pi_1"), credit("pi_1", ALICE, 250, "usd"), id="intent-succeeded"),
    pytest.param(intent_succeeded("pi_1", cents=600, authorized=1000), credit("pi_1", ALICE, 600, "usd"),
                 id="intent-succeeded-partially-captured-credits-what-was-captured"),
    pytest.param(intent_succeeded("pi_1", user=str(ALICE).upper()), credit("pi_1", ALICE, 250, "usd"),
                 id="intent-succeeded-a-uuid-in-capitals"),
    pytest.param(intent_succeeded("pi_1", metadata={}, customer="cus_1"), credit("pi_1", None, 250, "usd", "cus_1"),
                 id="intent-succeeded-no-metadata-its-customer"),
    pytest.param(invoice_intent_succeeded("pi_1", "cus_1", cents=2000), credit("pi_1", None, 2000, "usd", "cus_1"),
                 id="intent-succeeded-a-billing-invoices-customer"),
    pytest.param(intent_succeeded("pi_1", metadata={"order": "42"}), credit("pi_1", None, 250, "usd"),
                 id="intent-succeeded-naming-no-user"),
    pytest.param(intent_succeeded("pi_1", customer="cus_1"), credit("pi_1", ALICE, 250, "usd", "cus_1"),
                 id="intent-succeeded-metadata-and-customer"),
    # charge.refunded: the Charge's total refunded, of what was captured.
    pytest.param(charge_refunded("pi_1", 100), running_total("pi_1", 100, "usd"), id="charge-refunded-partly"),
    pytest.param(charge_refunded("pi_1", 250), running_total("pi_1", 250, "usd"), id="charge-refunded-whole"),
    # A running total is in its payment's currency (apply_event checks): no setting refuses it.
    pytest.param(charge_refunded("pi_1", 100, currency="eur"), running_total("pi_1", 100, "eur"),
                 id="charge-refunded-another-currency"),
    # Before basil, amount_refunded also counts the authorisation a partial capture released (docs/providers/README.md's
    # third example: 10000 authorised, 6000 captured).
    pytest.param(charge_refunded("pi_1", 4000, cents=10000, captured=6000, api_version=BEFORE_BASIL), NOTHING,
                 id="charge-refunded-before-basil-only-the-released-authorisation"),
    pytest.param(charge_refunded("pi_1", 5500, cents=10000, captured=6000, api_version=BEFORE_BASIL),
                 running_total("pi_1", 1500, "usd"), id="charge-refunded-before-basil-a-refund-after-the-release"),
    pytest.param(charge_refunded("pi_1", 5500, cents=10000, captured=6000, api_version=ACACIA),
                 running_total("pi_1", 1500, "usd"), id="charge-refunded-acacia-is-before-basil"),
    pytest.param(charge_refunded("pi_1", 1500, cents=10000, captured=6000), running_total("pi_1", 1500, "usd"),
                 id="charge-refunded-basil-counts-refunds-alone"),
    pytest.param(charge_refunded("pi_1", 1500, cents=10000, captured=6000, api_version=CLOVER),
                 running_total("pi_1", 1500, "usd"), id="charge-refunded-after-basil"),
    pytest.param(charge_refunded("pi_1", 250, captured=250, api_version=None), running_total("pi_1", 250, "usd"),
                 id="charge-refunded-captured-whole-needs-no-version"),
    # A charge never captured moved no money: amount_captured 0, or null with captured false.
    pytest.param(charge_refunded("pi_1", 250, captured=0, api_version=BEFORE_BASIL), NOTHING,
                 id="charge-refunded-never-captured"),
    pytest.param(changed(charge_refunded("pi_1", 250, captured=0, api_version=BEFORE_BASIL), amount_captured=None),
                 NOTHING, id="charge-refunded-amount-captured-null-captured-false"),
    # Older API versions have no amount_captured: a captured charge is read as captured whole.
    pytest.param(without(charge_refunded("pi_1", 100, api_version="2019-02-19"), "amount_captured"),
                 running_total("pi_1", 100, "usd"), id="charge-refunded-without-amount-captured"),
    # A Refund object, in each event that carries it: the state its status says, whatever the type.
    *(pytest.param(refund("re_1", "pi_1", 300, status=status, event_type=event_type),
                   refunded("pi_1", "re_1", 300, "usd", state), id=f"{event_type}-{status}")
      for event_type in stripe.REFUND_EVENTS
      for status, state in [("pending", APPLIED), ("requires_action", APPLIED), ("succeeded", APPLIED),
                            ("failed", REVERSED), ("canceled", REVERSED)]),
    pytest.param(refund("re_1", "pi_1", 300, currency="eur"), refunded("pi_1", "re_1", 300, "eur", APPLIED),
                 id="refund-another-currency"),
    # Stripe's own Refund of an authorisation that expired uncaptured: no money moved.
    *(pytest.param(refund("re_1", "pi_1", 300, event_type=event_type, reason="expired_uncaptured_charge"), NOTHING,
                   id=f"{event_type}-expired-uncaptured")
      for event_type in stripe.REFUND_EVENTS),
    pytest.param(refund("re_1", "pi_1", 300, reason="requested_by_customer"),
                 refunded("pi_1", "re_1", 300, "usd", APPLIED), id="refund-requested-by-the-customer"),
    # A chargeback: its funds withdrawn, then perhaps reinstated, by the Dispute's amount.
    pytest.param(dispute("dp_1", "pi_1", 500), disputed("pi_1", "dp_1", 500, "usd", APPLIED),
                 id="dispute-funds-withdrawn"),
    pytest.param(dispute("dp_1", "pi_1", 500, "charge.dispute.funds_reinstated", status="won"),
                 disputed("pi_1", "dp_1", 500, "usd", REVERSED), id="dispute-funds-reinstated"),
    pytest.param(dispute("dp_1", "pi_1", 500, currency="eur"), disputed("pi_1", "dp_1", 500, "eur", APPLIED),
                 id="dispute-another-currency"),
    # Opening, updating or closing a dispute or an inquiry moves no funds.
    *(pytest.param(dispute("dp_1", "pi_1", 500, event_type, status), NOTHING, id=f"{event_type}-{status}")
      for event_type, status in [("charge.dispute.created", "needs_response"),
                                 ("charge.dispute.created", "warning_needs_response"),
                                 ("charge.dispute.updated", "under_review"), ("charge.dispute.closed", "won"),
                                 ("charge.dispute.closed", "lost")]),
    # A paid Checkout Session in payment mode: its PaymentIntent, credited with amount_total, to the user its
    # metadata's key names, else its client_reference_id, else its customer's link (apply_event).
    pytest.param(checkout_session("pi_1", cents=900), credit("pi_1", ALICE, 900, "usd"), id="session-completed"),
    pytest.param(checkout_session("pi_1", ASYNC_SUCCEEDED), credit("pi_1", ALICE, 250, "usd"),
                 id="session-async-payment-succeeded"),
    pytest.param(checkout_session("pi_1", user=ALICE, metadata={"user_id": str(BOB)}), credit("pi_1", BOB, 250, "usd"),
                 id="session-metadata-before-client-reference-id"),
    pytest.param(checkout_session("pi_1", user=None, customer="cus_1"), credit("pi_1", None, 250, "usd", "cus_1"),
                 id="session-customer-only"),
    pytest.param(checkout_session("pi_1", user="4217"), {**credit("pi_1", None, 250, "usd"), "app_key": "4217"},
                 id="session-client-reference-id-the-applications-key"),
    pytest.param(checkout_session("pi_1", user="o" * 256), refused_by(
        "WEBHOOK_USER_METADATA_KEY",
        "data.object.client_reference_id must be a user's UUID or the application's key of one (1 to 255 characters)"
        " (WEBHOOK_USER_METADATA_KEY)",
        credit("pi_1", None, 250, "usd")), id="session-client-reference-id-too-long-for-a-key"),
    # Unpaid (a delayed payment method, until async_payment_succeeded), nothing to pay, or no payment here.
    *(pytest.param(checkout_session("pi_1", event_type, payment_status=status, mode=mode), NOTHING,
                   id=f"{event_type}-{mode}-{status}")
      for event_type, mode, status in [("checkout.session.completed", "payment", "unpaid"),
                                       ("checkout.session.completed", "payment", "no_payment_required"),
                                       ("checkout.session.completed", "subscription", "paid"),
                                       ("checkout.session.completed", "setup", "no_payment_required"),
                                       (ASYNC_FAILED, "payment", "unpaid")]),
    # A completed subscription Session, paid or with nothing to pay (a trial): its customer linked to its user, no
    # money (its invoices' PaymentIntents are the money); unpaid, or naming no customer or no user, nothing.
    *(pytest.param(checkout_session(None, event_type, payment_status=status, mode="subscription", customer="cus_1"),
                   link("cus_1", ALICE), id=f"{event_type}-subscription-{status}-links")
      for event_type, status in [("checkout.session.completed", "paid"),
                                 ("checkout.session.completed", "no_payment_required"), (ASYNC_SUCCEEDED, "paid")]),
    pytest.param(checkout_session(None, mode="subscription", user=None, metadata={"user_id": str(BOB)},
                                  customer="cus_1"), link("cus_1", BOB), id="subscription-session-metadata-links"),
    *(pytest.param(checkout_session(None, payment_status=status, mode="subscription", user=user, customer="cus_1"),
                   NOTHING, id=f"subscription-session-{status}-{user}")
      for status, user in [("unpaid", ALICE), ("paid", None)]),
    pytest.param(checkout_session(None, mode="subscription", user="order_7", customer="cus_1"),
                 {**link("cus_1", None), "app_key": "order_7"}, id="subscription-session-the-applications-key-links"),
    # Types no rule knows.
    *(pytest.param(event(event_type, obj), NOTHING, id=event_type) for event_type, obj in [
        ("payment_intent.created", {"id": "pi_1", "object": "payment_intent", "amount": 250, "currency": "usd"}),
        ("payment_intent.payment_failed", {"id": "pi_1", "object": "payment_intent", "amount": 250,
                                           "currency": "usd", "metadata": {"user_id": str(ALICE)}}),
        ("charge.succeeded", {"id": "ch_1", "object": "charge", "payment_intent": "pi_1", "amount": 250,
                              "amount_captured": 250, "currency": "usd"}),
        ("charge.captured", {"id": "ch_1", "object": "charge", "payment_intent": "pi_1", "amount": 250,
                             "amount_captured": 250, "currency": "usd"}),
        ("customer.created", {"id": "cus_1", "object": "customer"}),
    ]),
]


@pytest.mark.parametrize("evt, expected", MOVES)
def test_each_stripe_type_moves_what_the_table_says(evt, expected):
    assert seen(effect(evt)) == expected


def test_every_type_the_rule_table_knows_has_a_row_above():
    assert set(stripe.RULES) <= {param.values[0].type for param in MOVES}


# -- what the settings refuse ---------------------------------------------------------------------------------

TEST_MODE = "a test-mode event (livemode is not true); set STRIPE_ACCEPT_TEST_EVENTS=true to accept"


@pytest.mark.parametrize("evt, applies", [
    pytest.param(intent_succeeded("pi_1"), credit("pi_1", ALICE, 250, "usd"), id="a-payment"),
    pytest.param(charge_refunded("pi_1", 100), running_total("pi_1", 100, "usd"), id="a-running-total"),
    pytest.param(refund("re_1", "pi_1", 300), refunded("pi_1", "re_1", 300, "usd", APPLIED), id="a-refund"),
    pytest.param(dispute("dp_1", "pi_1", 500), disputed("pi_1", "dp_1", 500, "usd", APPLIED), id="a-dispute"),
])
def test_a_test_mode_event_is_refused_unless_the_setting_accepts_it(evt, applies):
    evt.livemode = False
    assert seen(effect(evt)) == refused_by("STRIPE_ACCEPT_TEST_EVENTS", TEST_MODE, applies)
    assert seen(effect(evt, Policy("usd", accept_test_events=True))) == applies


def test_a_payment_in_a_currency_not_the_ledgers_is_refused_by_the_setting():
    assert seen(effect(intent_succeeded("pi_1", currency="eur"))) == refused_by(
        "LEDGER_CURRENCY", "data.object.currency must be the ledger's currency, 'usd'",
        credit("pi_1", ALICE, 250, "eur"))
    assert seen(effect(intent_succeeded("pi_1", currency="eur"), Policy("eur"))) == credit("pi_1", ALICE, 250, "eur")


# -- which user a payment credits (docs/providers/stripe.md, "Which user a payment credits") ----------------------

# A source whose payments name their user under a key of its own, beside another product's user_id.
OWN_KEY = Policy("usd", users={"stripe": Users("ledger_user_id", setting="WEBHOOK_STRIPE_USER_METADATA_KEY")})
BOTH_KEYS = {"ledger_user_id": str(BOB), "user_id": "usr_8812"}


@pytest.mark.parametrize("metadata, source, expected", [
    pytest.param(BOTH_KEYS, "stripe", credit("pi_1", BOB, 250, "usd"), id="the-sources-key"),
    pytest.param({"user_id": str(ALICE)}, "stripe", credit("pi_1", None, 250, "usd"),
                 id="another-key-names-no-one-here"),
    pytest.param({"ledger_user_id": "bob"}, "stripe", {**credit("pi_1", None, 250, "usd"), "app_key": "bob"},
                 id="the-applications-key-under-the-sources-key"),
    pytest.param(BOTH_KEYS, "default", {**credit("pi_1", None, 250, "usd"), "app_key": "usr_8812"},
                 id="the-applications-key-under-another-sources-default-key"),
    pytest.param({"ledger_user_id": ""}, "stripe", refused_by(
        "WEBHOOK_STRIPE_USER_METADATA_KEY",
        "data.object.metadata.ledger_user_id must be a user's UUID or the application's key of one (1 to 255 "
        "characters) (WEBHOOK_STRIPE_USER_METADATA_KEY)",
        credit("pi_1", None, 250, "usd")), id="empty-under-the-sources-key"),
])
def test_the_metadata_key_that_names_the_user_is_the_sources(metadata, source, expected):
    effect_ = effect(intent_succeeded("pi_1", metadata=metadata), OWN_KEY, source)
    assert seen(effect_) == expected
    assert effect_.users == OWN_KEY.users_of(source)


# -- what a rule refuses whatever the settings ----------------------------------------------------------------

@pytest.mark.parametrize("evt, problem", [
    pytest.param(changed(intent_succeeded("pi_1"), amount_received=0),
                 "data.object.amount_received must be a positive integer", id="intent-nothing-received"),
    pytest.param(without(intent_succeeded("pi_1"), "amount_received"),
                 "data.object.amount_received must be a positive integer", id="intent-amount-received-missing"),
    pytest.param(changed(intent_succeeded("pi_1"), amount_received=2.5),
                 "data.object.amount_received must be a positive integer", id="intent-amount-received-a-float"),
    pytest.param(changed(intent_succeeded("pi_1"), currency=None),
                 "data.object.currency must be a currency's three-letter code", id="intent-currency-null"),
    pytest.param(without(intent_succeeded("pi_1"), "id"),
                 "data.object.id must be a payment id of 1 to 255 characters", id="intent-id-missing"),
    pytest.param(changed(intent_succeeded("pi_1"), customer={"id": "cus_1", "object": "customer"}),
                 "data.object.customer must be a customer id of 1 to 255 characters", id="intent-customer-expanded"),
    # The versions differ on a partially captured charge: a version that cannot be read cannot say which.
    *(pytest.param(charge_refunded("pi_1", 5500, cents=10000, captured=6000, api_version=version),
                   "api_version must name a Stripe API version to read the refunds of a partially captured charge",
                   id=f"charge-refunded-partly-captured-api-version-{name}")
      for name, version in [("null", None), ("latest", "latest"), ("a-month", "2024-06")]),
    pytest.param(changed(charge_refunded("pi_1", 100), payment_intent=None),
                 "data.object.payment_intent must be a payment id of 1 to 255 characters",
                 id="charge-refunded-no-payment-intent"),
    pytest.param(changed(charge_refunded("pi_1", 100), amount_refunded=None),
                 "data.object.amount_refunded must be a positive integer", id="charge-refunded-no-total"),
    pytest.param(changed(refund("re_1", "pi_1", 300), status="reversed"),
                 "data.object.status must be one of pending, requires_action, succeeded, failed, canceled",
                 id="refund-a-status-stripe-does-not-send"),
    pytest.param(without(refund("re_1", "pi_1", 300), "id"), "data.object.id must be an id of 1 to 255 characters",
                 id="refund-id-missing"),
    pytest.param(refund("re_1", "pi_1", 0), "data.object.amount must be a positive integer", id="refund-of-nothing"),
    pytest.param(changed(refund("re_1", "pi_1", 300), payment_intent=None),
                 "data.object.payment_intent must be a payment id of 1 to 255 characters",
                 id="refund-no-payment-intent"),
    pytest.param(without(dispute("dp_1", "pi_1", 500), "id"), "data.object.id must be an id of 1 to 255 characters",
                 id="dispute-id-missing"),
    pytest.param(changed(dispute("dp_1", "pi_1", 500), amount=-500), "data.object.amount must be a positive integer",
                 id="dispute-amount-negative"),
])
def test_an_event_its_shape_refuses_names_the_field(evt, problem):
    assert seen(effect(evt)) == refused(problem)


# -- what two deliveries of one event are compared by ---------------------------------------------------------

def _sha256(evt, policy=USD, source="default"):
    return effect(evt, policy, source).sha256


def test_a_retry_with_another_pending_webhooks_has_the_same_effect():
    first, retry = intent_succeeded("pi_1", event_id="evt_1"), intent_succeeded("pi_1", event_id="evt_1")
    retry.pending_webhooks, retry.created = 3, first.created + 3600
    assert body(first) != body(retry)
    assert _sha256(first) == _sha256(retry)


def test_a_refunds_status_is_compared_by_what_it_means():
    assert _sha256(refund("re_1", "pi_1", 300, "pending", "refund.updated")) == \
        _sha256(refund("re_1", "pi_1", 300, "succeeded", "refund.updated"))
    assert _sha256(refund("re_1", "pi_1", 300, "failed", "refund.updated")) != \
        _sha256(refund("re_1", "pi_1", 300, "succeeded", "refund.updated"))


def test_a_test_mode_event_hashes_as_the_effect_the_setting_would_allow():
    evt = intent_succeeded("pi_1")
    evt.livemode = False
    assert _sha256(evt) == _sha256(evt, Policy("usd", accept_test_events=True))


def test_a_payment_is_hashed_by_its_whole_metadata_and_customer_never_by_the_key_setting():
    evt = intent_succeeded("pi_1", metadata=BOTH_KEYS)
    assert _sha256(evt, USD, "stripe") == _sha256(evt, OWN_KEY, "stripe")
    assert _sha256(evt) != _sha256(intent_succeeded("pi_1", metadata={**BOTH_KEYS, "order": "42"}))
    assert _sha256(evt) != _sha256(intent_succeeded("pi_1", metadata=BOTH_KEYS, customer="cus_1"))
