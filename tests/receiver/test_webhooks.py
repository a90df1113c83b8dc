"""POST /api/webhooks: every row of docs/design.md's answers table."""

import json
import logging

import pytest

from app import __version__
from app.locking.lock import lock_key
from tests.helpers import (
    ALICE,
    BOB,
    EVERY_SCHEME,
    SECRET,
    UNKNOWN_USER,
    balance,
    encode,
    event_rows,
    http_request,
    payment,
    scrape,
    secret_for,
    send,
    signed_headers,
    signing_key,
    source_secret,
    sources_config,
    stored_event_row,
)

pytestmark = pytest.mark.core


@EVERY_SCHEME
def test_a_new_event_is_answered_processed(client, db, scheme):
    event = payment(cents=250)
    response = send(client, event)
    assert response.status == 200
    assert response.json == {"status": "processed", "event_id": event["id"]}


@EVERY_SCHEME
def test_a_new_event_is_committed_with_its_credit(client, db, scheme):
    event = payment(cents=250)
    send(client, event)
    assert balance(db) == 1250
    stored = stored_event_row(db, event["id"])
    assert stored.status == "completed" and stored.attempts == 1 and stored.event_type == "payment.succeeded"


def _deliver_twice(client, event):
    """The first delivery (processed) and the answer to the second, sent after it."""
    assert send(client, event).json["status"] == "processed"
    return send(client, event)


@EVERY_SCHEME
def test_a_sequential_duplicate_is_answered_duplicate(client, db, scheme):
    event = payment(cents=300)
    second = _deliver_twice(client, event)
    assert second.status == 200
    assert second.json == {"status": "duplicate", "event_id": event["id"]}


@EVERY_SCHEME
def test_a_sequential_duplicate_credits_once(client, db, scheme):
    _deliver_twice(client, payment(cents=300))
    assert balance(db) == 1300
    assert event_rows(db) == 1


@EVERY_SCHEME
def test_other_event_types_are_stored_without_effect(client, db, scheme):
    event = {"id": "evt_refund_1", "type": "customer.created", "data": {"userId": str(ALICE)}}
    assert send(client, event).json == {"status": "processed", "event_id": "evt_refund_1"}
    assert balance(db) == 1000
    assert db.execute("SELECT status FROM webhook_events").fetchone()[0] == "completed"


def _rotating(make_app, config, scheme):
    """A client whose WEBHOOK_SECRET is a new and an old secret, and the (new, old, retired) secrets."""
    new, old, retired = (secret_for(scheme, f"{name}-secret-0123456789") for name in ("new", "old", "retired"))
    return make_app({**config, "WEBHOOK_SECRET": f"{new}, {old}"}).test_client(), (new, old, retired)


@EVERY_SCHEME
def test_any_rotated_secret_verifies(make_app, config, db, scheme):
    client, (new, old, retired) = _rotating(make_app, config, scheme)
    assert send(client, payment(), secret=old).status == 200
    assert send(client, payment(), secret=new).status == 200
    assert send(client, payment(), secret=retired).status == 401


@EVERY_SCHEME
def test_the_delivery_line_names_the_secret_by_its_index_never_its_value(make_app, config, db, scheme, caplog):
    client, (new, old, retired) = _rotating(make_app, config, scheme)
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        for secret in (old, new, retired):
            send(client, payment(), secret=secret)
    deliveries = [r for r in caplog.records if r.getMessage() == "delivery"]
    assert [r.secret_index for r in deliveries] == [1, 0, None]
    logged = caplog.text + " ".join(str(vars(r)) for r in caplog.records)
    for secret in (new, old):
        assert secret not in logged
        assert signing_key(secret, scheme).decode() not in logged


def test_digits_only_secret_stays_a_string(make_app, config, db):
    client = make_app({**config, "WEBHOOK_SECRET": "0012345678901234567"}).test_client()
    assert send(client, payment(), secret="0012345678901234567").status == 200


GOOD = encode(payment("evt_good"))
SIG = signed_headers(GOOD)["X-Signature"]


BAD_SIGNATURES = [
    (None, "missing"),
    ("", "empty"),
    (SIG[:-2], "truncated"),
    (SIG[:-1] + "g", "non-hex"),
    ("zz" * 32, "non-hex, right length"),
    (SIG + "00", "too long"),
    ("0" * 64, "wrong digest"),
    ("é" * 64, "non-ascii"),
]


def _bad_signature_headers(signature):
    """GOOD's headers with signature as its X-Signature (None: no X-Signature at all)."""
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["X-Signature"] = signature
    return headers


@pytest.mark.parametrize("signature, why", BAD_SIGNATURES)
def test_a_bad_signature_is_401_invalid_signature(client, db, signature, why):
    response = send(client, GOOD, _bad_signature_headers(signature))
    assert response.status == 401, why
    assert response.json["error"] == "invalid_signature"


def test_signature_over_reserialized_json_is_rejected(client, db):
    event = payment("evt_reserialized")
    signed_over = json.dumps(event, separators=(",", ":")).encode()
    sent = json.dumps(event, indent=2).encode()
    headers = {**signed_headers(signed_over), "Content-Type": "application/json"}
    response = send(client, sent, headers)
    assert response.status == 401
    assert event_rows(db) == 0


def test_signature_with_wrong_secret_is_rejected(client, db):
    response = send(client, payment(), secret="not-the-secret")
    assert response.status == 401
    assert response.json["error"] == "invalid_signature"
    assert event_rows(db) == 0


MALFORMED_BODIES = [
    (b"", "invalid_json"),
    (b"not json", "invalid_json"),
    (b"\xff\xfe{}", "invalid_json"),                       # invalid UTF-8
    ('{"id": "caf\u00e9"}'.encode("latin-1"), "invalid_json"),  # latin-1, not UTF-8
    (b"[1, 2]", "invalid_json"),
    (b'"a string"', "invalid_json"),
    (b"null", "invalid_json"),
    (b'{"id": "e", "type": "t", "data": {"x": NaN}}', "invalid_json"),
    (b"[" * 100000 + b"]" * 100000, "invalid_json"),       # nested too deeply
    (b'{"type": "t", "data": {}}', "invalid_event"),        # id missing
    (b'{"id": 42, "type": "t", "data": {}}', "invalid_event"),
    (b'{"id": "", "type": "t", "data": {}}', "invalid_event"),
    (b'{"id": "e", "data": {}}', "invalid_event"),          # type missing
    (b'{"id": "e", "type": ["t"], "data": {}}', "invalid_event"),
    (b'{"id": "e", "type": "t"}', "invalid_event"),         # data missing
    (b'{"id": "e", "type": "t", "data": [1]}', "invalid_event"),
    (b'{"id": "e", "type": "t", "data": "x"}', "invalid_event"),
    (b'{"id": "e\\u0000", "type": "t", "data": {}}', "invalid_event"),
    (b'{"id": "e\\udc00", "type": "t", "data": {}}', "invalid_event"),
    (json.dumps({"id": "e" * 256, "type": "t", "data": {}}).encode(), "invalid_event"),
    (json.dumps({"id": "e", "type": "t" * 65, "data": {}}).encode(), "invalid_event"),
]


@pytest.mark.parametrize("body, error", MALFORMED_BODIES)
def test_a_malformed_body_is_400_naming_its_error(client, db, body, error):
    response = send(client, body)
    assert response.status == 400
    assert response.json["error"] == error
    assert response.json["message"]


def test_id_of_255_characters_is_accepted(client, db):
    assert send(client, payment("e" * 255, paymentId=None)).status == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None,
                                          "multipart/form-data; boundary=x"])
def test_non_json_content_type_is_415(client, db, content_type):
    body = encode(payment())
    headers = signed_headers(body)
    headers.pop("Content-Type")
    if content_type:
        headers["Content-Type"] = content_type
    response = send(client, body, headers)
    assert response.status == 415
    assert response.json["error"] == "unsupported_media_type"
    assert event_rows(db) == 0


def test_json_with_charset_is_accepted(client, db):
    body = encode(payment())
    response = send(client, body, signed_headers(body, content_type="application/json; charset=utf-8"))
    assert response.status == 200


SMALL_LIMIT = {"MAX_BODY_BYTES": 1024}
OVER_LIMIT = encode(payment(padding="x" * 2000))


def test_a_body_over_the_limit_is_413(make_app, config, db):
    client = make_app({**config, **SMALL_LIMIT}).test_client()
    response = send(client, OVER_LIMIT)
    assert response.status == 413
    assert response.json == {"error": "too_large", "message": "the body is larger than 1024 bytes (MAX_BODY_BYTES)"}


# Each refusal above, as it is sent: the settings over the config fixture's, the body, and the headers (None:
# signed by the source's scheme).
REFUSED = [
    *[pytest.param({}, GOOD, _bad_signature_headers(signature), id=f"401-{why}") for signature, why in BAD_SIGNATURES],
    *[pytest.param({}, body, None, id=f"400-{n}-{error}") for n, (body, error) in enumerate(MALFORMED_BODIES)],
    pytest.param(SMALL_LIMIT, OVER_LIMIT, None, id="413-too_large"),
]


@pytest.mark.parametrize("settings, body, headers", REFUSED)
def test_a_refused_delivery_writes_nothing(make_app, config, db, settings, body, headers):
    client = make_app({**config, **settings}).test_client()
    send(client, body, headers)
    assert event_rows(db) == 0
    assert balance(db) == 1000


UNPROCESSABLE = [
    ({"userId": str(UNKNOWN_USER), "amountCents": 100}, "unknown user"),
    # Not a UUID: the application's key of a user (user_keys), which no user has here.
    ({"userId": "not-a-uuid", "amountCents": 100}, "no user has the application's key not-a-uuid"),
    ({"userId": 7, "amountCents": 100}, "no user has the application's key 7"),
    ({"userId": True, "amountCents": 100}, "userId"),
    ({"userId": "k" * 256, "amountCents": 100}, "userId"),
    ({"amountCents": 100}, "userId"),
    ({"userId": str(BOB), "amountCents": 0}, "amountCents"),
    ({"userId": str(BOB), "amountCents": -5}, "amountCents"),
    ({"userId": str(BOB), "amountCents": 1.5}, "amountCents"),
    ({"userId": str(BOB), "amountCents": "100"}, "amountCents"),
    ({"userId": str(BOB), "amountCents": True}, "amountCents"),
    ({"userId": str(BOB), "amountCents": 2**63}, "amountCents must be at most 9223372036854775807"),
    ({"userId": str(BOB)}, "amountCents"),
]


def _send_unprocessable(client, data):
    """A payment.succeeded carrying data, which cannot apply."""
    return send(client, {"id": "evt_bad_payment", "type": "payment.succeeded", "data": data})


@pytest.mark.parametrize("data, reason", UNPROCESSABLE)
def test_an_unprocessable_payment_is_422_naming_its_reason(client, db, data, reason):
    response = _send_unprocessable(client, data)
    assert response.status == 422
    assert response.json["error"] == "unprocessable"
    assert reason in response.json["message"]


@pytest.mark.parametrize("data, reason", UNPROCESSABLE)
def test_an_unprocessable_payment_is_recorded_failed_without_a_credit(client, db, data, reason):
    _send_unprocessable(client, data)
    assert (balance(db, ALICE), balance(db, BOB)) == (1000, 0)
    stored = stored_event_row(db, "evt_bad_payment")
    assert stored.status == "failed" and stored.attempts == 1
    assert reason in stored.last_error


def test_credit_that_would_overflow_is_422(client, db):
    db.execute("UPDATE user_balances SET balance_cents = %s WHERE user_id = %s", [2**63 - 10, BOB])
    response = send(client, payment("evt_overflow", user=BOB, cents=11))
    assert response.status == 422
    assert "overflow" in response.json["message"]
    assert balance(db, BOB) == 2**63 - 10


@EVERY_SCHEME
def test_failed_event_is_processed_normally_by_a_later_delivery(client, db, scheme):
    event = payment("evt_early", user=UNKNOWN_USER, cents=700)
    assert send(client, event).status == 422
    assert send(client, event).status == 422
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    response = send(client, event)
    assert response.json == {"status": "processed", "event_id": "evt_early"}
    assert send(client, event).json["status"] == "duplicate"
    assert balance(db, UNKNOWN_USER) == 700
    stored = stored_event_row(db, "evt_early")
    assert stored.status == "completed" and stored.attempts == 3
    # The attempts stay countable; last_error is why it is failed, and it is not any more.
    assert stored.last_error is None and stored.completed_at is not None


@EVERY_SCHEME
def test_twin_of_a_delivery_in_progress_is_409_with_retry_after(client, db, redis_client, scheme):
    event = payment("evt_busy")
    redis_client.set(lock_key("evt_busy"), "held-by-a-twin", px=10000)
    response = send(client, event)
    assert response.status == 409
    assert response.json["status"] == "in_progress"
    assert response.json["event_id"] == "evt_busy"
    assert int(response.headers["Retry-After"]) >= 1
    assert event_rows(db) == 0
    assert redis_client.get(lock_key("evt_busy")) == b"held-by-a-twin"


@EVERY_SCHEME
def test_lock_is_released_after_processing(client, db, redis_client, scheme):
    send(client, payment("evt_release"))
    assert redis_client.exists(lock_key("evt_release")) == 0


@pytest.mark.parametrize("method, path, status, error", [
    ("get", "/api/webhooks", 405, "method_not_allowed"),
    ("post", "/nowhere", 404, "not_found"),
])
def test_other_routes_answer_json(client, method, path, status, error):
    response = getattr(client, method)(path)
    assert response.status_code == status
    assert response.json["error"] == error


@pytest.mark.unit
def test_health_touches_no_dependency(make_app):
    app = make_app({"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
                    "REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SECRET": SECRET})
    response = app.test_client().get("/health")
    assert (response.status_code, response.json) == (200, {"status": "ok", "version": __version__})


def test_ready_reports_postgres_and_redis(client):
    response = client.get("/ready")
    assert (response.status_code, response.json) == (200, {"status": "ok", "postgres": "ok", "redis": "ok"})


JSONB_REFUSES = pytest.mark.parametrize("value", [
    b'"\\u0000"',                  # jsonb refuses NUL
    b'"\\ud800"',                  # a lone surrogate escape
    b"1e1000000",                  # a number beyond numeric's range
], ids=["nul", "lone-surrogate", "beyond-numeric"])


def _payment_holding(value):
    """An authentic payment's bytes with value in its data: valid JSON that jsonb cannot hold."""
    return (b'{"id": "evt_jsonb", "type": "payment.succeeded", "data": {"userId": "%s", "amountCents": 250, '
            b'"note": %s}}' % (str(ALICE).encode(), value))


@JSONB_REFUSES
def test_an_authentic_payment_that_jsonb_cannot_hold_is_credited_once(client, db, value):
    body = _payment_holding(value)
    assert send(client, body).json == {"status": "processed", "event_id": "evt_jsonb"}
    assert balance(db) == 1250
    assert send(client, body).json["status"] == "duplicate"
    assert balance(db) == 1250


@JSONB_REFUSES
def test_an_authentic_payment_that_jsonb_cannot_hold_is_stored_as_its_bytes(client, db, value):
    body = _payment_holding(value)
    send(client, body)
    # The bytes are the event of record; the jsonb view, for querying only, has no value for them.
    stored = stored_event_row(db, "evt_jsonb")
    assert stored.status == "completed" and stored.body == body
    assert db.execute("SELECT payload FROM webhook_events_json WHERE event_id = 'evt_jsonb'").fetchone()[0] is None


def test_a_trailing_slash_names_the_same_source(make_app, config, db):
    client = make_app(sources_config(config, {"billing": None})).test_client()
    body = encode(payment("evt_slash"))
    billing = signed_headers(body, source_secret("billing", "hmac-sha256"))

    def post(path, headers=billing):
        answer = send(client, body, headers, path=path)
        return answer.status, answer.json["status"]

    assert post("/api/webhooks/billing/") == (200, "processed")
    assert post("/api/webhooks/billing") == (200, "duplicate")
    assert post("/api/webhooks/", signed_headers(body)) == (200, "processed")
    assert post("/api/webhooks", signed_headers(body)) == (200, "duplicate")
    assert balance(db) == 1000 + 2 * 250


# -- every answer under /api/webhooks is logged and counted, whatever its status --------------

def test_every_answer_under_the_webhooks_path_is_logged_and_counted(config, gunicorn, db, tmp_path):
    server = gunicorn(workers=1, threads=2, **sources_config(config, {"billing": None}))
    body = encode(payment("evt_slash"))
    billing = signed_headers(body, source_secret("billing", "hmac-sha256"))

    def post(path, headers=billing):
        status, answer, _ = send(server.base, body, headers, path=path)
        return status, answer.get("status") or answer["error"]

    # Each source's answers, through either spelling of its path (what they are: the log lines below).
    for path, headers in (("/api/webhooks/billing/", billing), ("/api/webhooks/billing", billing),
                          ("/api/webhooks/", signed_headers(body)), ("/api/webhooks", signed_headers(body))):
        post(path, headers)
    # Answers that no source gives: each is logged and counted all the same.
    assert post("/api/webhooks/billing/x") == (404, "not_found")
    assert post("/api/webhooks/nosuch/") == (404, "unknown_source")
    assert http_request(server.base, "GET", "/api/webhooks/billing")[:2] == (405, {
        "error": "method_not_allowed", "message": "The method is not allowed for the requested URL."})
    assert http_request(server.base, "OPTIONS", "/api/webhooks")[0] == 405
    assert http_request(server.base, "GET", "/nowhere")[0] == 404  # not under /api/webhooks: neither

    scraped = scrape(server.base)
    server.stop()
    deliveries = [json.loads(line) for line in (tmp_path / "gunicorn-0.log").read_text().splitlines()
                  if '"message":"delivery"' in line]
    assert [(d["source"], d["status"], d["outcome"], d["reason"]) for d in deliveries] == [
        ("billing", 200, "processed", None), ("billing", 200, "duplicate", None),
        ("default", 200, "processed", None), ("default", 200, "duplicate", None),
        (None, 404, "rejected", "not_found"), (None, 404, "rejected", "unknown_source"),
        (None, 405, "rejected", "method_not_allowed"), (None, 405, "rejected", "method_not_allowed"),
    ]
    # A path that reaches no source may carry anything a sender chose: it is not logged.
    assert [d["path"] for d in deliveries] == ["/api/webhooks/billing/", "/api/webhooks/billing", "/api/webhooks/",
                                               "/api/webhooks", None, None, None, None]
    assert scraped[("webhook_ledger_unknown_source_requests_total", ())] == 4
    assert sum(v for (name, _), v in scraped.items() if name == "webhook_ledger_deliveries_total") == 4
