"""The scheme, shape and rules of app/providers/paypal/, offline: a signature made by its signer verifies and one
over another body does not (the certificate's key given; tests/providers/paypal/test_scheme.py fetches it, and holds
the signed string to PayPal's SDK); the envelope; and each PayPal event type the rule table knows, an event
as PayPal sends it (tests/providers/paypal/events.py), with the effect docs/providers/paypal.md's table says it has. The
decimal amounts themselves: tests/providers/paypal/test_amounts.py."""

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from app.core.signing import SignatureError
from app.intake.events import InvalidEventError, Kind, Policy, State, effect_of, parse
from app.providers import paypal
from tests.helpers import ALICE
from tests.providers.effects import NOTHING, credit, refused, refused_by, seen
from tests.providers.effects import dispute as disputed
from tests.providers.effects import refund as refunded
from tests.providers.paypal.events import capture_completed, dispute_event, refund_event

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

USD = Policy("usd")
APPLIED, REVERSED = State.APPLIED, State.REVERSED
DISPUTE = "PP-D-27803"  # a dispute_id as PayPal's samples write it


def encode(document):
    return json.dumps(document).encode()


def effect(document, policy=USD):
    return effect_of(parse(encode(document), "paypal"), policy)


def resource(document, **fields):
    """document with its resource's fields changed."""
    document["resource"].update(fields)
    return document


# -- the scheme, offline ------------------------------------------------------------------------------------------

NOW = 1_700_000_000
WEBHOOK_ID = b"1JE4291016473214C"  # the form of PayPal's sample's webhook_id
CERT_URL = "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77"
BODY = encode(capture_completed("CAP1", event_id="WH-1"))
TRANSMISSION_ID = "b2e6d6c0-8d7e-11ee-9c4f-0242ac120002"


@pytest.fixture(scope="module")
def key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def verify(key, body, headers, webhook_ids=(WEBHOOK_ID,)):
    """paypal.verify with key's certificate for the URL the headers name (headers' names in lower case)."""
    asked = []

    def certificates(url, now):
        asked.append(url)
        return key.public_key()

    index = paypal.verify(body, {name.lower(): value for name, value in headers.items()}, webhook_ids, 300, NOW,
                          certificates)
    assert asked == [CERT_URL]
    return index


def test_a_delivery_paypal_signed_verifies(key):
    headers = paypal.sign(BODY, WEBHOOK_ID, NOW, TRANSMISSION_ID, key, CERT_URL)
    assert verify(key, BODY, headers, (b"OLDWEBHOOKID1", WEBHOOK_ID)) == 1


@pytest.mark.parametrize("body", [
    pytest.param(BODY + b" ", id="a-byte-appended"),
    pytest.param(BODY.replace(b'"21.00"', b'"91.00"'), id="the-amount-changed"),
])
def test_a_signature_over_another_body_does_not_match(key, body):
    headers = paypal.sign(BODY, WEBHOOK_ID, NOW, TRANSMISSION_ID, key, CERT_URL)
    with pytest.raises(SignatureError, match="^signature does not match$"):
        verify(key, body, headers)


@pytest.mark.parametrize("header, value", [
    ("PAYPAL-TRANSMISSION-ID", "c3f7e7d1-8d7e-11ee-9c4f-0242ac120002"),
    ("PAYPAL-TRANSMISSION-TIME", "2023-11-14T22:13:21Z"),  # a second later: still within the tolerance
])
def test_each_signed_header_is_signed(key, header, value):
    headers = paypal.sign(BODY, WEBHOOK_ID, NOW, TRANSMISSION_ID, key, CERT_URL)
    with pytest.raises(SignatureError, match="^signature does not match$"):
        verify(key, BODY, {**headers, header: value})


# -- the envelope -----------------------------------------------------------------------------------------------

def test_the_event_is_its_id_its_event_type_and_its_resource():
    document = capture_completed("CAP1", event_id="WH-58D329510W468432D-8HN650336L201105X")
    event = parse(encode(document), "paypal", source="paypal")
    assert (event.id, event.type, event.data, event.source) == (
        "WH-58D329510W468432D-8HN650336L201105X", "PAYMENT.CAPTURE.COMPLETED", document["resource"], "paypal")


@pytest.mark.parametrize("field, value, message", [
    ("id", None, "'id' is missing"),
    ("id", "W" * 256, "'id' must be 1 to 255 characters"),
    ("event_type", None, "'event_type' is missing"),
    ("event_type", "E" * 65, "'event_type' must be 1 to 64 characters"),
    ("resource", None, "'resource' must be an object"),
    ("resource", [], "'resource' must be an object"),
])
def test_an_envelope_without_its_id_type_or_resource_is_refused(field, value, message):
    with pytest.raises(InvalidEventError) as refusal:
        parse(encode({**capture_completed("CAP1"), field: value}), "paypal")
    assert str(refusal.value) == message


# -- what each type moves ---------------------------------------------------------------------------------------

def _outcome(outcome, value="21.00", **fields):
    return dispute_event("CUSTOMER.DISPUTE.RESOLVED", DISPUTE, "CAP1", value, "RESOLVED", outcome, **fields)


MOVES = [
    # PAYMENT.CAPTURE.COMPLETED: the capture, to the user its custom_id names, in minor units exactly.
    pytest.param(capture_completed("CAP1", value="21.00"), USD, credit("CAP1", ALICE, 2100, "usd"),
                 id="capture-completed"),
    pytest.param(capture_completed("CAP1", value="0.01"), USD, credit("CAP1", ALICE, 1, "usd"),
                 id="capture-completed-one-cent"),
    pytest.param(capture_completed("CAP1", value="21.5"), USD, credit("CAP1", ALICE, 2150, "usd"),
                 id="capture-completed-one-decimal"),
    pytest.param(capture_completed("CAP1", value="500", currency="JPY"), Policy("jpy"),
                 credit("CAP1", ALICE, 500, "jpy"), id="capture-completed-yen-have-no-decimals"),
    pytest.param(capture_completed("CAP1", value="1.234", currency="KWD"), Policy("kwd"),
                 credit("CAP1", ALICE, 1234, "kwd"), id="capture-completed-dinars-have-three"),
    pytest.param(capture_completed("CAP1", user=str(ALICE).upper()), USD, credit("CAP1", ALICE, 2100, "usd"),
                 id="capture-completed-a-uuid-in-capitals"),
    # A Refund of a capture, named by its up link: the state its status says.
    *(pytest.param(refund_event(event_type, "REF1", "CAP1", "5.00", status), USD,
                   refunded("CAP1", "REF1", 500, "usd", state), id=f"{event_type}-{status}")
      for event_type in paypal.REFUND_EVENTS
      for status, state in [("COMPLETED", APPLIED), ("PENDING", APPLIED), ("FAILED", REVERSED),
                            ("CANCELLED", REVERSED)]),
    # A refund is in its payment's currency (apply_event checks): no setting refuses it.
    pytest.param(refund_event("PAYMENT.CAPTURE.REFUNDED", "REF1", "CAP1", "5.00", currency="EUR"), USD,
                 refunded("CAP1", "REF1", 500, "eur", APPLIED), id="refund-another-currency"),
    # A resolved dispute: the buyer's win takes what the buyer was refunded (dispute_outcome.amount_refunded),
    # the seller's gives back what a loss took (the dispute named by its dispute_amount).
    *(pytest.param(_outcome(outcome), USD, disputed("CAP1", DISPUTE, 2100, "usd", state), id=f"resolved-{outcome}")
      for outcome, state in [("RESOLVED_BUYER_FAVOUR", APPLIED), ("ACCEPTED", APPLIED),
                             ("RESOLVED_SELLER_FAVOUR", REVERSED), ("DENIED", REVERSED),
                             ("CANCELED_BY_BUYER", REVERSED), ("RESOLVED_WITH_PAYOUT", REVERSED)]),
    # The buyer won part of what was disputed: only what PayPal refunded the buyer is taken.
    *(pytest.param(_outcome(outcome, refunded="15.00"), USD, disputed("CAP1", DISPUTE, 1500, "usd", APPLIED),
                   id=f"resolved-{outcome}-in-part") for outcome in ("RESOLVED_BUYER_FAVOUR", "ACCEPTED")),
    pytest.param(_outcome("RESOLVED_BUYER_FAVOUR", value="500", refunded="120", currency="JPY"), Policy("jpy"),
                 disputed("CAP1", DISPUTE, 120, "jpy", APPLIED), id="resolved-in-part-in-yen"),
    # PayPal paid the buyer (seller protection) or refunded the buyer in a seller's win: nothing from the merchant.
    pytest.param(_outcome("RESOLVED_WITH_PAYOUT", refunded="21.00"), USD,
                 disputed("CAP1", DISPUTE, 2100, "usd", REVERSED), id="resolved-with-payout-refunded-by-paypal"),
    # Created and updated move nothing: the ledger follows the outcome, not a hold.
    pytest.param(dispute_event("CUSTOMER.DISPUTE.CREATED", DISPUTE, "CAP1", "21.00"), USD, NOTHING,
                 id="dispute-created"),
    pytest.param(dispute_event("CUSTOMER.DISPUTE.UPDATED", DISPUTE, "CAP1", "21.00", "UNDER_REVIEW"), USD, NOTHING,
                 id="dispute-updated"),
    # Types no rule knows.
    *(pytest.param({**capture_completed("CAP1", status=status), "event_type": event_type}, USD, NOTHING,
                   id=event_type)
      for event_type, status in [("PAYMENT.CAPTURE.PENDING", "PENDING"), ("PAYMENT.CAPTURE.DENIED", "DECLINED"),
                                 ("PAYMENT.AUTHORIZATION.CREATED", "CREATED"),
                                 ("CHECKOUT.ORDER.APPROVED", "APPROVED")]),
]


@pytest.mark.parametrize("document, policy, expected", MOVES)
def test_each_paypal_type_moves_what_the_table_says(document, policy, expected):
    assert seen(effect(document, policy)) == expected


def test_every_type_the_rule_table_knows_has_a_row_above():
    assert set(paypal.RULES) <= {param.values[0]["event_type"] for param in MOVES}


def test_paypal_has_no_test_mode_that_a_setting_refuses():
    """Sandbox and live are separate webhooks; the body says neither (docs/providers/paypal.md)."""
    assert seen(effect(capture_completed("CAP1"), Policy("usd", accept_test_events=False))) == credit(
        "CAP1", ALICE, 2100, "usd")


def test_a_capture_in_a_currency_not_the_ledgers_is_refused_by_the_setting():
    assert seen(effect(capture_completed("CAP1", value="21.00", currency="EUR"))) == refused_by(
        "LEDGER_CURRENCY", "resource.amount.currency_code must be the ledger's currency, 'usd'",
        credit("CAP1", ALICE, 2100, "eur"))


# -- what a rule refuses whatever the settings ----------------------------------------------------------------

def _inexact(label, code, decimals, value):
    return f"{label}.value must be a decimal amount of {code} exact in its minor units ({decimals} decimals), " \
           f"got {value!r}"


CAPTURE_URL = "https://api.paypal.com/v2/payments/captures/CAP1"


def _refund_linked(*links):
    """A Refund of 5.00 whose links are these (rel, href)."""
    return resource(refund_event("PAYMENT.CAPTURE.REFUNDED", "REF1", "CAP1", "5.00"),
                    links=[{"href": href, "rel": rel, "method": "GET"} for rel, href in links])


NO_CAPTURE = "resource.links[rel=up] (the capture's URL) must be a payment id of 1 to 255 characters"
OUTCOMES = "RESOLVED_BUYER_FAVOUR, ACCEPTED, RESOLVED_SELLER_FAVOUR, DENIED, CANCELED_BY_BUYER, RESOLVED_WITH_PAYOUT"
NOT_REFUNDED = ("resource.dispute_outcome.amount_refunded is missing: a dispute resolved for the buyer takes what "
                "the buyer was refunded, and PayPal's record does not say")
POSITIVE = ("resource.dispute_outcome.amount_refunded.value (the buyer's win) or resource.dispute_amount.value must "
            "be a positive integer")


# A capture whose custom_id names no user: neither a UUID nor the application's key of one.
NO_USER = "resource.custom_id must be a user's UUID or the application's key of one (1 to 255 characters)"


@pytest.mark.parametrize("document, policy, problem", [
    # An amount that does not convert exactly: more decimals than the currency has, a sign, an exponent.
    *(pytest.param(capture_completed("CAP1", value=value, currency=code), Policy(code.lower()),
                   _inexact("resource.amount", code, decimals, value), id=f"capture-{value}-{code}")
      for value, code, decimals in [("10.001", "USD", 2), ("1.5", "JPY", 0), ("1.2345", "KWD", 3),
                                    ("-1.00", "USD", 2), ("+1.00", "USD", 2), ("1e2", "USD", 2),
                                    ("1,00", "USD", 2), ("", "USD", 2)]),
    # A number instead of PayPal's decimal string, and nothing at all: never a credit.
    pytest.param(resource(capture_completed("CAP1"), amount={"currency_code": "USD", "value": 21.0}), USD,
                 "resource.amount.value must be a positive integer", id="capture-a-number"),
    pytest.param(capture_completed("CAP1", value="0.00"), USD, "resource.amount.value must be a positive integer",
                 id="capture-of-nothing"),
    pytest.param(capture_completed("CAP1", currency="dollars"), USD,
                 "resource.amount.currency_code must be a currency's three-letter code", id="capture-no-currency-code"),
    pytest.param(capture_completed("CAP1", custom_id=None), USD,
                 NO_USER, id="capture-no-custom-id"),
    pytest.param(capture_completed("CAP1", custom_id=""), USD,
                 NO_USER, id="capture-custom-id-empty"),
    pytest.param(capture_completed(None), USD, "resource.id must be a payment id of 1 to 255 characters",
                 id="capture-no-id"),
    # A Refund whose up link is missing or names no capture.
    pytest.param(_refund_linked(("self", "https://api.paypal.com/v2/payments/refunds/REF1")), USD, NO_CAPTURE,
                 id="refund-no-up-link"),
    pytest.param(_refund_linked(("up", "https://api.paypal.com/v2/checkout/orders/ORD1")), USD, NO_CAPTURE,
                 id="refund-up-to-an-order"),
    pytest.param(_refund_linked(("up", CAPTURE_URL), ("up", CAPTURE_URL)), USD, NO_CAPTURE,
                 id="refund-two-up-links"),
    pytest.param(resource(refund_event("PAYMENT.CAPTURE.REFUNDED", "REF1", "CAP1", "5.00"), links=5), USD,
                 NO_CAPTURE, id="refund-links-not-a-list"),
    pytest.param(refund_event("PAYMENT.CAPTURE.REFUNDED", "REF1", "CAP1", "5.001"), USD,
                 _inexact("resource.amount", "USD", 2, "5.001"), id="refund-inexact"),
    pytest.param(refund_event("PAYMENT.CAPTURE.REFUNDED", None, "CAP1", "5.00"), USD,
                 "resource.id must be an id of 1 to 255 characters", id="refund-no-id"),
    # A dispute of another outcome, or of more than one transaction.
    pytest.param(dispute_event("CUSTOMER.DISPUTE.RESOLVED", DISPUTE, "CAP1", "21.00", "RESOLVED"), USD,
                 f"resource.dispute_outcome.outcome_code must be one of {OUTCOMES}", id="resolved-no-outcome"),
    pytest.param(_outcome("NONE"), USD, f"resource.dispute_outcome.outcome_code must be one of {OUTCOMES}",
                 id="resolved-outcome-none"),
    pytest.param(resource(_outcome("RESOLVED_BUYER_FAVOUR"), disputed_transactions=[
        {"seller_transaction_id": "CAP1"}, {"seller_transaction_id": "CAP2"}]), USD,
                 "resource.disputed_transactions must name exactly one transaction", id="resolved-two-transactions"),
    pytest.param(_outcome("RESOLVED_SELLER_FAVOUR", "21.001"), USD,
                 _inexact("resource.dispute_amount", "USD", 2, "21.001"), id="resolved-inexact"),
    pytest.param(_outcome("RESOLVED_BUYER_FAVOUR", refunded="15.001"), USD,
                 _inexact("resource.dispute_outcome.amount_refunded", "USD", 2, "15.001"),
                 id="resolved-refunded-inexact"),
    # A buyer's win whose record does not say what the buyer was refunded: the ledger does not guess it.
    *(pytest.param(_outcome(outcome, refunded=None), USD, NOT_REFUNDED, id=f"resolved-{outcome}-refunded-unsaid")
      for outcome in ("RESOLVED_BUYER_FAVOUR", "ACCEPTED")),
    pytest.param(_outcome("RESOLVED_BUYER_FAVOUR", refunded="0.00"), USD, POSITIVE, id="resolved-refunded-nothing"),
])
def test_an_event_its_shape_refuses_names_the_field(document, policy, problem):
    assert seen(effect(document, policy)) == refused(problem)


def test_a_custom_id_that_is_not_a_uuid_is_the_applications_key_of_a_user():
    seen_ = seen(effect(capture_completed("CAP1", custom_id="4217"), USD))
    assert (seen_["kind"], seen_["app_key"], "user_id" in seen_) == (Kind.CREDIT, "4217", False)


# PayPal's Refund statuses: CANCELLED, FAILED, PENDING, COMPLETED (Payments v2, the refund's `status`,
# https://developer.paypal.com/docs/api/payments/v2/).
def test_a_refund_status_paypal_does_not_send_is_refused_naming_paypals_statuses():
    problem = seen(effect(refund_event("PAYMENT.CAPTURE.REFUNDED", "REF1", "CAP1", "5.00", "DECLINED")))["problem"]
    label, _, statuses = problem.partition(" must be one of ")
    assert (label, set(statuses.split(", "))) == ("resource.status", {"CANCELLED", "FAILED", "PENDING", "COMPLETED"})
