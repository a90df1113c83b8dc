"""Razorpay end to end on a named source (WEBHOOK_SOURCES=razorpay): deliveries signed as Razorpay signs them,
the signature checked against Razorpay's own library, events in Razorpay's shape (tests/providers/razorpay/events.py),
and a payment credited once however many events or event ids announce it. Real PostgreSQL and Redis."""

import hashlib
import hmac
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import razorpay
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.intake.events import Policy
from app.intake.signature import SignatureError, sign, verify
from tests.helpers import (
    BOB,
    assert_ledger_consistent,
    balance,
    db_url,
    encode,
    event_rows,
    record_currency,
    send,
    source_secret,
    sources_config,
    stored_event_row,
)
from tests.providers.razorpay.events import dispute_event, new_id, order_paid, payment_captured, refund_event

pytestmark = pytest.mark.core

SOURCE = "razorpay"
SECRET = source_secret(SOURCE, "razorpay")
INR = Policy("inr")


@pytest.fixture
def config(db, redis_server, redis_client):
    """Razorpay on its own route; the ledger in rupees (Razorpay's amounts are paise)."""
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url}
    record_currency(db, "inr")
    return sources_config(base, {SOURCE: None}, LEDGER_CURRENCY="inr")


def razorpay_headers(body, header_id=None, secret=SECRET):
    """What Razorpay sends: the hex HMAC of the raw body, and the event's id in its own (unsigned) header."""
    return {"Content-Type": "application/json", "X-Razorpay-Signature": sign("razorpay", body, [secret.encode()])[
        "X-Razorpay-Signature"], "x-razorpay-event-id": header_id or new_id("evt")[4:]}


def send_razorpay(client, event, header_id=None):
    """POST event to the Razorpay source, signed as Razorpay signs it, header_id in its x-razorpay-event-id."""
    body = encode(event)
    return send(client, body, razorpay_headers(body, header_id), source=SOURCE)


def razorpay_event_id(header_id, body):
    """The id an event of Razorpay's gets: its x-razorpay-event-id, a dot, 32 hex digits of its body's SHA-256."""
    return f"{header_id}.{hashlib.sha256(body).hexdigest()[:32]}"


# -- the scheme, checked against Razorpay's library -------------------------------------

UTILITY = razorpay.Utility(None)


# Any text body, and any secret of 16 to 40 characters without a comma.
ANY_DELIVERY = given(body=st.text(max_size=300),
                     secret=st.text(min_size=16, max_size=40).filter(lambda s: "," not in s))


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@ANY_DELIVERY
def test_razorpay_library_verifies_every_signature_we_make(body, secret):
    header = sign("razorpay", body.encode(), [secret.encode()])["X-Razorpay-Signature"]
    assert UTILITY.verify_webhook_signature(body, header, secret) is True
    with pytest.raises(razorpay.errors.SignatureVerificationError):  # a changed body fails
        UTILITY.verify_webhook_signature(body + "x", header, secret)


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@ANY_DELIVERY
def test_we_verify_every_digest_razorpays_library_accepts(body, secret):
    raw, key = body.encode(), secret.encode()
    header = sign("razorpay", raw, [key])["X-Razorpay-Signature"]
    assert UTILITY.verify_webhook_signature(body, header, secret) is True  # the library's own digest
    assert verify("razorpay", raw, {"X-Razorpay-Signature": header}, [key], 300) == 0
    with pytest.raises(SignatureError):  # a changed body fails
        verify("razorpay", (body + "x").encode(), {"X-Razorpay-Signature": header}, [key], 300)


def _documented_delivery():
    """Razorpay's documented payment.captured, as its bytes, and the header Razorpay sends with it."""
    body = json.dumps(payment_captured("pay_DESp9bgForNoUd"), separators=(",", ":"))
    return body, hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()


@pytest.mark.unit
def test_razorpay_documented_payload_verifies_with_the_library():
    body, header = _documented_delivery()
    assert UTILITY.verify_webhook_signature(body, header, SECRET)


@pytest.mark.unit
def test_razorpay_documented_payload_verifies_with_us():
    body, header = _documented_delivery()
    assert verify("razorpay", body.encode(), {"x-razorpay-signature": header}, [b"old-secret-0123456789",
                                                                                SECRET.encode()], 300) == 1


BAD_SIGNATURES = pytest.mark.parametrize("headers, message", [
    ({}, "missing X-Razorpay-Signature header"),
    ({"X-Razorpay-Signature": "sha256=" + "0" * 64}, "malformed X-Razorpay-Signature header"),
    ({"X-Razorpay-Signature": "0" * 64}, "signature does not match"),
])


def _send_badly_signed(client, headers):
    """A payment.captured to the Razorpay source, with headers as its only signature."""
    body = encode(payment_captured(new_id("pay")))
    return send(client, body, {"Content-Type": "application/json", "x-razorpay-event-id": "e1", **headers},
                source=SOURCE)


@BAD_SIGNATURES
def test_a_bad_razorpay_signature_is_401_naming_its_fault(client, db, headers, message):
    response = _send_badly_signed(client, headers)
    assert response.status == 401 and message in response.json["message"]


@BAD_SIGNATURES
def test_a_bad_razorpay_signature_writes_nothing(client, db, headers, message):
    _send_badly_signed(client, headers)
    assert event_rows(db) == 0


# -- payments ----------------------------------------------------------------------------

def _capture(client, payment_id, header_id):
    """payment.captured of payment_id (500 rupees to Bob), delivered under header_id: the answer."""
    return send_razorpay(client, payment_captured(payment_id, user=BOB, paise=50000), header_id)


def test_payment_captured_credits_its_payment_once(client, db):
    body, header_id = encode(payment_captured(new_id("pay"), user=BOB, paise=50000)), "Hdjxv1mE1e0gOk"
    event_id = razorpay_event_id(header_id, body)
    assert send_razorpay(client, body, header_id).json == {"status": "processed", "event_id": event_id}
    assert send_razorpay(client, body, header_id).json["status"] == "duplicate"  # Razorpay's retry: same id
    assert balance(db, BOB) == 50000
    row = stored_event_row(db, event_id)
    assert (row.source, row.event_type, row.status, row.attempts) == (SOURCE, "payment.captured", "completed", 1)
    assert_ledger_consistent(db, INR)


def test_order_paid_for_a_captured_payment_moves_nothing(client, db):
    payment_id = new_id("pay")
    assert _capture(client, payment_id, "Hdjxv1mE1e0gOk").json["status"] == "processed"
    assert send_razorpay(client, order_paid(payment_id, user=BOB, paise=50000)).status == 200
    assert balance(db, BOB) == 50000
    assert_ledger_consistent(db, INR)


def test_a_captured_delivery_replayed_under_another_event_id_moves_no_money(client, db):
    """x-razorpay-event-id is not signed: an attacker holding one captured delivery can send its exact bytes and
    signature under headers of their choosing. Each is stored as an event; the payment's id, signed, decides."""
    payment_id = new_id("pay")
    body = encode(payment_captured(payment_id, user=BOB, paise=12300))
    signature = razorpay_headers(body)["X-Razorpay-Signature"]
    for header_id in ("first-id", "replayed-id-1", "replayed-id-2"):
        headers = {"Content-Type": "application/json", "X-Razorpay-Signature": signature,
                   "x-razorpay-event-id": header_id}
        assert send(client, body, headers, source=SOURCE).status == 200
    assert balance(db, BOB) == 12300
    assert event_rows(db, SOURCE) == 3
    assert db.execute("SELECT count(*) FROM ledger_journal WHERE kind = 'credit'").fetchone()[0] == 1
    assert_ledger_consistent(db, INR)


def test_payment_captured_and_order_paid_concurrently_credit_once(gunicorn, db):
    server = gunicorn(workers=2, threads=4)
    rounds = 10
    for _ in range(rounds):
        payment_id = new_id("pay")
        bodies = [encode(payment_captured(payment_id, user=BOB, paise=100)),
                  encode(order_paid(payment_id, user=BOB, paise=100))] * 3
        barrier = threading.Barrier(len(bodies))

        def post(body, barrier=barrier):
            barrier.wait()
            return send(server.base, body, razorpay_headers(body), source=SOURCE).status

        with ThreadPoolExecutor(len(bodies)) as pool:
            assert set(pool.map(post, bodies)) == {200}
    assert balance(db, BOB) == 100 * rounds
    assert event_rows(db, SOURCE) == 6 * rounds
    assert_ledger_consistent(db, INR)


@pytest.mark.parametrize("change, problem", [
    ({"notes": []}, "payload.payment.entity.notes.user_id must be a user's UUID or the application's key of one"),
    ({"amount": 12.5}, "payload.payment.entity.amount must be a positive integer"),
    ({"currency": "USD"}, "payload.payment.entity.currency must be the ledger's currency, 'inr'"),
])
def test_a_payment_that_cannot_apply_is_422(client, db, change, problem):
    event = payment_captured(new_id("pay"), user=BOB)
    event["payload"]["payment"]["entity"].update(change)
    response = send_razorpay(client, event)
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert problem in response.json["message"]
    assert balance(db, BOB) == 0


# -- the event id: the unsigned header and the signed body's digest ----------------------

@pytest.mark.parametrize("change, message", [
    ({"x-razorpay-event-id": None}, "the x-razorpay-event-id header is missing"),
    # 222: the header, a dot and 32 hex digits make an id of 255 characters, the most a stored id has.
    ({"x-razorpay-event-id": "x" * 223}, "the x-razorpay-event-id header must be 1 to 222 characters"),
])
def test_a_delivery_without_a_usable_event_id_is_400(client, db, change, message):
    body = encode(payment_captured(new_id("pay")))
    headers = {k: v for k, v in {**razorpay_headers(body), **change}.items() if v is not None}
    response = send(client, body, headers, source=SOURCE)
    assert (response.status, response.json["error"]) == (400, "invalid_event")
    assert message in response.json["message"]
    assert event_rows(db) == 0


def test_the_event_id_is_the_header_and_the_bodys_digest(client, db):
    body = encode(payment_captured(new_id("pay"), user=BOB))
    event_id = f"HQ9tqtn9mNxM5C.{hashlib.sha256(body).hexdigest()[:32]}"
    assert send_razorpay(client, body, "HQ9tqtn9mNxM5C").json == {"status": "processed", "event_id": event_id}
    assert stored_event_row(db, event_id).source == SOURCE


def test_the_longest_header_makes_an_id_of_255_characters(client, db):
    body = encode(payment_captured(new_id("pay"), user=BOB))
    answer = send_razorpay(client, body, "x" * 222)
    assert answer.json == {"status": "processed", "event_id": razorpay_event_id("x" * 222, body)}
    assert len(answer.json["event_id"]) == 255


def test_razorpays_retry_of_an_event_is_a_duplicate(client, db):
    """Razorpay retries an event with its bytes and its header: one id, one row."""
    body = encode(payment_captured(new_id("pay"), user=BOB))
    assert send_razorpay(client, body, "HQ9tqtn9mNxM5C").json["status"] == "processed"
    assert send_razorpay(client, body, "HQ9tqtn9mNxM5C").json["status"] == "duplicate"
    assert event_rows(db, SOURCE) == 1


# -- refunds and disputes -------------------------------------------------------------------

@pytest.fixture
def paid(client, db):
    payment_id = new_id("pay")
    assert send_razorpay(client, payment_captured(payment_id, user=BOB, paise=10000)).json["status"] == "processed"
    return payment_id


def _journal(db):
    return db.execute("SELECT kind, movement_id, amount_cents FROM ledger_journal WHERE kind <> 'credit'"
                      " ORDER BY id").fetchall()


def _refund(client, event_type, refund_id, payment_id, paise, status):
    """One of Razorpay's refund events, which must be answered 200."""
    assert send_razorpay(client, refund_event(event_type, refund_id, payment_id, paise, status)).status == 200


# Old signed bodies an attacker may have captured: another event of the payment, and another refund's.
OLD_EVENTS = pytest.mark.parametrize("old_event", [
    lambda payment_id: payment_captured(payment_id, user=BOB, paise=10000),
    lambda payment_id: refund_event("refund.created", new_id("rfnd"), payment_id, 1000, "pending"),
], ids=["payment.captured", "another refund"])


@OLD_EVENTS
def test_an_old_body_sent_under_a_coming_events_header_cannot_block_it(client, db, paid, old_event):
    """Issue 35: the header is not signed. An old signed body sent first under the header of an event that has
    not arrived yet takes no id from it: the event, when it comes, is processed and debits once."""
    refund_id, header_id = new_id("rfnd"), "HQ9tqtn9mNxM5C"
    genuine = encode(refund_event("refund.processed", refund_id, paid, 4000, "processed"))
    old = encode(old_event(paid))
    assert send_razorpay(client, old).status == 200  # its own delivery, earlier
    before = balance(db, BOB)
    assert send_razorpay(client, old, header_id).status == 200  # the squatter's, under the coming event's header
    answer = send_razorpay(client, genuine, header_id)
    assert answer.json == {"status": "processed", "event_id": razorpay_event_id(header_id, genuine)}
    assert send_razorpay(client, genuine, header_id).json["status"] == "duplicate"  # Razorpay's retry
    assert balance(db, BOB) == before - 4000
    assert [row for row in _journal(db) if row[1] == refund_id] == [("refund", refund_id, -4000)]
    assert_ledger_consistent(db, INR)


def test_a_processed_refund_debits_once(client, db, paid):
    refund_id = new_id("rfnd")
    _refund(client, "refund.created", refund_id, paid, 3000, "pending")
    _refund(client, "refund.processed", refund_id, paid, 3000, "processed")
    assert balance(db, BOB) == 7000
    assert _journal(db) == [("refund", refund_id, -3000)]
    assert_ledger_consistent(db, INR)


def test_a_refund_failed_before_it_was_counted_moves_nothing(client, db, paid):
    _refund(client, "refund.failed", new_id("rfnd"), paid, 2000, "failed")
    assert balance(db, BOB) == 10000  # nothing taken, nothing given
    assert _journal(db) == []
    assert_ledger_consistent(db, INR)


def test_a_failed_refund_gives_back_what_it_took(client, db, paid):
    failing = new_id("rfnd")
    _refund(client, "refund.created", failing, paid, 1000, "pending")
    _refund(client, "refund.failed", failing, paid, 1000, "failed")
    assert balance(db, BOB) == 10000
    assert _journal(db) == [("refund", failing, -1000), ("refund_reversed", failing, 1000)]
    assert_ledger_consistent(db, INR)


def _dispute(client, event_type, dispute_id, payment_id, status, deliveries=1, **deducted):
    """One of Razorpay's dispute events for 40 rupees, delivered under as many event ids, each answered 200."""
    event = dispute_event(event_type, dispute_id, payment_id, 4000, status, **deducted)
    for _ in range(deliveries):
        assert send_razorpay(client, event).status == 200


def _lose(client, dispute_id, payment_id):
    """The dispute opened, then lost: its loss announced under two event ids."""
    _dispute(client, "payment.dispute.created", dispute_id, payment_id, "open")
    _dispute(client, "payment.dispute.lost", dispute_id, payment_id, "lost", deliveries=2, deducted=4000)


def test_an_open_dispute_withdraws_nothing(client, db, paid):
    _dispute(client, "payment.dispute.created", new_id("disp"), paid, "open")
    assert balance(db, BOB) == 10000  # Razorpay deducts nothing until the dispute is lost


def test_a_lost_dispute_withdraws_once(client, db, paid):
    dispute_id = new_id("disp")
    _lose(client, dispute_id, paid)
    assert balance(db, BOB) == 6000
    assert _journal(db) == [("dispute_withdrawn", dispute_id, -4000)]
    assert_ledger_consistent(db, INR)


def test_a_lost_dispute_withdraws_what_razorpay_deducted_not_what_was_disputed(client, db, paid):
    dispute_id = new_id("disp")
    _dispute(client, "payment.dispute.lost", dispute_id, paid, "lost", deliveries=2, deducted=2500)
    assert balance(db, BOB) == 7500
    assert _journal(db) == [("dispute_withdrawn", dispute_id, -2500)]
    assert_ledger_consistent(db, INR)


def test_a_won_dispute_reinstates_what_its_loss_withdrew(client, db, paid):
    dispute_id = new_id("disp")
    _dispute(client, "payment.dispute.lost", dispute_id, paid, "lost", deducted=2500)
    _dispute(client, "payment.dispute.won", dispute_id, paid, "won", deducted=2500)  # what it gives back
    assert balance(db, BOB) == 10000
    assert _journal(db) == [("dispute_withdrawn", dispute_id, -2500), ("dispute_reinstated", dispute_id, 2500)]
    assert_ledger_consistent(db, INR)


def test_a_dispute_won_then_lost_in_pre_arbitration_withdraws_what_the_loss_deducted(client, db, paid):
    """Razorpay's pre-arbitration: a chargeback the merchant won, challenged again and lost. The win deducted
    nothing, so it gives nothing back and leaves the loss to withdraw."""
    dispute_id = new_id("disp")
    _dispute(client, "payment.dispute.won", dispute_id, paid, "won")
    assert balance(db, BOB) == 10000
    _dispute(client, "payment.dispute.lost", dispute_id, paid, "lost")
    assert balance(db, BOB) == 6000
    assert _journal(db) == [("dispute_withdrawn", dispute_id, -4000)]
    assert_ledger_consistent(db, INR)


def test_a_dispute_deducted_at_onset_withdraws_once_when_it_is_lost(client, db, paid):
    """Deduct at Onset: Razorpay deducts the disputed amount when the dispute is raised. The ledger follows the
    outcome: nothing while it is open, the deduction once when it is lost."""
    dispute_id = new_id("disp")
    for event_type, status in (("payment.dispute.created", "open"), ("payment.dispute.under_review", "under_review"),
                               ("payment.dispute.action_required", "open")):
        _dispute(client, event_type, dispute_id, paid, status, deducted=4000)
    assert balance(db, BOB) == 10000
    _dispute(client, "payment.dispute.lost", dispute_id, paid, "lost", deliveries=2, deducted=4000)
    assert balance(db, BOB) == 6000
    assert _journal(db) == [("dispute_withdrawn", dispute_id, -4000)]
    assert_ledger_consistent(db, INR)


def test_a_dispute_deducted_at_onset_and_won_moves_nothing(client, db, paid):
    dispute_id = new_id("disp")
    _dispute(client, "payment.dispute.created", dispute_id, paid, "open", deducted=4000)
    _dispute(client, "payment.dispute.won", dispute_id, paid, "won", deducted=4000)
    assert balance(db, BOB) == 10000
    assert _journal(db) == []
    assert_ledger_consistent(db, INR)


def test_a_lost_dispute_that_does_not_say_what_was_deducted_is_422_and_moves_nothing(client, db, paid):
    event = dispute_event("payment.dispute.lost", new_id("disp"), paid, 4000, "lost", deducted=0)
    response = send_razorpay(client, event)
    assert (response.status, response.json["message"]) == (
        422, "payload.dispute.entity.amount_deducted must be a positive integer")
    assert balance(db, BOB) == 10000
    assert_ledger_consistent(db, INR)


def test_the_failed_refund_of_a_stripe_event_is_still_read_as_stripes(client, db):
    """refund.failed is both providers' name; the shape of the body says whose it is."""
    from app.intake.events import Event, effect_of
    body = {"id": "evt_1", "type": "refund.failed", "livemode": True, "data": {"object": {
        "id": "re_1", "object": "refund", "payment_intent": "pi_1", "amount": 100, "currency": "inr",
        "status": "failed"}}}
    effect = effect_of(Event("evt_1", "refund.failed", body["data"], body, encode(body)), INR)
    assert (effect.payment_id, effect.movement_id, effect.amount_cents) == ("pi_1", "re_1", 100)


# -- any set of events, in any order ----------------------------------------------------------

# Razorpay's refund events, each with the status its entity carries then.
RAZORPAY_REFUNDS = [("refund.created", "pending"), ("refund.processed", "processed"), ("refund.failed", "failed")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_for_any_set_of_razorpay_events_in_any_order_the_balance_moves_by_what_the_rule_says_is_due(client, db, data):
    """The rule of docs/design.md, written apart from money.sql: a refund is counted once and given back if any
    event saw it failed; a dispute takes its amount if it was lost and not won; never more than the payment."""
    payment_id = new_id("pay")
    amount = data.draw(st.integers(1, 10_000), label="amount")
    paise = st.integers(1, amount)
    sent = [payment_captured(payment_id, user=BOB, paise=amount)]
    if data.draw(st.booleans(), label="order.paid too"):
        sent.append(order_paid(payment_id, user=BOB, paise=amount))
    refunds, disputes = {}, {}
    for n in range(data.draw(st.integers(0, 3), label="refunds")):
        refund_id, refund_paise = new_id("rfnd"), data.draw(paise, label=f"refund {n}")
        seen = data.draw(st.lists(st.sampled_from(RAZORPAY_REFUNDS), min_size=1, max_size=3), label=f"refund {n}'s")
        sent += [refund_event(event_type, refund_id, payment_id, refund_paise, status) for event_type, status in seen]
        refunds[refund_id] = (refund_paise, {status for _, status in seen})
    for n in range(data.draw(st.integers(0, 2), label="disputes")):
        dispute_id, dispute_paise = new_id("disp"), data.draw(paise, label=f"dispute {n}")
        outcomes = data.draw(st.sets(st.sampled_from(["lost", "won"]), min_size=1), label=f"dispute {n}'s")
        # A win after a loss gives back what the loss deducted; a win alone deducted nothing.
        sent += [dispute_event(f"payment.dispute.{outcome}", dispute_id, payment_id, dispute_paise, outcome,
                               deducted=dispute_paise if "lost" in outcomes else 0)
                 for outcome in outcomes]
        disputes[dispute_id] = (dispute_paise, outcomes)
    taken = min(amount, sum(cents for cents, statuses in refunds.values() if "failed" not in statuses)
                + sum(cents for cents, outcomes in disputes.values() if outcomes == {"lost"}))
    events = [(event, new_id("evt")[4:]) for event in sent]  # each event keeps its header on every delivery
    # Each event delivered at least once, duplicates and reorders included.
    deliveries = data.draw(st.permutations(events + data.draw(st.lists(st.sampled_from(events), max_size=6))))
    before = balance(db, BOB)
    for event, header_id in deliveries:
        response = send_razorpay(client, event, header_id)
        # 422: a movement before its payment's credit (unknown payment), which Razorpay retries.
        assert response.status in (200, 422), response.json
    for event, header_id in events:  # Razorpay retries what was refused before its payment
        response = send_razorpay(client, event, header_id)
        assert response.status == 200, response.json
    assert balance(db, BOB) - before == amount - taken
    assert_ledger_consistent(db, INR)
