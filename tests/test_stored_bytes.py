"""The bytes received are the event of record (docs/design.md, "The shape"): stored
exactly, read back by replay, verify and show through the live path's own
decoder, and judged on their effect, not their bytes."""

import hashlib
import http.client
import json
import logging
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.intake.events import (
    DEFAULT_POLICY,
    InvalidEventError,
    InvalidJSONError,
    StoredBodyError,
    effect_of,
    parse,
    stored_event,
)
from app.locking.lock import done_key
from app.store import ledger, verify
from app.store.db import get_pool

from .helpers import ALICE, UNKNOWN_USER, balance, encode, event_rows, payment, send, signed_headers, stored_event_row

pytestmark = pytest.mark.core


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _payment_text(event_id, amount_json, extra=""):
    """A payment body written by hand, so that its numbers are spelled exactly as given."""
    return (f'{{"id": "{event_id}", "type": "payment.succeeded", "data": {{"userId": "{ALICE}", '
            f'"amountCents": {amount_json}{extra}}}}}').encode()


def test_the_exact_bytes_are_stored_with_their_hash(client, db):
    body = b'{"type":"payment.succeeded",  "id":"evt_exact","data":{"amountCents":250,"userId":"' + \
        str(ALICE).encode() + b'"}}  \n'
    assert send(client, body).json["status"] == "processed"
    stored = stored_event_row(db, "evt_exact")
    assert stored.status == "completed" and bytes(stored.body) == body
    assert bytes(stored.payload_sha256) == hashlib.sha256(body).digest()


# -- replay and verify decide as the live path did --------------------------------

def _send_exponent(client):
    """A payment whose amount is 1e2: jsonb would give it back as 100."""
    return send(client, _payment_text("evt_exponent", "1e2"))


def test_an_exponent_amount_fails_live(client, db):
    response = _send_exponent(client)
    assert (response.status, response.json["error"]) == (422, "unprocessable")


def test_an_exponent_amount_still_fails_on_replay(client, db, run):
    _send_exponent(client)
    result = run("events", "replay", "evt_exponent")
    assert (result.exit_code, result.output) == \
        (1, "evt_exponent: still failed: data.amountCents must be a positive integer\n")
    assert balance(db) == 1000 and stored_event_row(db, "evt_exponent").status == "failed"


def test_the_ledger_verifies_consistent_after_an_exponent_amount_fails_its_replay(client, db, run):
    _send_exponent(client)
    run("events", "replay", "evt_exponent")
    assert run("ledger", "verify").exit_code == 0


def _send_long_numbers(client):
    """Two payments holding 1e4400: a float (inf) to Python; jsonb keeps it as a 4401-digit integer, which
    Python's json refuses to read back. One is credited (the number is a note), one fails (it is the amount).
    Returns the credited one's bytes."""
    credited = _payment_text("evt_long_ok", "250", ', "note": 1e4400')
    assert send(client, credited).json["status"] == "processed"
    assert send(client, _payment_text("evt_long_bad", "1e4400")).status == 422
    return credited


def test_a_very_long_number_is_shown_as_received(client, db, run):
    credited = _send_long_numbers(client)
    shown = run("events", "show", "evt_long_ok")
    assert shown.exit_code == 0 and "stored bytes:   match" in shown.output
    assert shown.output.rstrip("\n").endswith(credited.decode())  # the bytes as received


def test_a_very_long_number_is_replayed_without_crashing(client, db, run):
    _send_long_numbers(client)
    replayed = run("events", "replay", "--all-failed")
    assert replayed.output.splitlines() == [
        "evt_long_bad: still failed: data.amountCents must be a positive integer",
        "replayed 1 failed events: 0 completed, 1 still failed",
    ]


def test_a_very_long_number_is_verified_without_crashing(client, db, run):
    _send_long_numbers(client)
    run("events", "replay", "--all-failed")
    verified = run("ledger", "verify")
    assert (verified.exit_code, verified.output) == \
        (0, "ledger consistent: 2 users, 2 stored events, 1 payments, 1 journal rows\n")
    assert balance(db) == 1250


def _replay_a_batch_with_unreadable_bytes(client, db, run):
    """Three failed events, one with bytes altered and one with bytes that are not JSON (their hash theirs),
    replayed in one batch once their user exists: replay's lines."""
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    for event_id in ("evt_tampered", "evt_unreadable", "evt_fine"):
        db.execute("DELETE FROM user_balances WHERE user_id = %s", [UNKNOWN_USER])
        send(client, payment(event_id, user=UNKNOWN_USER, cents=5))
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    db.execute("UPDATE webhook_events SET body = body || ' '::bytea WHERE event_id = 'evt_tampered'")
    db.execute("UPDATE webhook_events SET body = '{', payload_sha256 = sha256('{') WHERE event_id = 'evt_unreadable'")
    return run("events", "replay", "--all-failed").output.splitlines()


def test_replay_reports_stored_bytes_that_do_not_match_their_hash_or_do_not_parse(client, db, run):
    assert _replay_a_batch_with_unreadable_bytes(client, db, run)[:2] == [
        "evt_tampered: still failed: not replayed: its stored bytes do not match their SHA-256",
        "evt_unreadable: still failed: not replayed: its stored bytes do not parse: body is not valid JSON",
    ]


def test_stored_bytes_that_cannot_be_replayed_never_stop_a_batch(client, db, run):
    assert _replay_a_batch_with_unreadable_bytes(client, db, run)[2:] == [
        "evt_fine: processed; now completed",
        "replayed 3 failed events: 1 completed, 2 still failed",
    ]
    assert balance(db, UNKNOWN_USER) == 5


def test_events_show_reports_stored_bytes_that_do_not_match_their_hash(client, db, run):
    _replay_a_batch_with_unreadable_bytes(client, db, run)
    assert "stored bytes:   DO NOT MATCH their SHA-256" in run("events", "show", "evt_tampered").output


def test_verify_reports_a_completed_event_whose_bytes_were_altered(client, db, run):
    send(client, payment("evt_altered", cents=5))
    db.execute("UPDATE webhook_events SET body = convert_to(replace(convert_from(body, 'UTF8'), ': 5,', ': 6,'),"
               " 'UTF8') WHERE event_id = 'evt_altered'")
    result = run("ledger", "verify")
    assert result.exit_code == 1
    assert "completed event 'evt_altered': its stored bytes do not match their SHA-256" in result.output


# One number in every spelling JSON allows, and some it does not.
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1e2", "1E2", "100.0", "-0", "0", "1e4400", "1" * 5000, "2.5e-3", "9223372036854775808",
                     "NaN", "Infinity", "01", "true", '"250"', "null"]),
)


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(amount=NUMBERS, currency=st.sampled_from(["", ', "currency": "usd"', ', "currency": "JPY"']))
def test_for_any_body_the_live_and_the_stored_reading_agree(amount, currency):
    body = _payment_text("evt_any", amount, currency)
    try:
        live = parse(body)
    except (InvalidJSONError, InvalidEventError):
        return  # 400: nothing is stored, so nothing is ever replayed
    replayed = stored_event("default", live.id, live.type, body, hashlib.sha256(body).digest())
    assert effect_of(replayed, DEFAULT_POLICY) == effect_of(live, DEFAULT_POLICY)


def _send_any(client, db, amount):
    """A payment of amount spelled as given, under a new id: its id and the live answer's status, or None when
    nothing was stored (a 4xx other than 422)."""
    event_id = f"evt_{uuid.uuid4().hex}"
    live = send(client, _payment_text(event_id, amount)).status
    if live >= 400 and live != 422:
        assert stored_event_row(db, event_id) is None
        return event_id, None
    return event_id, live


ANY_STORED_BODY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@ANY_STORED_BODY
@given(amount=NUMBERS)
def test_for_any_stored_body_replay_agrees_with_the_live_answer(app, client, db, amount):
    event_id, live = _send_any(client, db, amount)
    if live is None:
        return
    replayed = ledger.replay(get_pool(app), "default", event_id)
    if live == 200:
        assert replayed.problem == "already completed"
    else:
        assert replayed.outcome == "failed" and replayed.problem == stored_event_row(db, event_id).last_error


@ANY_STORED_BODY
@given(amount=NUMBERS)
def test_for_any_stored_body_verify_agrees_with_the_live_answer(app, client, db, amount):
    event_id, live = _send_any(client, db, amount)
    if live is None:
        return
    ledger.replay(get_pool(app), "default", event_id)
    with get_pool(app).connection() as conn:
        assert verify.check(conn).problems == []


# -- the effect, not the bytes ---------------------------------------------------

def test_a_failed_event_retried_in_other_bytes_with_the_same_effect_is_processed_from_them(app, client, db, caplog):
    event = payment("evt_retry_bytes", user=UNKNOWN_USER, cents=40)
    assert send(client, event).status == 422
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    first_sha = bytes(stored_event_row(db, "evt_retry_bytes").payload_sha256)
    resent = json.dumps(event, indent=2).encode()
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        assert send(client, resent).json["status"] == "processed"
    stored = stored_event_row(db, "evt_retry_bytes")
    assert stored.status == "completed" and bytes(stored.body) == resent
    assert stored.attempts == 2 and stored.last_error is None
    assert bytes(stored.payload_sha256) == hashlib.sha256(resent).digest() != first_sha
    line = [r for r in caplog.records if r.getMessage() == "delivery"][-1]
    assert (line.body_sha256, line.stored_sha256) == (hashlib.sha256(resent).hexdigest(), first_sha.hex())
    counted = app.extensions["metrics"].reserialised.labels(source="default", outcome="processed")._value.get()
    assert (counted, balance(db, UNKNOWN_USER)) == (1, 40)


def _resend_in_other_bytes_to_redis_alone(app, client, caplog):
    """A credited payment sent again in other bytes, PostgreSQL's pool closed: the bytes first sent, those resent,
    the answer and its delivery log line."""
    event = payment("evt_fast_bytes", cents=5)
    assert send(client, event).json["status"] == "processed"
    app.extensions["db_pool"].close()  # any use of PostgreSQL now fails: Redis alone answers
    resent = json.dumps(event, separators=(",", ":")).encode()
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        again = send(client, resent)
    line = [r for r in caplog.records if r.getMessage() == "delivery"][-1]
    return encode(event), resent, again, line


def test_same_effect_in_other_bytes_is_a_duplicate_answered_by_redis(app, client, db, caplog):
    _, _, again, line = _resend_in_other_bytes_to_redis_alone(app, client, caplog)
    assert again.json == {"status": "duplicate", "event_id": "evt_fast_bytes"}
    assert line.redis == "done"


def test_same_effect_in_other_bytes_is_logged_with_both_hashes(app, client, db, caplog):
    body, resent, _, line = _resend_in_other_bytes_to_redis_alone(app, client, caplog)
    assert (line.body_sha256, line.stored_sha256) == \
        (hashlib.sha256(resent).hexdigest(), hashlib.sha256(body).hexdigest())


def test_same_effect_in_other_bytes_answered_by_redis_is_counted_as_reserialised(app, client, db, caplog):
    _resend_in_other_bytes_to_redis_alone(app, client, caplog)
    counted = app.extensions["metrics"].reserialised.labels(source="default", outcome="duplicate")._value.get()
    assert counted == 1


def test_same_effect_in_other_bytes_after_a_redis_flush_is_a_duplicate_from_postgres(client, db, redis_client):
    event = payment("evt_pg_bytes", cents=5)
    send(client, event)
    redis_client.flushall()
    resent = json.dumps(event, indent=3).encode()
    assert send(client, resent).json["status"] == "duplicate"
    assert redis_client.get(done_key("evt_pg_bytes")).decode().endswith(hashlib.sha256(encode(event)).hexdigest())
    assert balance(db) == 1005


@pytest.mark.parametrize("change", [
    {"cents": 6}, {"user": UNKNOWN_USER}, {"currency": "eur"}, {"event_type": "payment.refunded"},
])
def test_a_different_effect_is_a_mismatch_whatever_the_stored_status(client, db, change):
    send(client, payment("evt_effect", cents=5))
    changed = payment("evt_effect", cents=change.get("cents", 5), user=change.get("user", ALICE),
                      **({"currency": change["currency"]} if "currency" in change else {}))
    if "event_type" in change:
        changed["type"] = change["event_type"]
    response = send(client, changed)
    assert (response.status, response.json["error"]) == (409, "payload_mismatch")
    assert balance(db) == 1005


# -- purge keeps what the ledger needs -------------------------------------------------

PURGED_RESENT = pytest.mark.parametrize("resent", [
    payment("evt_purged", cents=10, note="re-serialised by the provider"),
    payment("evt_purged", cents=99),                          # another effect
    payment("evt_purged", user=UNKNOWN_USER, cents=10),       # would fail validation now
    {"id": "evt_purged", "type": "customer.created", "data": {}},
])


def _resend_purged(client, db, run, redis_client, resent):
    """A credited payment purged, then resent as resent with no done marker left: the answer."""
    send(client, payment("evt_purged", cents=10))
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    assert run("events", "purge").exit_code == 0
    redis_client.flushall()  # PostgreSQL, not a done marker, must answer
    return send(client, resent)


@PURGED_RESENT
def test_a_purged_credited_event_resent_in_any_bytes_is_a_duplicate(client, db, run, redis_client, resent):
    answer = _resend_purged(client, db, run, redis_client, resent)
    assert answer.json == {"status": "duplicate", "event_id": "evt_purged"}


@PURGED_RESENT
def test_a_purged_credited_event_resent_in_any_bytes_is_never_stored_failed(client, db, run, redis_client, resent):
    _resend_purged(client, db, run, redis_client, resent)
    assert event_rows(db) == 0  # nothing re-inserted: no failed row beside a credit


@PURGED_RESENT
def test_a_purged_credited_event_resent_in_any_bytes_keeps_its_one_credit(client, db, run, redis_client, resent):
    _resend_purged(client, db, run, redis_client, resent)
    assert balance(db) == 1010
    # The journal, not the purged rows, holds its credit: verify checks balances against it.
    assert run("ledger", "verify").exit_code == 0


# -- the body's size ----------------------------------------------------------------------

def _post_chunked(base, body, headers):
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        chunks = (body[i:i + 1000] for i in range(0, len(body), 1000))
        conn.request("POST", "/api/webhooks", body=chunks, headers=headers, encode_chunked=True)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _post_signed_chunked(server, body):
    return _post_chunked(server.base, body, {**signed_headers(body), "Transfer-Encoding": "chunked"})


def test_a_chunked_body_over_the_limit_is_413(gunicorn, db):
    server = gunicorn(workers=1, threads=2, MAX_BODY_BYTES=2000)
    status, answer = _post_signed_chunked(server, encode(payment("evt_chunked_big", note="x" * 2500)))
    # The same answer as a body with a Content-Length (test_webhooks.py).
    assert (status, answer) == (413, {"error": "too_large",
                                      "message": "the body is larger than 2000 bytes (MAX_BODY_BYTES)"})
    assert event_rows(db) == 0


def test_a_chunked_body_at_the_limit_is_processed(gunicorn, db):
    server = gunicorn(workers=1, threads=2, MAX_BODY_BYTES=2000)
    exactly = encode(payment("evt_chunked_fits", note=""))
    exactly = encode(payment("evt_chunked_fits", note="y" * (2000 - len(exactly))))
    assert len(exactly) == 2000
    status, answer = _post_signed_chunked(server, exactly)
    assert (status, answer["status"]) == (200, "processed")
    assert [r[0] for r in db.execute("SELECT event_id FROM webhook_events")] == ["evt_chunked_fits"]


def test_a_declared_length_one_byte_over_the_limit_is_413(make_app, config, db):
    client = make_app({**config, "MAX_BODY_BYTES": 300}).test_client()
    body = encode(payment("evt_301"))
    body = encode(payment("evt_301", note="z" * (301 - len(body) - len(', "note": ""'))))
    assert len(body) == 301
    response = send(client, body)
    assert (response.status, response.json["error"]) == (413, "too_large")
    assert event_rows(db) == 0


@pytest.mark.unit
def test_stored_event_refuses_altered_or_unreadable_bytes():
    body = encode(payment("evt_x"))
    with pytest.raises(StoredBodyError, match="do not match"):
        stored_event("default", "evt_x", "payment.succeeded", body + b" ", hashlib.sha256(body).digest())
    with pytest.raises(StoredBodyError, match="do not parse"):
        stored_event("default", "evt_x", "payment.succeeded", b"[1]", hashlib.sha256(b"[1]").digest())
