"""app/intake/events.py, pure: parse (each envelope shape, and what it refuses with which error and message), and
effect_of under this service's own types (payment.succeeded, payment.refunded), a type no rule knows, and the
422 of the refund events Stripe and Razorpay both send; what two deliveries of one event are compared by.
The shapes are docs/design.md's ("The event and its bytes of record") and docs/providers/'s per scheme;
the rules are the provider pages' tables. Each provider's own rules: tests/providers/."""

import hashlib
import json

import pytest

from app.intake.events import MAX_CENTS, Event, InvalidEventError, InvalidJSONError, Kind, Policy, effect_of, parse
from tests.helpers import ALICE, BOB
from tests.providers.effects import NOTHING, credit, refused, refused_by, running_total, seen
from tests.providers.razorpay.events import refund_event as razorpay_refund
from tests.providers.stripe.events import refund as stripe_refund

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit


def encode(document):
    return document if isinstance(document, bytes) else json.dumps(document).encode()


# -- parse: each envelope ---------------------------------------------------------------------------------------

OWN = {"id": "evt_1", "type": "payment.succeeded", "data": {"userId": str(ALICE), "amountCents": 250}}
# The Standard Webhooks specification's payload: no id (the signed webhook-id header is the event's).
SPEC = {"type": "payment.succeeded", "timestamp": "2024-05-01T12:00:00Z", "data": OWN["data"]}
PING = {"zen": "Design for failure.", "hook_id": 109948940}  # GitHub's ping: no id, no type
RAZORPAY = {"entity": "event", "event": "payment.captured", "contains": ["payment"],
            "payload": {"payment": {"entity": {"id": "pay_1", "amount": 50000}}}, "created_at": 1691735748}
PAYPAL = {"id": "WH-1", "event_type": "PAYMENT.CAPTURE.COMPLETED", "resource": {"id": "CAP1"}}
GITHUB_HEADERS = {"X-GitHub-Delivery": "d-1", "X-GitHub-Event": "ping"}


def razorpay_id(header, document):
    """docs/providers/razorpay.md: the x-razorpay-event-id header, a dot, 32 hex digits of the body's SHA-256."""
    return f"{header}.{hashlib.sha256(encode(document)).hexdigest()[:32]}"


@pytest.mark.parametrize("scheme, document, headers, event_id, event_type, data", [
    pytest.param("hmac-sha256", OWN, {}, "evt_1", "payment.succeeded", OWN["data"], id="hmac-sha256"),
    pytest.param("stripe", OWN, {}, "evt_1", "payment.succeeded", OWN["data"], id="stripe"),
    pytest.param("standard-webhooks", OWN, {"webhook-id": "msg_1"}, "msg_1", "payment.succeeded", OWN["data"],
                 id="standard-webhooks-the-header-not-the-body-id"),
    pytest.param("standard-webhooks", SPEC, {"webhook-id": "msg_1"}, "msg_1", "payment.succeeded", OWN["data"],
                 id="standard-webhooks-the-specifications-payload"),
    pytest.param("github", PING, GITHUB_HEADERS, "d-1", "ping", PING, id="github-its-headers-and-whole-body"),
    pytest.param("github", OWN, GITHUB_HEADERS, "evt_1", "payment.succeeded", OWN["data"],
                 id="github-a-body-with-a-type-is-the-services-own"),
    pytest.param("razorpay", RAZORPAY, {"x-razorpay-event-id": "HQ9tqtn9mNxM5C"},
                 razorpay_id("HQ9tqtn9mNxM5C", RAZORPAY), "payment.captured", RAZORPAY["payload"], id="razorpay"),
    pytest.param("razorpay", OWN, {"x-razorpay-event-id": "HQ9tqtn9mNxM5C"}, "evt_1", "payment.succeeded",
                 OWN["data"], id="razorpay-a-body-with-a-type-is-the-services-own"),
    pytest.param("paypal", PAYPAL, {}, "WH-1", "PAYMENT.CAPTURE.COMPLETED", PAYPAL["resource"], id="paypal"),
    pytest.param("paypal", OWN, {}, "evt_1", "payment.succeeded", OWN["data"],
                 id="paypal-a-body-with-a-type-is-the-services-own"),
])
def test_parse_reads_the_id_type_and_data_each_scheme_names(scheme, document, headers, event_id, event_type, data):
    body = encode(document)
    assert parse(body, scheme, headers, "billing") == Event(event_id, event_type, data, document, body, "billing")


def nested(depth):
    """An event whose body nests depth objects deep, the body itself the first."""
    data = {}
    for _ in range(depth - 2):
        data = {"a": data}
    return encode({"id": "evt_1", "type": "ping", "data": data})


@pytest.mark.parametrize("body", [
    pytest.param(nested(64), id="64-levels"),
    pytest.param(encode({"id": "evt_1", "type": "ping", "data": {"a": [[]] * 100}}), id="many-brackets-shallow"),
])
def test_parse_takes_a_body_nested_up_to_the_limit(body):
    assert parse(body).data == json.loads(body)["data"]


@pytest.mark.parametrize("body, message", [
    pytest.param(b"", "body is not valid JSON", id="empty"),
    pytest.param(b"not json", "body is not valid JSON", id="not-json"),
    pytest.param(b'{"id": ' + b"1" * 5000 + b"}", "body is not valid JSON", id="an-over-long-integer"),
    pytest.param(b'\xff\xfe{}', "body is not valid UTF-8", id="not-utf8"),
    pytest.param('{"id": "caf\u00e9"}'.encode("latin-1"), "body is not valid UTF-8", id="latin-1"),
    pytest.param(b"[1, 2]", "body must be a JSON object", id="an-array"),
    pytest.param(b'"a string"', "body must be a JSON object", id="a-string"),
    pytest.param(b"null", "body must be a JSON object", id="null"),
    pytest.param(b'{"id": "e", "type": "t", "data": {"x": NaN}}', "body is not valid JSON", id="nan"),
    pytest.param(b'{"id": "e", "type": "t", "data": {"x": -Infinity}}', "body is not valid JSON", id="infinity"),
    pytest.param(nested(65), "body is nested more than 64 levels deep", id="65-levels"),
    pytest.param(b"[" * 100000 + b"]" * 100000, "body is nested more than 64 levels deep", id="beyond-the-stack"),
])
def test_parse_refuses_a_body_that_is_no_json_object(body, message):
    with pytest.raises(InvalidJSONError) as refusal:
        parse(body)
    assert str(refusal.value) == message


# A field left out of the event (None is sent as JSON's null).
MISSING = object()


def _event(**fields):
    """OWN with fields changed; a field given MISSING is left out."""
    return {key: value for key, value in {**OWN, **fields}.items() if value is not MISSING}


@pytest.mark.parametrize("scheme, document, headers, message", [
    pytest.param("hmac-sha256", _event(id=MISSING), {}, "'id' is missing", id="id-missing"),
    pytest.param("hmac-sha256", _event(id=None), {}, "'id' is missing", id="id-null"),
    pytest.param("hmac-sha256", _event(id=42), {}, "'id' must be a string", id="id-a-number"),
    pytest.param("hmac-sha256", _event(id=""), {}, "'id' must be 1 to 255 characters", id="id-empty"),
    pytest.param("hmac-sha256", _event(id="e" * 256), {}, "'id' must be 1 to 255 characters", id="id-256"),
    pytest.param("hmac-sha256", _event(id="e\u0000"), {}, "'id' contains characters that cannot be stored",
                 id="id-nul"),
    pytest.param("hmac-sha256", _event(id="e\udc00"), {}, "'id' contains characters that cannot be stored",
                 id="id-lone-surrogate"),
    pytest.param("stripe", _event(type=MISSING), {}, "'type' is missing", id="type-missing"),
    pytest.param("stripe", _event(type=["t"]), {}, "'type' must be a string", id="type-a-list"),
    pytest.param("stripe", _event(type="t" * 65), {}, "'type' must be 1 to 64 characters", id="type-65"),
    pytest.param("hmac-sha256", _event(data=MISSING), {}, "'data' must be an object", id="data-missing"),
    pytest.param("hmac-sha256", _event(data=[1]), {}, "'data' must be an object", id="data-a-list"),
    pytest.param("hmac-sha256", _event(data="x"), {}, "'data' must be an object", id="data-a-string"),
    pytest.param("hmac-sha256", _event(data=None), {}, "'data' must be an object", id="data-null"),
    pytest.param("hmac-sha256", {}, {}, "'id' is missing", id="the-id-first"),
    pytest.param("standard-webhooks", OWN, {}, "the webhook-id header is missing", id="standard-webhooks-no-header"),
    pytest.param("standard-webhooks", _event(id=MISSING, data=MISSING), {"webhook-id": "msg_1"},
                 "'data' must be an object", id="standard-webhooks-data-missing"),
    pytest.param("github", PING, {"X-GitHub-Delivery": "d-1"}, "the X-GitHub-Event header is missing",
                 id="github-no-event-header"),
    pytest.param("github", PING, {"X-GitHub-Event": "ping"}, "the X-GitHub-Delivery header is missing",
                 id="github-no-delivery-header"),
    pytest.param("github", PING, {"X-GitHub-Event": "ping", "X-GitHub-Delivery": "d" * 256},
                 "the X-GitHub-Delivery header must be 1 to 255 characters", id="github-delivery-256"),
    pytest.param("github", PING, {"X-GitHub-Event": "e" * 65, "X-GitHub-Delivery": "d-1"},
                 "the X-GitHub-Event header must be 1 to 64 characters", id="github-event-65"),
    # Those headers are not signed: they never name a payment.
    pytest.param("github", OWN["data"], {**GITHUB_HEADERS, "X-GitHub-Event": "payment.succeeded"},
                 "a payment must name its type in the signed body, not in the X-GitHub-Event header",
                 id="github-a-payment-named-by-a-header"),
    pytest.param("github", PING, {**GITHUB_HEADERS, "X-GitHub-Event": "payment_intent.succeeded"},
                 "a payment must name its type in the signed body, not in the X-GitHub-Event header",
                 id="github-a-stripe-payment-named-by-a-header"),
])
def test_parse_refuses_an_event_without_its_id_type_or_data(scheme, document, headers, message):
    with pytest.raises(InvalidEventError) as refusal:
        parse(encode(document), scheme, headers)
    assert str(refusal.value) == message


# -- effect_of: this service's own types -------------------------------------------------------------------------

USD = Policy("usd")
PAID = {"paymentId": "pay_1", "userId": str(ALICE), "amountCents": 250}
REFUNDED = {"paymentId": "pay_1", "amountRefundedCents": 100}


def effect(event_type, data, policy=USD):
    return effect_of(parse(encode({"id": "evt_1", "type": event_type, "data": data})), policy)


def _paid(**fields):
    """PAID with fields changed; a field given MISSING is left out."""
    return {key: value for key, value in {**PAID, **fields}.items() if value is not MISSING}


@pytest.mark.parametrize("data, policy, expected", [
    pytest.param(PAID, USD, credit("pay_1", ALICE, 250, "usd"), id="the-ledgers-currency-implied"),
    pytest.param(_paid(currency="usd"), USD, credit("pay_1", ALICE, 250, "usd"), id="the-ledgers-currency-named"),
    pytest.param(_paid(currency="USD"), USD, credit("pay_1", ALICE, 250, "usd"), id="a-currency-in-capitals"),
    pytest.param(PAID, Policy("eur"), credit("pay_1", ALICE, 250, "eur"), id="implied-is-the-policys"),
    pytest.param(_paid(paymentId=MISSING), USD, credit("evt_1", ALICE, 250, "usd"),
                 id="no-payment-id-its-own-payment"),
    pytest.param(_paid(paymentId="p" * 255), USD, credit("p" * 255, ALICE, 250, "usd"), id="a-payment-id-of-255"),
    pytest.param(_paid(userId=str(ALICE).upper()), USD, credit("pay_1", ALICE, 250, "usd"), id="a-uuid-in-capitals"),
    pytest.param(_paid(userId=f"{{{ALICE}}}"), USD, credit("pay_1", ALICE, 250, "usd"), id="a-uuid-in-braces"),
    pytest.param(_paid(userId=ALICE.hex), USD, credit("pay_1", ALICE, 250, "usd"), id="a-uuid-without-hyphens"),
    pytest.param(_paid(amountCents=1), USD, credit("pay_1", ALICE, 1, "usd"), id="one-cent"),
    pytest.param(_paid(amountCents=MAX_CENTS), USD, credit("pay_1", ALICE, MAX_CENTS, "usd"), id="a-bigints-most"),
    # Refused by a setting: the effect that applies, and the setting that refuses it.
    pytest.param(_paid(currency="eur"), USD, refused_by(
        "LEDGER_CURRENCY", "data.currency must be the ledger's currency, 'usd'", credit("pay_1", ALICE, 250, "eur")),
                 id="a-currency-not-the-ledgers"),
])
def test_payment_succeeded_credits_its_user(data, policy, expected):
    assert seen(effect("payment.succeeded", data, policy)) == expected


CURRENCY = "data.currency must be a currency's three-letter code"
PAYMENT_ID = "data.paymentId must be a payment id of 1 to 255 characters"
USER = "data.userId must be a user's UUID or the application's key of one (1 to 255 characters)"
AMOUNT = "data.amountCents must be a positive integer"


@pytest.mark.parametrize("field, value, problem", [
    ("currency", None, CURRENCY), ("currency", "", CURRENCY), ("currency", "us", CURRENCY),
    ("currency", "dollars", CURRENCY), ("currency", 840, CURRENCY),
    ("paymentId", None, PAYMENT_ID), ("paymentId", "", PAYMENT_ID), ("paymentId", "p" * 256, PAYMENT_ID),
    ("paymentId", 42, PAYMENT_ID), ("paymentId", "pay\u0000", PAYMENT_ID),
    ("userId", MISSING, USER), ("userId", None, USER), ("userId", "", USER), ("userId", "u" * 256, USER),
    ("userId", True, USER), ("userId", 1.5, USER),
    ("amountCents", MISSING, AMOUNT), ("amountCents", None, AMOUNT), ("amountCents", 0, AMOUNT),
    ("amountCents", -5, AMOUNT), ("amountCents", 1.5, AMOUNT), ("amountCents", "250", AMOUNT),
    ("amountCents", True, AMOUNT),
    ("amountCents", MAX_CENTS + 1, "data.amountCents must be at most 9223372036854775807 (a balance's BIGINT)"),
])
def test_a_payment_its_shape_refuses_names_the_field(field, value, problem):
    assert seen(effect("payment.succeeded", _paid(**{field: value}))) == refused(problem)


@pytest.mark.parametrize("value, key", [("alice", "alice"), (7, "7"), ("4217", "4217")])
def test_a_user_that_is_not_a_uuid_is_the_applications_key_of_one(value, key):
    seen_ = seen(effect("payment.succeeded", _paid(userId=value)))
    assert (seen_["kind"], seen_["app_key"], "user_id" in seen_) == (Kind.CREDIT, key, False)


@pytest.mark.parametrize("data, policy, expected", [
    pytest.param(REFUNDED, USD, running_total("pay_1", 100, "usd"), id="the-ledgers-currency-implied"),
    pytest.param(REFUNDED, Policy("inr"), running_total("pay_1", 100, "inr"), id="implied-is-the-policys"),
    # A running total is in its payment's currency, which apply_event checks: no setting refuses it.
    pytest.param({**REFUNDED, "currency": "EUR"}, USD, running_total("pay_1", 100, "eur"), id="another-currency"),
    pytest.param({**REFUNDED, "userId": str(BOB)}, USD, running_total("pay_1", 100, "usd"),
                 id="a-user-is-its-payments-not-its-own"),
    pytest.param({"amountRefundedCents": 100}, USD,
                 refused("data.paymentId must be a payment id of 1 to 255 characters"), id="no-payment-id"),
    pytest.param({"paymentId": "pay_1"}, USD, refused("data.amountRefundedCents must be a positive integer"),
                 id="no-total"),
    pytest.param({**REFUNDED, "amountRefundedCents": 0}, USD,
                 refused("data.amountRefundedCents must be a positive integer"), id="a-total-of-zero"),
    pytest.param({**REFUNDED, "currency": None}, USD, refused("data.currency must be a currency's three-letter code"),
                 id="currency-null"),
])
def test_payment_refunded_is_its_payments_running_total(data, policy, expected):
    assert seen(effect("payment.refunded", data, policy)) == expected


@pytest.mark.parametrize("event_type, data", [
    ("payment.failed", PAID),
    ("invoice.paid", {"amount_paid": 250}),
    ("ping", {}),
])
def test_a_type_no_rule_knows_moves_nothing(event_type, data):
    assert seen(effect(event_type, data)) == NOTHING


# -- effect_of: refund.created and refund.failed, Stripe's names and Razorpay's -------------------------------------

def _stripe_refund_without(event_type, field):
    status = "failed" if event_type == "refund.failed" else "succeeded"
    evt = stripe_refund("re_1", "pi_1", 300, status=status, event_type=event_type)
    del evt.data.object[field]
    return str(evt).encode()


def _razorpay_refund_without(event_type, field):
    status = "failed" if event_type == "refund.failed" else "pending"
    document = razorpay_refund(event_type, "rfnd_1", "pay_1", 4000, status)
    del document["payload"]["refund"]["entity"][field]
    return encode(document)


# The 422 of a type both providers send names both providers' fields: Stripe's, and Razorpay's beside it.
BOTH = {"payment_intent": "payment_id", "amount": "amount", "currency": "currency", "id": "id"}
PROBLEM = {"payment_intent": "must be a payment id of 1 to 255 characters", "amount": "must be a positive integer",
           "currency": "must be a currency's three-letter code", "id": "must be an id of 1 to 255 characters"}


@pytest.mark.parametrize("event_type", ["refund.created", "refund.failed"])
@pytest.mark.parametrize("stripes", list(BOTH))
@pytest.mark.parametrize("provider", ["stripe", "razorpay"])
def test_a_refund_event_both_providers_send_names_both_fields_in_its_422(event_type, stripes, provider):
    body = _stripe_refund_without(event_type, stripes) if provider == "stripe" else \
        _razorpay_refund_without(event_type, BOTH[stripes])
    event = parse(body, provider, {"x-razorpay-event-id": "HQ9tqtn9mNxM5C"})
    assert seen(effect_of(event, Policy("inr"))) == refused(
        f"data.object.{stripes} (Stripe) or payload.refund.entity.{BOTH[stripes]} (Razorpay) {PROBLEM[stripes]}")


# The 422 of a status the provider does not send lists that provider's statuses: the provider whose shape it came in.
@pytest.mark.parametrize("event_type", ["refund.created", "refund.failed"])
@pytest.mark.parametrize("provider, statuses", [
    ("stripe", {"pending", "requires_action", "succeeded", "failed", "canceled"}),
    ("razorpay", {"pending", "processed", "failed"}),
])
def test_a_refund_status_of_a_type_both_providers_send_is_refused_naming_its_own_providers_statuses(
        event_type, provider, statuses):
    if provider == "stripe":
        evt = stripe_refund("re_1", "pi_1", 300, status="succeeded", event_type=event_type)
        evt.data.object["status"] = "reversed"
        body = str(evt).encode()
    else:
        document = razorpay_refund(event_type, "rfnd_1", "pay_1", 4000, "reversed")
        body = encode(document)
    event = parse(body, provider, {"x-razorpay-event-id": "HQ9tqtn9mNxM5C"})
    problem = seen(effect_of(event, Policy("inr")))["problem"]
    label, _, named = problem.partition(" must be one of ")
    assert (label, set(named.split(", "))) == (
        "data.object.status (Stripe) or payload.refund.entity.status (Razorpay)", statuses)


# -- what two deliveries of one event are compared by ---------------------------------------------------------------

def _sha256(event_type, data, policy=USD, indent=None):
    body = json.dumps({"id": "evt_1", "type": event_type, "data": data}, indent=indent).encode()
    return effect_of(parse(body), policy).sha256


@pytest.mark.parametrize("first, second", [
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", PAID, USD, 2), id="reserialised"),
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(userId=str(ALICE).upper())),
                 id="a-uuid-spelled-otherwise"),
    pytest.param(("payment.succeeded", _paid(currency="usd")), ("payment.succeeded", _paid(currency="USD")),
                 id="a-currency-in-capitals"),
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(currency="usd")),
                 id="the-ledgers-currency-implied-or-named"),
    pytest.param(("payment.succeeded", _paid(currency="eur"), USD), ("payment.succeeded", _paid(currency="eur"),
                                                                     Policy("eur")),
                 id="refused-by-a-setting-or-allowed"),
    pytest.param(("payment.succeeded", {**PAID, "note": "x"}), ("payment.succeeded", PAID),
                 id="a-field-no-rule-reads"),
    pytest.param(("ping", {"zen": "a"}), ("ping", {"zen": "b"}), id="a-type-that-moves-nothing"),
])
def test_the_same_effect_in_other_bytes_hashes_the_same(first, second):
    assert _sha256(*first) == _sha256(*second)


@pytest.mark.parametrize("first, second", [
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(amountCents=251)), id="another-amount"),
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(userId=str(BOB))), id="another-user"),
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(paymentId="pay_2")), id="another-payment"),
    pytest.param(("payment.succeeded", PAID), ("payment.refunded", PAID), id="another-type"),
    pytest.param(("payment.succeeded", PAID, USD), ("payment.succeeded", PAID, Policy("eur")),
                 id="implied-in-another-ledgers-currency"),
    # A value refused by its shape never compares equal to one that applies.
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", {**PAID, "currency": None}),
                 id="a-null-currency-or-none"),
    pytest.param(("payment.succeeded", PAID), ("payment.succeeded", _paid(amountCents=250.0)), id="a-float-amount"),
])
def test_another_effect_hashes_otherwise(first, second):
    assert _sha256(*first) != _sha256(*second)
