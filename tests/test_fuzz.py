"""Property-based: whatever bytes and headers arrive, never a 5xx, and an
unsigned body never writes a row."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import ALICE, event_rows, signed_headers

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=80)
content_types = st.one_of(st.sampled_from(["application/json", "application/json; charset=utf-8",
                                           "text/plain", "application/cloudevents+json", ""]), header_text)


@FUZZ
@given(body=st.binary(max_size=2048), signature=st.one_of(st.none(), header_text), content_type=content_types)
def test_unsigned_bytes_never_5xx_and_never_write(client, db, body, signature, content_type):
    headers = {"Content-Type": content_type}
    if signature is not None:
        headers["X-Signature"] = signature
    response = client.post("/api/webhooks", data=body, headers=headers)
    assert response.status_code in (400, 401, 413, 415), response.status_code
    assert response.is_json and "error" in response.json
    assert event_rows(db) == 0


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
    response = client.post("/api/webhooks", data=body, headers=signed_headers(body))
    assert response.status_code in (200, 400, 409, 422), (response.status_code, response.json)
    assert response.is_json


@FUZZ
@given(body=st.binary(max_size=512))
def test_signed_arbitrary_bytes_never_5xx(client, db, body):
    response = client.post("/api/webhooks", data=body, headers=signed_headers(body))
    assert response.status_code in (200, 400, 409, 422), (response.status_code, response.json)
