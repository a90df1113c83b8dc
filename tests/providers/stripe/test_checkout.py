"""Checkout top-ups (app/providers/stripe.py's Checkout rules, money.sql's credit_payment): a paid Session credits
its PaymentIntent once, whichever of the two events comes first, to the user its metadata or client_reference_id
names. Real PostgreSQL and Redis (gunicorn for concurrency); events built by stripe-python and signed by its signer,
Sessions shaped as https://docs.stripe.com/api/checkout/sessions/object shows them."""

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.settings.config import Settings
from tests.helpers import ALICE, BOB, OPENING, UNKNOWN_USER, assert_ledger_consistent, balance, send
from tests.providers.stripe.events import (
    ASYNC_FAILED,
    ASYNC_SUCCEEDED,
    intent_succeeded,
    refund,
    send_stripe,
    stripe_signed,
)
from tests.providers.stripe.events import checkout_session as session

pytestmark = [pytest.mark.core, pytest.mark.parametrize("scheme", ["stripe"])]

def guest_intent(intent_id, cents=250, event_id=None):
    """A Checkout PaymentIntent whose integrator put the user on the Session only: no metadata, no customer."""
    return intent_succeeded(intent_id, cents=cents, event_id=event_id, metadata={})


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _credits(db):
    return db.execute("SELECT payment_id, user_id, amount_cents FROM ledger_journal WHERE kind = 'credit'").fetchall()


def _status(db, event_id):
    return db.execute("SELECT status FROM webhook_events WHERE event_id = %s", [event_id]).fetchone()[0]


def _consistent(client, db):
    assert_ledger_consistent(db, Settings.of(client.application).policy)


def test_a_paid_session_credits_its_payment_intent_to_its_client_reference_id(client, db):
    evt = session("pi_top_up", user=BOB, cents=1500)
    assert send_stripe(client, evt).json == {"status": "processed", "event_id": evt.id}
    assert balance(db, BOB) == OPENING[BOB] + 1500
    assert _credits(db) == [("pi_top_up", BOB, 1500)]
    _consistent(client, db)


def test_session_then_its_payment_intent_credit_once(client, db):
    send_stripe(client, session("pi_s_first", cents=700))
    assert send_stripe(client, guest_intent("pi_s_first", cents=700)).json["status"] == "duplicate"
    assert balance(db) == OPENING[ALICE] + 700
    assert _credits(db) == [("pi_s_first", ALICE, 700)]
    _consistent(client, db)


def test_payment_intent_then_its_session_credit_once(client, db):
    assert send_stripe(client, intent_succeeded("pi_p_first", cents=700)).json["status"] == "processed"
    assert send_stripe(client, session("pi_p_first", cents=700)).json["status"] == "duplicate"
    assert balance(db) == OPENING[ALICE] + 700
    _consistent(client, db)


def test_a_payment_intent_refused_for_want_of_a_user_is_applied_once_its_session_names_one(client, db, run):
    intent = guest_intent("pi_waiting", cents=900)
    refused = send_stripe(client, intent)
    assert refused.status == 422 and "no user" in refused.json["message"]
    assert send_stripe(client, session("pi_waiting", user=BOB, cents=900)).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB] + 900
    # Stripe's retry of the refused PaymentIntent (or a replay) finds its payment credited: a duplicate.
    assert send_stripe(client, intent).json["status"] == "duplicate"
    assert _status(db, intent.id) == "completed"
    assert balance(db, BOB) == OPENING[BOB] + 900
    assert run("ledger", "verify").exit_code == 0


def test_a_replay_of_the_refused_payment_intent_is_a_duplicate_once_its_session_credited_it(client, db, run):
    intent = guest_intent("pi_replayed", cents=300)
    send_stripe(client, intent)
    send_stripe(client, session("pi_replayed", cents=300))
    replayed = run("events", "replay", intent.id)
    assert replayed.exit_code == 0, replayed.output
    assert _status(db, intent.id) == "completed"
    assert balance(db) == OPENING[ALICE] + 300


def test_the_source_metadata_key_names_the_user_before_client_reference_id(make_app, config, db):
    client = make_app({**config, "WEBHOOK_USER_METADATA_KEY": "ledger_user"}).test_client()
    evt = session("pi_keyed", user=ALICE, metadata={"ledger_user": str(BOB)}, cents=400)
    assert send_stripe(client, evt).json["status"] == "processed"
    assert _credits(db) == [("pi_keyed", BOB, 400)]
    _consistent(client, db)


def test_a_session_with_neither_names_its_customers_linked_user(client, db, run):
    assert run("users", "link", "default", "cus_buyer", str(BOB), "--by", "ops").exit_code == 0
    assert send_stripe(client, session("pi_linked", user=None, customer="cus_buyer")).json["status"] == "processed"
    assert _credits(db) == [("pi_linked", BOB, 250)]
    assert run("ledger", "verify").exit_code == 0


def test_a_session_naming_no_user_is_refused_naming_where_it_looked(client, db):
    response = send_stripe(client, session("pi_nobody", user=None))
    assert response.status == 422
    assert "no user: no data.object.metadata.user_id nor data.object.client_reference_id" in response.json["message"]
    assert balance(db) == OPENING[ALICE]


def test_a_client_reference_id_that_is_no_users_key_is_refused(client, db):
    response = send_stripe(client, session("pi_order", user="order_1234"))
    assert response.status == 422
    assert "no user has the application's key order_1234" in response.json["message"]


def test_an_unpaid_session_moves_nothing_then_its_async_payment_succeeded_credits(client, db):
    pending = session("pi_ach", payment_status="unpaid", cents=5000)
    assert send_stripe(client, pending).json["status"] == "processed"
    assert balance(db) == OPENING[ALICE]
    assert send_stripe(client, session("pi_ach", ASYNC_SUCCEEDED, cents=5000)).json["status"] == "processed"
    assert send_stripe(client, guest_intent("pi_ach", cents=5000)).json["status"] == "duplicate"
    assert balance(db) == OPENING[ALICE] + 5000
    _consistent(client, db)


def test_async_payment_failed_moves_nothing(client, db):
    send_stripe(client, session("pi_ach_failed", payment_status="unpaid"))
    assert send_stripe(client, session("pi_ach_failed", ASYNC_FAILED, payment_status="unpaid")).json["status"] \
        == "processed"
    assert balance(db) == OPENING[ALICE] and _credits(db) == []


@pytest.mark.parametrize("mode, payment_status", [("subscription", "paid"), ("setup", "no_payment_required"),
                                                  ("payment", "no_payment_required")])
def test_sessions_that_take_no_payment_here_move_nothing(client, db, mode, payment_status):
    evt = session("pi_none", mode=mode, payment_status=payment_status)
    assert send_stripe(client, evt).json["status"] == "processed"
    assert balance(db) == OPENING[ALICE] and _credits(db) == []


def test_a_session_and_its_payment_intent_with_other_amounts_is_a_payment_mismatch(client, db):
    send_stripe(client, session("pi_differs", cents=1000))
    response = send_stripe(client, intent_succeeded("pi_differs", cents=900))
    assert (response.status, response.json["error"]) == (409, "payment_mismatch")
    assert balance(db) == OPENING[ALICE] + 1000


@pytest.mark.parametrize("rounds", [6])
def test_concurrent_session_and_payment_intent_credit_once(gunicorn, db, rounds):
    server = gunicorn(workers=2, threads=4)
    for i in range(rounds):
        intent_id = f"pi_race_{i}"
        deliveries = [stripe_signed(evt) for evt in (session(intent_id, cents=100),
                                                     intent_succeeded(intent_id, cents=100),
                                                     guest_intent(intent_id, cents=100))]
        barrier = threading.Barrier(len(deliveries))

        def send_one(delivery, barrier=barrier):
            barrier.wait()
            return send(server.base, *delivery)

        with ThreadPoolExecutor(len(deliveries)) as pool:
            answers = list(pool.map(send_one, deliveries))
        outcomes = Counter(body.get("status") or body["error"] for _, body, _ in answers)
        assert outcomes["processed"] == 1, outcomes
    assert balance(db) == OPENING[ALICE] + 100 * rounds
    assert sorted(_credits(db)) == sorted((f"pi_race_{i}", ALICE, 100) for i in range(rounds))
    assert_ledger_consistent(db)


def test_a_session_stored_when_sessions_moved_nothing_is_recomputed_by_init_db(client, db, run, redis_client):
    """A row whose effect version 5 hashed (a Checkout Session moved nothing then): until init-db recomputes it, a
    re-delivery of the same event is a payload mismatch; after, a duplicate."""
    evt = session("pi_before")
    send_stripe(client, evt)
    db.execute("UPDATE webhook_events SET effect_sha256 = sha256(convert_to(%s, 'UTF8')), effect_version = 5"
               " WHERE event_id = %s", ['["checkout.session.completed"]', evt.id])
    redis_client.flushall()  # the done marker holds the new hash: PostgreSQL decides
    assert send_stripe(client, evt).status == 409
    assert run("init-db").exit_code == 0
    assert send_stripe(client, evt).json["status"] == "duplicate"


# -- flask payments assign-user -----------------------------------------------------------------------------------

def _nobody_named(client, intent_id="pi_guest", cents=800):
    """A guest payment whose Session and PaymentIntent name no user: both refused."""
    evts = session(intent_id, user=None, cents=cents), guest_intent(intent_id, cents=cents)
    assert [send_stripe(client, evt).status for evt in evts] == [422, 422]
    return evts


def test_the_operator_gives_a_payment_no_event_names_a_user_and_its_events_apply_once(client, db, run):
    evts = _nobody_named(client)
    refunded = refund("re_guest", "pi_guest", 300)
    assert send_stripe(client, refunded).status == 422  # unknown payment, for now
    assigned = run("payments", "assign-user", "default", "pi_guest", str(BOB), "--by", "ops")
    assert assigned.exit_code == 0, assigned.output
    assert assigned.output.startswith(f"assigned payment pi_guest of source default to user {BOB}\n")
    assert [_status(db, evt.id) for evt in (*evts, refunded)] == ["completed"] * 3
    assert _credits(db) == [("pi_guest", BOB, 800)]
    assert balance(db, BOB) == OPENING[BOB] + 800 - 300
    assert run("ledger", "verify").exit_code == 0
    again = run("payments", "assign-user", "default", "pi_guest", str(BOB), "--by", "ops")
    assert again.exit_code == 0 and "credited to user" in again.output and "already" in again.output
    assert balance(db, BOB) == OPENING[BOB] + 800 - 300
    _consistent(client, db)


def test_a_later_event_of_an_assigned_payment_naming_no_user_credits_nothing_more(client, db, run):
    _nobody_named(client)
    run("payments", "assign-user", "default", "pi_guest", str(BOB), "--by", "ops")
    assert send_stripe(client, guest_intent("pi_guest", cents=800)).json["status"] == "duplicate"
    assert balance(db, BOB) == OPENING[BOB] + 800


def test_the_operator_cannot_move_a_payment_credited_to_another_user(client, db, run):
    intent = guest_intent("pi_taken", cents=500)
    send_stripe(client, intent)
    send_stripe(client, session("pi_taken", user=ALICE, cents=500))
    refused = run("payments", "assign-user", "default", "pi_taken", str(BOB), "--by", "ops")
    assert refused.exit_code == 1
    assert f"payment pi_taken of source default is credited to user {ALICE}" in refused.output
    assert db.execute("SELECT count(*) FROM payment_users").fetchone()[0] == 0
    assert balance(db, BOB) == OPENING[BOB]


def test_an_assignment_is_never_changed(client, db, run):
    _nobody_named(client)
    db.execute("INSERT INTO payment_users (source, payment_id, user_id, assigned_by) VALUES"
               " ('default', 'pi_guest', %s, 'ops')", [ALICE])
    refused = run("payments", "assign-user", "default", "pi_guest", str(BOB), "--by", "ops")
    assert refused.exit_code == 1 and f"is assigned to user {ALICE}" in refused.output
    assert db.execute("SELECT user_id FROM payment_users").fetchall() == [(ALICE,)]
    assert _credits(db) == []


@pytest.mark.parametrize("payment_id, user, says", [
    ("pi_guest", UNKNOWN_USER, f"no user {UNKNOWN_USER}"),
    ("pi_other", BOB, "no failed or ignored event of source default credits payment pi_other naming no user"),
])
def test_assign_user_refuses_an_unknown_user_or_payment_changing_nothing(client, db, run, payment_id, user, says):
    _nobody_named(client)
    refused = run("payments", "assign-user", "default", payment_id, str(user), "--by", "ops")
    assert refused.exit_code == 1 and says in refused.output, refused.output
    assert db.execute("SELECT count(*) FROM payment_users").fetchone()[0] == 0
    assert _credits(db) == []


def test_under_no_user_ignore_a_payment_intent_ignored_before_its_session_is_credited_by_it(make_app, config, db):
    client = make_app({**config, "WEBHOOK_NO_USER": "ignore"}).test_client()
    assert send_stripe(client, guest_intent("pi_ours", cents=600)).json["status"] == "ignored"
    assert send_stripe(client, session("pi_ours", user=BOB, cents=600)).json["status"] == "processed"
    # The payment is ours now: its refund applies, to its user.
    assert send_stripe(client, refund("re_ours", "pi_ours", 200)).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB] + 600 - 200
