"""Property-based: whatever bytes and headers arrive, never a 5xx, and an
unsigned body never writes a row."""

import base64
import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import ALICE, EVERY_SCHEME, event_rows, send, signed_headers

pytestmark = pytest.mark.core

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# What an HTTP header can carry: Latin-1 text without control characters.
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=80)
content_types = st.one_of(st.sampled_from(["application/json", "application/json; charset=utf-8",
                                           "text/plain", "application/cloudevents+json", ""]), header_text)
hex64 = st.binary(min_size=32, max_size=32).map(bytes.hex)
unix_seconds = st.integers(0, 2**40).map(str)
# Each scheme's headers: arbitrary text, or text shaped like the real thing.
SIGNATURE_HEADERS = {
    "hmac-sha256": {"X-Signature": hex64},
    "stripe": {"Stripe-Signature": st.builds("t={},v1={}".format, unix_seconds, hex64)},
    "standard-webhooks": {"webhook-id": st.just("msg_1"), "webhook-timestamp": unix_seconds,
                          "webhook-signature": st.binary(min_size=32, max_size=32).map(
                              lambda b: "v1," + base64.b64encode(b).decode())},
    "github": {"X-Hub-Signature-256": hex64.map("sha256={}".format),
               "X-GitHub-Delivery": st.uuids().map(str), "X-GitHub-Event": st.just("ping")},
    "razorpay": {"X-Razorpay-Signature": hex64, "x-razorpay-event-id": st.uuids().map(str)},
}


def _send_unsigned(client, scheme, data, body, content_type):
    """body with the content type and any of the scheme's signature headers, each arbitrary or shaped."""
    headers = data.draw(st.fixed_dictionaries({}, optional={
        name: st.one_of(header_text, shaped) for name, shaped in SIGNATURE_HEADERS[scheme].items()}))
    return send(client, body, {"Content-Type": content_type, **headers})


unsigned = given(data=st.data(), body=st.binary(max_size=2048), content_type=content_types)


@EVERY_SCHEME
@FUZZ
@unsigned
def test_unsigned_bytes_never_5xx(client, db, scheme, data, body, content_type):
    response = _send_unsigned(client, scheme, data, body, content_type)
    assert response.status in (400, 401, 413, 415), response.status
    assert response.headers["Content-Type"] == "application/json" and "error" in response.json


@EVERY_SCHEME
@FUZZ
@unsigned
def test_unsigned_bytes_never_write(client, db, scheme, data, body, content_type):
    _send_unsigned(client, scheme, data, body, content_type)
    assert event_rows(db) == 0


@pytest.mark.parametrize("scheme", ["standard-webhooks", "github", "razorpay"])
@FUZZ
@given(data=st.data())
def test_arbitrary_event_id_headers_never_5xx(client, db, scheme, data):
    """webhook-id, X-GitHub-Delivery and X-GitHub-Event become the event's id and type; x-razorpay-event-id its id
    with the body's digest after it (app/intake/events.py)."""
    body = json.dumps({"hook_id": 1} if scheme == "github" else
                      {"event": "t", "payload": {}} if scheme == "razorpay" else
                      {"type": "t", "data": {}}).encode()
    event_id = data.draw(header_text.filter(bool))
    headers = signed_headers(body, scheme=scheme, event_id=event_id, github_event=data.draw(header_text))
    response = send(client, body, headers)
    # 409: an id drawn again with another X-GitHub-Event is the same event with another type (effect).
    assert response.status in (200, 400, 401, 409), (response.status, response.json)
    assert response.headers["Content-Type"] == "application/json"
    if response.status == 409:
        assert response.json["error"] == "payload_mismatch"
    if response.status == 200:
        digest = "." + hashlib.sha256(body).hexdigest()[:32] if scheme == "razorpay" else ""
        assert response.json["event_id"] == event_id + digest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
events = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.text(max_size=140), json_values),
    "type": st.one_of(st.sampled_from(["payment.succeeded", "other"]), st.text(max_size=70), json_values),
    "data": st.one_of(json_values, st.fixed_dictionaries({}, optional={
        "userId": st.one_of(st.just(str(ALICE)), st.uuids().map(str), json_values),
        "amountCents": st.one_of(st.integers(), json_values),
    })),
})


@FUZZ
@given(event=events)
def test_signed_arbitrary_events_never_5xx(client, db, event):
    body = json.dumps(event).encode()
    response = send(client, body)
    assert response.status in (200, 400, 409, 422), (response.status, response.json)
    assert response.headers["Content-Type"] == "application/json"


@FUZZ
@given(body=st.binary(max_size=512))
def test_signed_arbitrary_bytes_never_5xx(client, db, body):
    response = send(client, body)
    assert response.status in (200, 400, 409, 422), (response.status, response.json)
