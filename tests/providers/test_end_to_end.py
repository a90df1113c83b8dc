"""Each provider end to end: deliveries signed by its own library, read in its
own event shape, and refused outside the replay window. Real PostgreSQL and Redis."""

import logging
import time
import uuid
from datetime import UTC, datetime

import pytest
import standardwebhooks
import stripe

from devservers import wait_until
from tests.helpers import (
    ALICE,
    BOB,
    SECRETS,
    UNKNOWN_USER,
    assert_ledger_consistent,
    balance,
    encode,
    event_rows,
    payment,
    record_currency,
    secret_for,
    send,
    signed_headers,
    stored_event_row,
)

pytestmark = pytest.mark.core

STRIPE = pytest.mark.parametrize("scheme", ["stripe"])
STANDARD_WEBHOOKS = pytest.mark.parametrize("scheme", ["standard-webhooks"])
GITHUB = pytest.mark.parametrize("scheme", ["github"])
TIMESTAMPED = pytest.mark.parametrize("scheme", ["stripe", "standard-webhooks"])


def stripe_event(event_id=None, user=ALICE, cents=250, livemode=True, **intent):
    """A payment_intent.succeeded event as Stripe sends it, trimmed around the fields the ledger reads."""
    payment_intent = {"id": "pi_3PtestIntent", "object": "payment_intent", "amount": cents,
                      "amount_received": cents, "currency": "usd", "status": "succeeded",
                      "metadata": {"user_id": str(user)}, **intent}
    return {"id": event_id or f"evt_{uuid.uuid4().hex[:24]}", "object": "event", "api_version": "2024-06-20",
            "type": "payment_intent.succeeded", "livemode": livemode, "data": {"object": payment_intent}}


def standard_event(user=ALICE, cents=250, event_type="payment.succeeded"):
    """The Standard Webhooks payload shape: type, timestamp, data; the id travels in webhook-id."""
    return {"type": event_type, "timestamp": "2024-05-01T12:00:00.000000Z",
            "data": {"userId": str(user), "amountCents": cents}}


def signed_by_the_provider(scheme, body, timestamp=None, msg_id=None):
    """Headers made by stripe-python or the standardwebhooks package, not by our signer."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    if scheme == "stripe":
        header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["stripe"], timestamp)
        return {"Content-Type": "application/json; charset=utf-8", "Stripe-Signature": header}
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    signature = standardwebhooks.Webhook(SECRETS["standard-webhooks"]).sign(msg_id, signed_at, body.decode())
    return {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


# -- stripe ---------------------------------------------------------------------

@STRIPE
def test_stripe_payment_intent_signed_by_stripe_python_credits_once(client, db, scheme):
    event = stripe_event(user=BOB, cents=4200)
    body = encode(event)
    assert send(client, body, signed_by_the_provider(scheme, body)).json == {
        "status": "processed", "event_id": event["id"]}
    assert send(client, body, signed_by_the_provider(scheme, body)).json["status"] == "duplicate"
    assert balance(db, BOB) == 4200
    stored = stored_event_row(db, event["id"])
    assert stored.event_type == "payment_intent.succeeded" and stored.status == "completed" and stored.attempts == 1
    assert_ledger_consistent(db)


INTENTS_THAT_CANNOT_APPLY = pytest.mark.parametrize("intent, reason", [
    ({"metadata": {}}, "data.object.metadata.user_id"),
    ({"metadata": {"user_id": str(UNKNOWN_USER)}}, "unknown user"),
    ({"amount_received": 0}, "data.object.amount_received"),
    ({"amount_received": "4200"}, "data.object.amount_received"),
])


def _send_an_intent_that_cannot_apply(client, scheme, intent):
    """evt_bad_intent, its payment intent changed by intent, signed by stripe-python."""
    body = encode(stripe_event("evt_bad_intent", **intent))
    return send(client, body, signed_by_the_provider(scheme, body))


@STRIPE
@INTENTS_THAT_CANNOT_APPLY
def test_a_stripe_payment_intent_that_cannot_apply_is_422_naming_its_reason(client, db, scheme, intent, reason):
    response = _send_an_intent_that_cannot_apply(client, scheme, intent)
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert reason in response.json["message"]


@STRIPE
@INTENTS_THAT_CANNOT_APPLY
def test_a_stripe_payment_intent_that_cannot_apply_is_recorded_failed_without_a_credit(
        client, db, scheme, intent, reason):
    _send_an_intent_that_cannot_apply(client, scheme, intent)
    stored = stored_event_row(db, "evt_bad_intent")
    assert stored.status == "failed" and stored.attempts == 1
    assert (balance(db, ALICE), balance(db, BOB)) == (1000, 0)


@STRIPE
def test_a_failed_stripe_payment_retried_with_changed_pending_webhooks_is_processed_once_the_user_exists(
        client, db, scheme):
    event = {**stripe_event("evt_retried_by_stripe", user=UNKNOWN_USER, cents=900), "pending_webhooks": 1}
    first = encode(event)
    assert send(client, first, signed_by_the_provider(scheme, first)).status == 422
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    # Stripe's next attempt: the Event as its API serialises it, pending_webhooks changed.
    for pending in (2, 3):
        retried = str(stripe.Event.construct_from({**event, "pending_webhooks": pending}, "sk_test")).encode()
        assert retried != first
        answer = send(client, retried, signed_by_the_provider(scheme, retried))
        assert answer.json["status"] == ("processed" if pending == 2 else "duplicate")
    assert balance(db, UNKNOWN_USER) == 900
    stored = stored_event_row(db, "evt_retried_by_stripe")
    assert stored.status == "completed" and stored.attempts == 2


@STRIPE
@pytest.mark.parametrize("event, setting, reason", [
    (stripe_event("evt_yen", currency="jpy"), {}, "data.object.currency must be the ledger's currency, 'usd'"),
    (stripe_event("evt_test_mode", livemode=False), {}, "a test-mode event (livemode is not true)"),
    (stripe_event("evt_euro", currency="eur"), {"LEDGER_CURRENCY": "JPY"}, "currency, 'jpy'"),
])
def test_stripe_payment_in_another_currency_or_test_mode_is_422(make_app, config, db, scheme, event, setting, reason):
    record_currency(db, setting.get("LEDGER_CURRENCY", "usd"))
    client = make_app({**config, **setting}).test_client()
    body = encode(event)
    response = send(client, body, signed_by_the_provider(scheme, body))
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert reason in response.json["message"]
    assert (balance(db, ALICE), balance(db, BOB)) == (1000, 0)


@STRIPE
@pytest.mark.parametrize("settings, fields", [
    pytest.param({"STRIPE_ACCEPT_TEST_EVENTS": "true"}, {"livemode": False}, id="test-mode"),
    pytest.param({"LEDGER_CURRENCY": "EUR"}, {"currency": "eur"}, id="another-ledger-currency"),
    pytest.param({"STRIPE_ACCEPT_TEST_EVENTS": "true", "LEDGER_CURRENCY": "EUR"},
                 {"livemode": False, "currency": "eur"}, id="both"),
])
def test_a_stripe_payment_refused_by_default_credits_under_the_setting_that_allows_it(
        make_app, config, db, scheme, settings, fields):
    record_currency(db, settings.get("LEDGER_CURRENCY", "usd"))
    client = make_app({**config, **settings}).test_client()
    body = encode(stripe_event("evt_test_euro", user=BOB, cents=300, **fields))
    assert send(client, body, signed_by_the_provider(scheme, body)).json["status"] == "processed"
    assert balance(db, BOB) == 300


@pytest.mark.parametrize("currency, status", [("eur", 422), ("USD", 200), (7, 422)])
def test_a_payment_in_the_services_own_shape_naming_a_currency_must_name_the_ledgers(client, db, currency, status):
    response = send(client, payment("evt_currency", cents=10, currency=currency))
    assert response.status == status
    assert balance(db) == (1010 if status == 200 else 1000)


# -- standard-webhooks ----------------------------------------------------------

@STANDARD_WEBHOOKS
def test_standard_webhooks_delivery_signed_by_the_package_credits_once(client, db, scheme):
    body = encode(standard_event(cents=75))
    first = send(client, body, signed_by_the_provider(scheme, body, msg_id="msg_2b3c4d"))
    assert first.json == {"status": "processed", "event_id": "msg_2b3c4d"}
    # A sender's retry: same message id, a new timestamp and signature.
    retry = send(client, body, signed_by_the_provider(scheme, body, int(time.time()) + 1, msg_id="msg_2b3c4d"))
    assert retry.json == {"status": "duplicate", "event_id": "msg_2b3c4d"}
    assert balance(db) == 1075
    stored = stored_event_row(db, "msg_2b3c4d")
    assert stored.event_type == "payment.succeeded" and stored.status == "completed" and stored.attempts == 1


@STANDARD_WEBHOOKS
def test_standard_webhooks_event_id_is_the_signed_header_not_the_body(client, db, scheme):
    body = encode({"id": "evt_in_body", **standard_event(cents=5)})
    assert send(client, body, signed_by_the_provider(scheme, body, msg_id="msg_a")).json["event_id"] == "msg_a"
    assert send(client, body, signed_by_the_provider(scheme, body, msg_id="msg_b")).json["event_id"] == "msg_b"
    assert event_rows(db) == 2 and stored_event_row(db, "evt_in_body") is None


@STANDARD_WEBHOOKS
@pytest.mark.parametrize("document, error", [
    ({"timestamp": "2024-05-01T12:00:00Z", "data": {}}, "invalid_event"),
    ({"type": "payment.succeeded", "data": [1]}, "invalid_event"),
    ([standard_event()], "invalid_json"),
])
def test_standard_webhooks_body_must_still_have_type_and_data(client, db, scheme, document, error):
    body = encode(document)
    response = send(client, body, signed_by_the_provider(scheme, body))
    assert (response.status, response.json["error"]) == (400, error)
    assert event_rows(db) == 0


# -- github -----------------------------------------------------------------------

PING = {"zen": "Design for failure.", "hook_id": 109948940,
        "hook": {"type": "Repository", "id": 109948940, "events": ["*"], "active": True}}


def _deliver_ping_twice(client, scheme):
    """GitHub's ping, delivered and redelivered under one X-GitHub-Delivery: its id, and the two answers."""
    body, delivery = encode(PING), str(uuid.uuid4())
    headers = signed_headers(body, scheme=scheme, event_id=delivery, github_event="ping")
    return delivery, [send(client, body, headers) for _ in range(2)]


@GITHUB
def test_a_github_event_is_stored_under_the_id_and_type_its_headers_give(client, db, scheme):
    delivery, (first, redelivery) = _deliver_ping_twice(client, scheme)
    assert first.json == {"status": "processed", "event_id": delivery}
    assert redelivery.json == {"status": "duplicate", "event_id": delivery}
    stored = stored_event_row(db, delivery)
    assert stored.event_type == "ping" and stored.status == "completed" and stored.attempts == 1
    assert db.execute("SELECT payload->>'zen' FROM webhook_events_json").fetchone()[0] == "Design for failure."


@GITHUB
def test_a_github_event_without_a_type_in_its_body_moves_no_money(client, db, scheme):
    _deliver_ping_twice(client, scheme)
    assert (balance(db, ALICE), balance(db, BOB)) == (1000, 0)


@GITHUB
def test_github_event_in_the_services_own_shape_replayed_under_a_new_delivery_id_is_a_duplicate(client, db, scheme):
    # X-GitHub-Delivery is not signed; a body that has its own id keeps it.
    body = encode(payment("evt_gh_1", cents=10))
    assert send(client, body, signed_headers(body, scheme=scheme, event_id=str(uuid.uuid4()))).json == {
        "status": "processed", "event_id": "evt_gh_1"}
    assert send(client, body, signed_headers(body, scheme=scheme, event_id=str(uuid.uuid4()))).json == {
        "status": "duplicate", "event_id": "evt_gh_1"}
    assert balance(db) == 1010


@GITHUB
@pytest.mark.parametrize("change, document, message", [
    ({"X-GitHub-Delivery": None}, PING, "X-GitHub-Delivery header is missing"),
    ({"X-GitHub-Delivery": "d" * 256}, PING, "X-GitHub-Delivery header must be 1 to 255"),
    ({"X-GitHub-Event": None}, PING, "X-GitHub-Event header is missing"),
    ({"X-GitHub-Event": "e" * 65}, PING, "X-GitHub-Event header must be 1 to 64"),
    # Unsigned headers cannot turn an authentic body into a payment.
    ({"X-GitHub-Event": "payment.succeeded"}, {"userId": str(ALICE), "amountCents": 9}, "signed body"),
    ({"X-GitHub-Event": "payment_intent.succeeded"}, PING, "signed body"),
])
def test_github_headers_that_cannot_name_the_event_are_400(client, db, scheme, change, document, message):
    body = encode(document)
    headers = signed_headers(body, scheme=scheme, event_id=str(uuid.uuid4()))
    headers.update({k: v for k, v in change.items() if v is not None})
    for name in (k for k, v in change.items() if v is None):
        del headers[name]
    response = send(client, body, headers)
    assert (response.status, response.json["error"]) == (400, "invalid_event")
    assert message in response.json["message"]
    assert event_rows(db) == 0 and balance(db) == 1000


@GITHUB
def test_github_documented_example_passes_the_signature_check(make_app, config, db, scheme):
    client = make_app({**config, "WEBHOOK_SECRET": "It's a Secret to Everybody"}).test_client()
    header = {"Content-Type": "application/json",
              "X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}
    # Authentic, but not JSON: 400 after the signature check, not 401.
    assert send(client, b"Hello, World!", header).json["error"] == "invalid_json"
    assert send(client, b"Hello, World?", header).json["error"] == "invalid_signature"


# -- every scheme: malformed headers, rotation ------------------------------------

@pytest.mark.parametrize("scheme, headers, message", [
    ("hmac-sha256", {"X-Signature": "sha256=abc"}, "malformed X-Signature header"),
    ("stripe", {"X-Signature": "0" * 64}, "missing Stripe-Signature header"),
    ("stripe", {"Stripe-Signature": "v1=" + "0" * 64}, "malformed Stripe-Signature header"),
    ("stripe", {"Stripe-Signature": "t=9" + "9" * 4000 + ",v1=" + "0" * 64}, "in Unix seconds"),
    ("standard-webhooks", {"webhook-id": "msg_1", "webhook-timestamp": "1", "webhook-signature": "v1,=="},
     "malformed webhook-signature header"),
    ("standard-webhooks", {"webhook-id": "m" * 256, "webhook-timestamp": "1",
                           "webhook-signature": "v1," + "A" * 43 + "="}, "malformed webhook-id header"),
    ("github", {"X-Hub-Signature-256": "sha1=" + "0" * 40}, "malformed X-Hub-Signature-256 header"),
    ("github", {"X-Signature": "0" * 64}, "missing X-Hub-Signature-256 header"),
])
def test_malformed_signature_headers_are_401_in_general_terms(client, db, scheme, headers, message):
    response = send(client, encode(payment()), {"Content-Type": "application/json", **headers})
    assert (response.status, response.json["error"]) == (401, "invalid_signature")
    assert message in response.json["message"]
    assert event_rows(db) == 0


@TIMESTAMPED
def test_rotation_both_signatures_in_one_header(make_app, config, db, scheme, caplog):
    new, old = secret_for(scheme, "new-secret-0123456789"), secret_for(scheme, "old-secret-0123456789")
    client = make_app({**config, "WEBHOOK_SECRET": f"{new},{old}"}).test_client()
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        assert send(client, payment(cents=1), secret=[old, new]).json["status"] == "processed"
    assert [r.secret_index for r in caplog.records if r.getMessage() == "delivery"] == [0]
    assert balance(db) == 1001


# -- the replay window -------------------------------------------------------------

OUTSIDE_THE_WINDOW = pytest.mark.parametrize("offset, message", [(-360, "too old"), (360, "too far in the future")])


def _send_signed_at(client, scheme, offset):
    """A payment signed by the provider offset seconds from now."""
    body = encode(payment("evt_captured"))
    return send(client, body, signed_by_the_provider(scheme, body, int(time.time()) + offset))


@TIMESTAMPED
@OUTSIDE_THE_WINDOW
def test_a_delivery_signed_outside_the_window_is_401_naming_which_side(client, db, scheme, offset, message):
    response = _send_signed_at(client, scheme, offset)
    assert (response.status, response.json["error"]) == (401, "invalid_signature")
    assert message in response.json["message"]


@TIMESTAMPED
@OUTSIDE_THE_WINDOW
def test_a_delivery_signed_outside_the_window_writes_nothing(client, db, scheme, offset, message):
    _send_signed_at(client, scheme, offset)
    assert event_rows(db) == 0 and balance(db) == 1000


@TIMESTAMPED
def test_a_captured_delivery_replayed_after_the_window_is_refused(make_app, config, db, scheme):
    """Refused as every bad signature is: 401, and its stored row untouched. One test, not two: each waits out
    the window."""
    tolerance = 3
    client = make_app({**config, "WEBHOOK_TOLERANCE_SECONDS": tolerance}).test_client()
    body = encode(payment("evt_replayed", user=UNKNOWN_USER))  # fails, so every accepted delivery writes
    signed_at = int(time.time())
    captured = signed_by_the_provider(scheme, body, signed_at, msg_id="evt_replayed")
    assert send(client, body, captured).status == 422
    assert send(client, body, captured).status == 422  # inside the window: a retry, recorded
    before = stored_event_row(db, "evt_replayed")
    assert before.status == "failed" and before.attempts == 2
    wait_until(lambda: time.time() > signed_at + tolerance + 0.5, timeout=10, what="the window to pass")
    replay = send(client, body, captured)
    assert (replay.status, replay.json["error"]) == (401, "invalid_signature")
    assert "too old" in replay.json["message"]
    assert stored_event_row(db, "evt_replayed") == before  # attempts, updated_at, every column untouched
