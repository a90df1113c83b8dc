"""Linking Stripe payments to users (money.sql's apply_event, app/intake/events.py's PaymentIntent reader): the
metadata key per source, a customer's link, payments that are not ours (WEBHOOK_NO_USER) and failed events
dismissed. Real PostgreSQL and Redis; events built by stripe-python."""

import pytest

from app.settings.config import Settings
from tests.providers.stripe.events import (
    charge_refunded,
    dispute,
    intent_succeeded,
    invoice_intent_succeeded,
    refund,
    send_stripe,
)

from .helpers import ALICE, BOB, OPENING, UNKNOWN_USER, assert_ledger_consistent, balance, samples, stored_event_row

pytestmark = [pytest.mark.core, pytest.mark.parametrize("scheme", ["stripe"])]


@pytest.fixture
def run(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _cli(app):
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _payment(db, intent_id):
    return db.execute("SELECT user_id, customer_id FROM payments WHERE payment_id = %s", [intent_id]).fetchone()


def test_a_payment_with_only_a_customer_is_credited_to_its_linked_user(client, db, run):
    assert run("users", "link", "default", "cus_bob", str(BOB), "--by", "ops").exit_code == 0
    evt = invoice_intent_succeeded("pi_invoice", "cus_bob", cents=2000)
    assert send_stripe(client, evt).json == {"status": "processed", "event_id": evt.id}
    assert balance(db, BOB) == OPENING[BOB] + 2000
    assert _payment(db, "pi_invoice") == (BOB, "cus_bob")
    assert_ledger_consistent(db, Settings.of(client.application).policy)


def test_the_metadata_names_the_user_before_the_customers_link(client, db, run):
    run("users", "link", "default", "cus_x", str(BOB), "--by", "ops")
    send_stripe(client, intent_succeeded("pi_meta", user=ALICE, cents=300, customer="cus_x"))
    assert _payment(db, "pi_meta") == (ALICE, None)
    assert balance(db, ALICE) == OPENING[ALICE] + 300 and balance(db, BOB) == OPENING[BOB]


def test_an_unlinked_customer_is_refused_then_applied_by_the_retry_once_linked(client, db, run):
    evt = invoice_intent_succeeded("pi_later", "cus_new", cents=500)
    response = send_stripe(client, evt)
    assert response.status == 422
    assert "customer cus_new is linked to no user (flask users link default cus_new USER_ID)" in \
        response.json["message"]
    linked = run("users", "link", "default", "cus_new", str(BOB), "--by", "ops")
    assert linked.exit_code == 0, linked.output
    assert f"event {evt.id} is failed for want of it: flask events replay {evt.id}" in linked.output
    assert send_stripe(client, evt).json["status"] == "processed"  # the provider's retry, same effect
    assert balance(db, BOB) == OPENING[BOB] + 500
    assert run("ledger", "verify").exit_code == 0


def test_a_link_made_later_never_moves_a_payment_credited_before(client, db, run):
    evt = intent_succeeded("pi_kept", user=ALICE, cents=250, customer="cus_k")
    send_stripe(client, evt)
    run("users", "link", "default", "cus_k", str(BOB), "--by", "ops")
    assert send_stripe(client, evt).json["status"] == "duplicate"
    assert run("events", "replay", evt.id).output.endswith("already completed; nothing changed\n")
    assert _payment(db, "pi_kept") == (ALICE, None)
    assert balance(db, BOB) == OPENING[BOB]


def test_a_link_is_never_changed(run, db):
    assert run("users", "link", "default", "cus_1", str(ALICE), "--by", "ops").exit_code == 0
    again = run("users", "link", "default", "cus_1", str(ALICE), "--by", "ops")
    assert again.exit_code == 0 and "already: nothing changed" in again.output
    moved = run("users", "link", "default", "cus_1", str(BOB), "--by", "ops")
    assert moved.exit_code == 1 and f"is linked to user {ALICE}" in moved.output
    assert db.execute("SELECT customer_id, user_id FROM customer_links").fetchall() == [("cus_1", ALICE)]


def test_a_link_needs_a_known_user(run, db):
    nobody = run("users", "link", "default", "cus_2", str(UNKNOWN_USER), "--by", "ops")
    assert nobody.exit_code == 1 and "no user" in nobody.output
    assert db.execute("SELECT count(*) FROM customer_links").fetchone()[0] == 0


def _keyed_to_bob():
    """A PaymentIntent naming Bob under the metadata key ledger_user only (a new event id each call)."""
    return intent_succeeded("pi_key", cents=400, metadata={"ledger_user": str(BOB)})


def _keyed(make_app, config):
    return make_app({**config, "WEBHOOK_USER_METADATA_KEY": "ledger_user"})


def test_the_metadata_key_is_a_per_source_setting(make_app, config, db):
    assert send_stripe(make_app(config).test_client(), _keyed_to_bob()).status == 422  # user_id, the default key
    assert send_stripe(_keyed(make_app, config).test_client(), _keyed_to_bob()).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB] + 400


def test_the_metadata_key_is_not_part_of_the_effect(make_app, config, db):
    evt = _keyed_to_bob()
    assert send_stripe(make_app(config).test_client(), evt).status == 422  # user_id, the default key, names no one
    # The same event under another key: applied, not payload_mismatch.
    assert send_stripe(_keyed(make_app, config).test_client(), evt).json["status"] == "processed"
    assert balance(db, BOB) == OPENING[BOB] + 400


def test_verify_reads_a_credit_by_the_metadata_key_it_was_decided_under(make_app, config, db):
    evt = _keyed_to_bob()
    send_stripe(make_app(config).test_client(), evt)
    send_stripe(_keyed(make_app, config).test_client(), evt)
    row = db.execute("SELECT user_metadata_key FROM webhook_events WHERE event_id = %s", [evt.id]).fetchone()
    assert row == ("ledger_user",)
    # verify reads the credit by the key it was decided under, not by today's
    assert _cli(make_app(config))("ledger", "verify").exit_code == 0


def test_a_metadata_value_that_is_no_users_key_is_refused_whatever_no_user_says(make_app, config, db):
    client = make_app({**config, "WEBHOOK_NO_USER": "ignore"}).test_client()
    response = send_stripe(client, intent_succeeded("pi_bad", metadata={"user_id": "12345"}))
    assert response.status == 422
    assert "no user has the application's key 12345 (add_user_key adds it)" in response.json["message"]


@pytest.mark.parametrize("setting, value", [("WEBHOOK_NO_USER", "drop"), ("WEBHOOK_USER_METADATA_KEY", "a b"),
                                            ("WEBHOOK_USER_METADATA_KEY", "x" * 41)])
def test_a_bad_users_setting_stops_the_app_naming_it(make_app, config, setting, value):
    from app.settings.config import ConfigError
    with pytest.raises(ConfigError, match=setting):
        make_app({**config, setting: value})


# -- payments that are not ours ------------------------------------------------------------------

@pytest.fixture
def ignoring(make_app, config):
    return make_app({**config, "WEBHOOK_NO_USER": "ignore"})


def _no_users_payment_sent_twice(ignoring):
    """A payment naming no user, delivered, then redelivered: (the event, both answers' bodies)."""
    client = ignoring.test_client()
    evt = intent_succeeded("pi_other", cents=900, metadata={"product": "another"})
    return evt, [send_stripe(client, evt).json for _ in range(2)]


def test_a_payment_with_no_user_is_ignored(ignoring, db):
    evt, answers = _no_users_payment_sent_twice(ignoring)
    assert answers[0] == {"status": "ignored", "event_id": evt.id}
    assert answers[1]["status"] == "ignored"  # a redelivery changes nothing
    assert db.execute("SELECT count(*) FROM payments").fetchone()[0] == 0


def test_an_ignored_payment_is_recorded_with_its_bytes_and_reason(ignoring, db):
    evt, _ = _no_users_payment_sent_twice(ignoring)
    row = stored_event_row(db, evt.id)
    assert row.status == "ignored" and row.body == str(evt).encode()
    assert "no user: no data.object.metadata.user_id, and no data.object.customer" in row.last_error


def test_each_delivery_of_an_ignored_payment_is_counted(ignoring, db):
    _no_users_payment_sent_twice(ignoring)
    scraped = samples(ignoring.test_client().get("/metrics").text)
    labels = (("outcome", "ignored"), ("reason", ""), ("source", "default"))
    assert scraped[("webhook_ledger_deliveries_total", labels)] == 2


def test_an_ignored_payment_is_listed_with_its_reason(ignoring, db):
    evt, _ = _no_users_payment_sent_twice(ignoring)
    listed = _cli(ignoring)("events", "list", "--status", "ignored")
    assert evt.id in listed.output and "no user" in listed.output


def _movements_of_an_ignored_payment(ignoring):
    """pi_theirs (no user) ignored, then a refunded total, a refund and a dispute of it: {type: answer's status}."""
    client = ignoring.test_client()
    send_stripe(client, intent_succeeded("pi_theirs", cents=900, metadata={}))
    return {evt.type: send_stripe(client, evt).json["status"]
            for evt in (charge_refunded("pi_theirs", 300, cents=900), refund("re_t", "pi_theirs", 200),
                        dispute("dp_t", "pi_theirs", 900))}


def test_refunds_and_disputes_of_an_ignored_payment_are_ignored(ignoring, db):
    assert _movements_of_an_ignored_payment(ignoring) == {
        "charge.refunded": "ignored", "refund.updated": "ignored", "charge.dispute.funds_withdrawn": "ignored"}
    assert db.execute("SELECT count(*) FROM movements").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone()[0] == 0


def test_verify_stays_clean_after_the_movements_of_an_ignored_payment(ignoring, db):
    _movements_of_an_ignored_payment(ignoring)
    verified = _cli(ignoring)("ledger", "verify")
    assert verified.exit_code == 0, verified.output


def test_an_ignored_payment_is_applied_by_an_explicit_replay_after_a_link_then_its_refund(ignoring, db):
    client, run = ignoring.test_client(), _cli(ignoring)
    paid = invoice_intent_succeeded("pi_late", "cus_late", cents=700)
    refunded = refund("re_late", "pi_late", 200)
    send_stripe(client, paid)
    send_stripe(client, refunded)
    assert run("events", "replay", paid.id).exit_code == 1  # still nobody's
    run("users", "link", "default", "cus_late", str(BOB), "--by", "ops")
    assert run("events", "replay", "--all-failed").output.startswith("replayed 0 failed events")  # not failed ones
    assert run("events", "replay", paid.id).output == f"{paid.id}: processed; now completed\n"
    assert run("events", "replay", refunded.id).output == f"{refunded.id}: processed; now completed\n"
    assert balance(db, BOB) == OPENING[BOB] + 500
    assert db.execute("SELECT count(*) FROM ignored_payments").fetchone()[0] == 0
    assert run("ledger", "verify").exit_code == 0


def test_no_user_is_per_source(make_app, config, db):
    from .helpers import SECRETS
    app = make_app({**config, "WEBHOOK_SOURCES": "shop", "WEBHOOK_SHOP_SECRET": SECRETS["stripe"] + "-shop",
                    "WEBHOOK_SHOP_SCHEME": "stripe", "WEBHOOK_SHOP_NO_USER": "ignore",
                    "WEBHOOK_SHOP_USER_METADATA_KEY": "uid"})
    users = Settings.of(app).sources
    assert (users["default"].users.no_user, users["shop"].users.no_user) == ("refuse", "ignore")
    assert users["shop"].users.metadata_key == "uid" and users["default"].users.metadata_key == "user_id"


# -- failed events dismissed ---------------------------------------------------------------------

def _dismissed(client, run):
    """A payment naming no user, refused (422) and dismissed by ana: its event."""
    evt = intent_succeeded("pi_dead", metadata={}, cents=100)
    assert send_stripe(client, evt).status == 422
    assert run("events", "replay", "--all-failed").exit_code == 1  # failed, before it is dismissed
    dismissed = run("events", "dismiss", evt.id, "--reason", "a Payment Link of another product", "--by", "ana")
    assert dismissed.exit_code == 0, dismissed.output
    return evt


def test_a_failed_event_is_dismissed_with_its_reason_kept(client, db, run):
    evt = _dismissed(client, run)
    row = db.execute("SELECT status, dismissed_reason, dismissed_by, dismissed_at IS NOT NULL, last_error"
                     " FROM webhook_events WHERE event_id = %s", [evt.id]).fetchone()
    assert row[:4] == ("dismissed", "a Payment Link of another product", "ana", True) and "no user" in row[4]


def test_a_dismissed_event_is_listed_with_its_reason(client, db, run):
    _dismissed(client, run)
    assert "dismissed by ana: a Payment Link of another product" in run("events", "list").output


def test_a_dismissed_event_is_never_replayed(client, db, run):
    _dismissed(client, run)
    replayed = run("events", "replay", "--all-failed")
    assert replayed.exit_code == 0 and replayed.output.startswith("replayed 0 failed events")


def test_a_dismissed_events_redelivery_is_ignored(client, db, run):
    evt = _dismissed(client, run)
    assert send_stripe(client, evt).json["status"] == "ignored"  # the provider's retry: closed


def test_a_dismissed_event_is_not_dismissed_again(client, db, run):
    evt = _dismissed(client, run)
    again = run("events", "dismiss", evt.id, "--reason", "twice", "--by", "ana")
    assert again.exit_code == 1 and "is dismissed: only a failed event is dismissed" in again.output


def test_verify_stays_clean_after_a_dismissal(client, db, run):
    send_stripe(client, _dismissed(client, run))  # and the provider's retry
    assert run("ledger", "verify").exit_code == 0


def test_dismiss_needs_a_stored_event(run):
    assert run("events", "dismiss", "evt_none", "--reason", "x", "--by", "ana").exit_code == 1


@pytest.mark.parametrize("reason", [[], ["--reason", "  "]], ids=["missing", "blank"])
def test_dismiss_needs_a_reason(run, reason):
    assert run("events", "dismiss", "evt_none", *reason, "--by", "ana").exit_code == 2
