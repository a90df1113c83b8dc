"""The ledger stays right when a setting changes: an event refused by a setting (STRIPE_ACCEPT_TEST_EVENTS,
LEDGER_CURRENCY) is applied by the provider's retry or by `flask events replay` once the setting allows it,
with no mismatch counted, because its effect is hashed from its bytes alone; `flask ledger verify` judges each
event by the settings it was decided under, recorded with it. And one depth limit for every path. Stripe's
events are built and signed by stripe-python; real PostgreSQL and Redis."""

import json

import pytest

from tests.helpers import ALICE, BOB, UNKNOWN_USER, assert_ledger_consistent, balance, payment, send, stored_event_row
from tests.providers.stripe.events import intent_succeeded, send_stripe

pytestmark = pytest.mark.core

STRIPE = pytest.mark.parametrize("scheme", ["stripe"])


def _stripe_client(make_app, config, **settings):
    return make_app({**config, **settings}).test_client()


def _cli(make_app, config, *args, **settings):
    return make_app({**config, **settings}).test_cli_runner().invoke(args=list(args))


@STRIPE
@pytest.mark.parametrize("applied_by", ["retry", "replay"])
def test_a_test_mode_event_refused_is_applied_once_test_events_are_accepted(make_app, config, db, applied_by):
    test_mode = intent_succeeded("pi_test_mode", user=BOB, cents=300)
    test_mode["livemode"] = False
    refused = send_stripe(_stripe_client(make_app, config), test_mode)
    assert refused.status == 422 and "STRIPE_ACCEPT_TEST_EVENTS=true" in refused.json["message"]
    if applied_by == "retry":  # Stripe's next attempt, after the operator set it
        answer = send_stripe(_stripe_client(make_app, config, STRIPE_ACCEPT_TEST_EVENTS="true"), test_mode).json
        assert answer == {"status": "processed", "event_id": test_mode.id}
    else:
        result = _cli(make_app, config, "events", "replay", test_mode.id, STRIPE_ACCEPT_TEST_EVENTS="true")
        assert result.exit_code == 0 and "processed; now completed" in result.output, result.output
    stored = stored_event_row(db, test_mode.id)
    assert (stored.status, stored.mismatches, stored.attempts) == ("completed", 0, 2)
    assert balance(db, BOB) == 300


@STRIPE
@pytest.mark.parametrize("applied_by", ["retry", "replay"])
def test_a_payment_refused_for_its_currency_is_credited_once_the_ledger_currency_is_fixed(make_app, config, db,
                                                                                        applied_by):
    euros = intent_succeeded("pi_euro", user=BOB, cents=700, currency="eur")
    assert send_stripe(_stripe_client(make_app, config), euros).status == 422  # LEDGER_CURRENCY usd
    # Nothing has moved yet: the ledger may change currency (docs/operations.md), then the setting.
    assert _cli(make_app, config, "ledger", "set-currency", "eur").exit_code == 0
    if applied_by == "retry":
        assert send_stripe(_stripe_client(make_app, config, LEDGER_CURRENCY="eur"), euros).json["status"] == \
            "processed"
    else:
        result = _cli(make_app, config, "events", "replay", "--all-failed", LEDGER_CURRENCY="eur")
        assert result.exit_code == 0, result.output
    assert stored_event_row(db, euros.id).mismatches == 0
    assert balance(db, BOB) == 700
    assert db.execute("SELECT currency FROM payments WHERE payment_id = 'pi_euro'").fetchone()[0] == "eur"


def _failed_for_its_user_under_test_events_accepted(make_app, config, db):
    """A test-mode payment for a user not yet created, refused under STRIPE_ACCEPT_TEST_EVENTS=true: failed."""
    test_mode = intent_succeeded("pi_user_later", user=UNKNOWN_USER, cents=300)
    test_mode["livemode"] = False
    answer = send_stripe(_stripe_client(make_app, config, STRIPE_ACCEPT_TEST_EVENTS="true"), test_mode)
    assert answer.status == 422 and "unknown user" in answer.json["message"], answer.json
    return test_mode, stored_event_row(db, test_mode.id)


@STRIPE
def test_a_replay_from_a_shell_without_the_services_settings_keeps_the_events_own_error(make_app, config, db):
    test_mode, failed = _failed_for_its_user_under_test_events_accepted(make_app, config, db)
    # This shell has no STRIPE_ACCEPT_TEST_EVENTS: the event is decided again under the settings recorded with it.
    result = _cli(make_app, config, "events", "replay", "--all-failed")
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"{test_mode.id}: still failed: {failed.last_error}",
                                          "replayed 1 failed events: 0 completed, 1 still failed"]
    assert stored_event_row(db, test_mode.id).last_error == failed.last_error


@STRIPE
def test_a_replay_from_a_shell_without_the_services_settings_applies_the_event_as_the_service_would(
        make_app, config, db):
    test_mode, _ = _failed_for_its_user_under_test_events_accepted(make_app, config, db)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    result = _cli(make_app, config, "events", "replay", test_mode.id)
    assert (result.exit_code, result.output) == (0, f"{test_mode.id}: processed; now completed\n")
    assert balance(db, UNKNOWN_USER) == 300
    assert db.execute("SELECT test_events_accepted FROM webhook_events WHERE event_id = %s",
                      [test_mode.id]).fetchone() == (True,)


@STRIPE
def test_a_payment_that_named_no_user_is_replayed_under_the_metadata_key_the_operator_set(make_app, config, db):
    paid = intent_succeeded("pi_other_key", metadata={"account": str(BOB)}, cents=400)
    assert send_stripe(_stripe_client(make_app, config), paid).status == 422  # no user_id in its metadata
    result = _cli(make_app, config, "events", "replay", paid.id, WEBHOOK_USER_METADATA_KEY="account")
    assert (result.exit_code, result.output) == (0, f"{paid.id}: processed; now completed\n")
    assert balance(db, BOB) == 400


@STRIPE
def test_a_replay_that_only_this_shells_setting_would_refuse_is_skipped_and_leaves_the_event(make_app, config, db):
    paid = intent_succeeded("pi_no_link", metadata={"account": ""}, customer="cus_none", cents=400)  # no user, no key
    assert send_stripe(_stripe_client(make_app, config), paid).status == 422  # no user, no link
    failed = stored_event_row(db, paid.id)
    result = _cli(make_app, config, "events", "replay", paid.id, WEBHOOK_USER_METADATA_KEY="account")
    assert result.exit_code == 1
    assert result.output == (
        f"skipped 1 event of source 'default', left as stored: this shell's WEBHOOK_USER_METADATA_KEY refuses it; "
        f"it was decided under LEDGER_CURRENCY=usd, STRIPE_ACCEPT_TEST_EVENTS=false, "
        f"WEBHOOK_USER_METADATA_KEY=user_id, WEBHOOK_NO_USER=refuse: {paid.id}\n")
    assert stored_event_row(db, paid.id) == failed


@STRIPE
def test_an_event_decided_under_another_ledger_currency_is_skipped_and_keeps_its_error(make_app, config, db):
    dollars = intent_succeeded("pi_user_later_usd", user=UNKNOWN_USER, cents=300)
    assert send_stripe(_stripe_client(make_app, config), dollars).status == 422  # unknown user, under usd
    failed = stored_event_row(db, dollars.id)
    assert _cli(make_app, config, "ledger", "set-currency", "eur").exit_code == 0  # nothing has moved yet
    result = _cli(make_app, config, "events", "replay", "--all-failed", LEDGER_CURRENCY="eur")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"skipped 1 event of source 'default', left as stored: decided under LEDGER_CURRENCY=usd, and the "
        f"ledger's is eur: {dollars.id}",
        "replayed 0 failed events: 0 completed, 0 still failed; skipped 1"]
    assert stored_event_row(db, dollars.id) == failed


@STRIPE
def test_verify_judges_each_event_by_the_settings_it_was_decided_under(make_app, config, db):
    test_mode = intent_succeeded("pi_accepted_then", user=BOB, cents=300)
    test_mode["livemode"] = False
    assert send_stripe(_stripe_client(make_app, config, STRIPE_ACCEPT_TEST_EVENTS="true"), test_mode).status \
        == 200
    stored = db.execute("SELECT ledger_currency, test_events_accepted FROM webhook_events WHERE event_id = %s",
                        [test_mode.id]).fetchone()
    assert stored == ("usd", True)
    verified = _cli(make_app, config, "ledger", "verify")  # test events refused again today
    assert verified.exit_code == 0, verified.output
    assert f"completed event {test_mode.id!r}: today's STRIPE_ACCEPT_TEST_EVENTS refuses it; it was decided under " \
           "LEDGER_CURRENCY=usd, STRIPE_ACCEPT_TEST_EVENTS=true" in verified.output
    assert "1 events decided under other settings than this command's" in verified.output


@STRIPE
def test_a_completed_event_its_own_settings_refuse_is_reported(make_app, config, db):
    paid = intent_succeeded("pi_forged_mode", user=BOB, cents=300)
    assert send_stripe(_stripe_client(make_app, config), paid).status == 200
    # Its bytes changed to test mode after the fact, hash kept: the settings it was decided under refuse it.
    forged = json.dumps({**json.loads(str(paid)), "livemode": False}).encode()
    db.execute("UPDATE webhook_events SET body = %s, payload_sha256 = sha256(%s) WHERE event_id = %s",
               [forged, forged, paid.id])
    verified = _cli(make_app, config, "ledger", "verify")
    assert verified.exit_code == 1
    assert f"completed event {paid.id!r}: a test-mode event" in verified.output


def test_an_implied_currency_and_the_ledgers_named_are_one_credit(client, db):
    assert send(client, payment("evt_implied", cents=10)).json["status"] == "processed"
    assert send(client, payment("evt_implied", cents=10, currency="usd")).json["status"] == "duplicate"
    assert balance(db, ALICE) == 1010


def _nested(depth):
    """A payment whose data holds a value nested depth levels deep in all (the body's object is level 1)."""
    event = payment("evt_deep", cents=5)
    event["data"]["note"] = json.loads("[" * (depth - 2) + "]" * (depth - 2))
    return json.dumps(event).encode()


def test_a_body_nested_beyond_the_limit_is_400(client, db):
    response = send(client, _nested(65))
    assert (response.status, response.json["error"]) == (400, "invalid_json")
    assert response.json["message"] == "body is nested more than 64 levels deep"


def test_a_body_nested_beyond_the_limit_writes_nothing(client, db):
    send(client, _nested(65))
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 0


def _send_at_the_limit(client):
    assert send(client, _nested(64)).json["status"] == "processed"


def test_a_body_at_the_limit_is_applied(client, db):
    _send_at_the_limit(client)
    assert balance(db, ALICE) == 1005


def test_events_replay_finds_a_body_at_the_limit_already_completed(app, client, db):
    _send_at_the_limit(client)
    assert app.test_cli_runner().invoke(args=["events", "replay", "evt_deep"]).output.strip() == \
        "evt_deep: already completed; nothing changed"


def test_ledger_verify_reads_a_body_at_the_limit_as_the_live_path_did(app, client, db):
    _send_at_the_limit(client)
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output
    assert_ledger_consistent(db)
