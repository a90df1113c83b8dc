"""The application's own keys of its users (user_keys, money.sql's add_user_key and user_of): an application names
a user by the integer or text key it already has, in its calls and in the metadata it puts on a Stripe payment,
which credits that user (verified against the key); a key unknown when the payment arrives is a 422 recorded,
applied by the provider's retry once the key exists. Stripe's events are built and signed by stripe-python; real
PostgreSQL and Redis."""

import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from app.intake import events
from tests.application import call
from tests.helpers import ALICE, OPENING, assert_ledger_consistent, balance, db_url, payment, send
from tests.providers.stripe.events import checkout_session, intent_succeeded, send_stripe

pytestmark = pytest.mark.core
STRIPE = pytest.mark.parametrize("scheme", ["stripe"])

CAROL = uuid.UUID("44444444-4444-4444-8444-444444444444")


def add_key(conn, key, **options):
    return call(conn, "add_user_key", key=key, **options)


def user_of(conn, key):
    return conn.execute("SELECT user_of(%s)", [key]).fetchone()[0]


@STRIPE
def test_a_stripe_payment_whose_metadata_names_an_integer_key_credits_that_user(client, db):
    user = add_key(db, "4217").user_id
    response = send_stripe(client, intent_succeeded("pi_keyed", metadata={"user_id": "4217"}, cents=900))
    assert (response.status, response.json["status"]) == (200, "processed")
    assert balance(db, user) == 900
    assert db.execute("SELECT user_id, amount_cents FROM payments WHERE payment_id = 'pi_keyed'").fetchone() == \
        (user, 900)
    assert_ledger_consistent(db)


@STRIPE
def test_a_checkout_sessions_client_reference_id_names_the_user_by_its_key(client, db):
    user = add_key(db, "acme-user-77").user_id
    response = send_stripe(client, checkout_session("pi_session", user="acme-user-77", cents=1200))
    assert response.status == 200, response.json
    assert balance(db, user) == 1200
    assert_ledger_consistent(db)


@STRIPE
def test_a_payment_naming_no_users_key_waits_for_the_key_then_the_retry_credits(client, db):
    evt = intent_succeeded("pi_early", metadata={"user_id": "5150"}, cents=300)
    refused = send_stripe(client, evt)
    assert (refused.status, refused.json["error"]) == (422, "unprocessable")
    assert "no user has the application's key 5150" in refused.json["message"]
    user = add_key(db, "5150").user_id
    assert send_stripe(client, evt).json["status"] == "processed"  # Stripe's retry
    assert balance(db, user) == 300
    assert_ledger_consistent(db)


def test_the_application_calls_its_functions_with_its_key(db):
    add_key(db, "42", user=ALICE)
    assert user_of(db, "42") == ALICE
    spent = db.execute("SELECT outcome, balance_cents FROM spend(p_user => user_of('42'), p_cents => 250,"
                       " p_reference => 'order-1')").fetchone()
    assert spent == ("spent", OPENING[ALICE] - 250)
    with pytest.raises(psycopg.errors.NoDataFound, match="no user has the key 43"):
        user_of(db, "43")


def test_a_key_is_added_once_and_never_changed(db):
    first = add_key(db, "42", opening=500)
    assert (first.added, first.opening_balance_cents) == (True, 500)
    again = add_key(db, "42", opening=500)
    assert (again.user_id, again.added) == (first.user_id, False)
    with pytest.raises(psycopg.errors.UniqueViolation, match=f"key 42 is user {first.user_id}'s, not user {CAROL}'s"):
        add_key(db, "42", user=CAROL)
    with pytest.raises(psycopg.errors.UniqueViolation, match=f"user {first.user_id} has another key"):
        add_key(db, "43", user=first.user_id)
    assert db.execute("SELECT app_key, user_id FROM user_keys").fetchall() == [("42", first.user_id)]


@pytest.mark.parametrize("key", ["", "k" * 256, None], ids=["empty", "too-long", "none"])
def test_a_key_that_cannot_be_one_is_refused(db, key):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be 1 to 255 characters"):
        add_key(db, key)


def test_concurrent_adds_of_one_key_make_one_user(db):
    def add_alone(_):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            return add_key(conn, "42").user_id

    with ThreadPoolExecutor(8) as pool:
        users = set(pool.map(add_alone, range(8)))
    assert len(users) == 1
    assert db.execute("SELECT count(*) FROM user_balances").fetchone() == (len(OPENING) + 1,)


@STRIPE
def test_a_subscription_sessions_key_links_its_customer_to_that_user(client, db):
    user = add_key(db, "acme-9").user_id
    session = checkout_session(None, mode="subscription", user="acme-9", customer="cus_9")
    assert send_stripe(client, session).json["status"] == "processed"
    assert db.execute("SELECT user_id FROM customer_links WHERE customer_id = 'cus_9'").fetchone() == (user,)


def test_this_services_own_payment_names_the_user_by_an_integer_key(client, db):
    user = add_key(db, "4217").user_id
    assert send(client, payment("evt_int_key", cents=600, userId=4217)).json["status"] == "processed"  # a JSON number
    assert balance(db, user) == 600
    assert_ledger_consistent(db)


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def test_a_payment_refused_before_keys_for_a_user_not_a_uuid_applies_after_init_db(client, db, run, monkeypatch,
                                                                                    redis_client):
    """As the previous release stored it: failed (422: its userId not a UUID), with a refusal's effect, of effect
    version 8. init-db recomputes that effect from the bytes, so the retry is no 409 payload_mismatch: it credits
    the key's user once."""
    paid = payment("evt_before_keys", user="4217", cents=700)
    with monkeypatch.context() as before:
        before.setattr(events, "_problem", lambda rule, fields: "data.userId must be a user's UUID")
        assert send(client, paid).status == 422
    db.execute("UPDATE webhook_events SET effect_version = 8")
    user = add_key(db, "4217").user_id
    redis_client.flushall()
    recomputed = run("init-db")
    assert "recomputed the effects of 1 stored events" in recomputed.output, recomputed.output
    assert send(client, paid).json["status"] == "processed"
    assert send(client, paid).json["status"] == "duplicate"
    assert balance(db, user) == 700
    assert run("ledger", "verify").exit_code == 0


@pytest.mark.parametrize("key", ["", "k" * 256, "a\x00b", str(CAROL)], ids=["empty", "too-long", "nul", "a-uuid"])
def test_users_add_refuses_a_key_that_cannot_be_one_in_one_line_adding_nothing(db, run, key):
    """A UUID's spelling would be read as that UUID in a payment's metadata, never as the key."""
    refused = run("users", "add", str(CAROL), "--key", key)
    assert refused.exit_code == 2 and "cannot be a key" in refused.output, refused.output
    assert refused.exception is None or isinstance(refused.exception, SystemExit)
    assert db.execute("SELECT count(*) FROM user_balances WHERE user_id = %s", [CAROL]).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM user_keys").fetchone() == (0,)


@pytest.mark.parametrize("name", ["a\x00b", "k" * 300], ids=["nul", "too-long"])
@pytest.mark.parametrize("command", [["users", "show"], ["users", "statement", "--from", "2026-01-01"]],
                         ids=["show", "statement"])
def test_a_user_named_by_what_cannot_be_a_key_is_refused_in_one_line(db, run, command, name):
    refused = run(*command[:2], name, *command[2:])
    assert refused.exit_code == 1 and "Error: no user has the key" in refused.output, refused.output
    assert isinstance(refused.exception, SystemExit)
    assert len(refused.output.splitlines()) == 1
