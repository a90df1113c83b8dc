"""Every way money moves on a payment, on the real endpoint: refund objects that count, fail and come back,
running totals beside them, disputes withdrawn and reinstated, and captures of any Stripe API version. Events
are built by stripe-python as Stripe's API reference shows them (tests/providers/stripe/events.py); real PostgreSQL and
Redis."""

import logging

import pytest
from psycopg.rows import dict_row

from app.store.outcome import Outcome
from tests.providers.stripe.events import BEFORE_BASIL, charge_refunded, dispute, intent_succeeded, refund, send_stripe

from .helpers import ALICE, BOB, assert_ledger_consistent, balance, samples, stored_event_row

pytestmark = [pytest.mark.core, pytest.mark.parametrize("scheme", ["stripe"])]


def _journal(db):
    """The journal's balance changes after the credits, in order: (kind, movement, cents)."""
    return db.execute("SELECT kind, movement_id, amount_cents FROM ledger_journal WHERE kind <> 'credit'"
                      " ORDER BY id").fetchall()


def _account(db, payment_id):
    return db.cursor(row_factory=dict_row).execute(
        "SELECT refunded_total_cents, refunds_known_cents, refunds_applied_cents, refunds_reversed_cents,"
        " disputes_withdrawn_cents, disputes_reinstated_cents, debit_due_cents, debited_cents"
        " FROM payment_accounts WHERE payment_id = %s", [payment_id]).fetchone()


def _counted(client, name):
    return samples(client.get("/metrics").get_data(as_text=True)).get((name, (("source", "default"),)), 0)


def _send_all(client, *events):
    return [send_stripe(client, e).json["status"] for e in events]


@pytest.fixture
def paid(client, db):
    """pi_m credited: 1000 cents to Bob."""
    assert send_stripe(client, intent_succeeded("pi_m", user=BOB, cents=1000)).json["status"] == "processed"
    return "pi_m"


# -- refund objects ------------------------------------------------------------------

@pytest.mark.parametrize("status", ["pending", "requires_action", "succeeded"])
def test_a_counted_refund_object_debits_its_amount_once(client, db, paid, status):
    created = refund("re_1", paid, 300, status=status, event_type="refund.created")
    assert _send_all(client, created, refund("re_1", paid, 300, status="succeeded"), created) == \
        ["processed", "processed", "duplicate"]
    assert balance(db, BOB) == 700
    assert _journal(db) == [("refund", "re_1", -300)]
    assert _counted(client, "webhook_ledger_refunds_applied_total") == 1
    assert_ledger_consistent(db)


@pytest.mark.parametrize("status", ["failed", "canceled"])
def test_a_refund_that_fails_after_it_was_debited_comes_back_once(client, db, paid, status):
    _send_all(client, refund("re_f", paid, 400, status="pending", event_type="refund.created"))
    failed = refund("re_f", paid, 400, status=status)
    assert _send_all(client, failed, refund("re_f", paid, 400, status=status)) == ["processed", "processed"]
    assert balance(db, BOB) == 1000
    assert _journal(db) == [("refund", "re_f", -400), ("refund_reversed", "re_f", 400)]
    assert _counted(client, "webhook_ledger_refunds_reversed_total") == 1
    assert_ledger_consistent(db)


def _failed_first(client, paid):
    """re_x's refund.failed, before its refund was ever announced: its status."""
    return _send_all(client, refund("re_x", paid, 250, status="failed"))


def test_a_failure_before_its_refund_nets_zero(client, db, paid):
    assert _failed_first(client, paid) == ["processed"]
    assert balance(db, BOB) == 1000
    assert _journal(db) == []
    assert _account(db, paid)["refunds_reversed_cents"] == 250
    assert_ledger_consistent(db)


def test_a_refund_announced_after_its_failure_debits_nothing(client, db, paid):
    _failed_first(client, paid)
    assert _send_all(client, refund("re_x", paid, 250, status="pending", event_type="refund.created")) == \
        ["processed"]
    assert balance(db, BOB) == 1000
    assert _journal(db) == []
    assert _account(db, paid)["refunds_reversed_cents"] == 250
    assert_ledger_consistent(db)


def test_charge_refund_updated_carries_the_same_refund(client, db, paid):
    assert _send_all(client, refund("re_c", paid, 100, event_type="charge.refund.updated"),
                     refund("re_c", paid, 100, event_type="refund.created")) == ["processed", "processed"]
    assert balance(db, BOB) == 900
    assert_ledger_consistent(db)


# One refund, re_both, announced by charge.refunded's running total and by its refund object, in either order.
BOTH_ORDERS = pytest.mark.parametrize("order", ["total-first", "object-first"])


def _announced_by_its_total_and_its_object(client, paid, order):
    total = charge_refunded(paid, 300, cents=1000)
    created = refund("re_both", paid, 300, status="succeeded", event_type="refund.created")
    _send_all(client, *((total, created) if order == "total-first" else (created, total)))


def _then_failed(client, paid, order):
    _announced_by_its_total_and_its_object(client, paid, order)
    _send_all(client, refund("re_both", paid, 300, status="failed"))


@BOTH_ORDERS
def test_one_refund_announced_by_its_total_and_its_object_is_debited_once(client, db, paid, order):
    _announced_by_its_total_and_its_object(client, paid, order)
    assert balance(db, BOB) == 700
    assert sum(cents for _, _, cents in _journal(db)) == -300


@BOTH_ORDERS
def test_the_failure_of_a_refund_announced_by_its_total_and_its_object_comes_back(client, db, paid, order):
    _then_failed(client, paid, order)
    assert balance(db, BOB) == 1000


@BOTH_ORDERS
def test_a_second_refund_after_the_failed_one_debits_only_its_own_amount(client, db, paid, order):
    _then_failed(client, paid, order)
    # A second refund later raises the total to 500 (Stripe's total still counts the failed one, or not):
    # either way only the new 200 is debited beyond the refunds known.
    _send_all(client, charge_refunded(paid, 500, cents=1000), refund("re_2", paid, 200, event_type="refund.created"))
    assert balance(db, BOB) == 800
    assert _account(db, paid) == {
        "refunded_total_cents": 500, "refunds_known_cents": 500, "refunds_applied_cents": 200,
        "refunds_reversed_cents": 300, "disputes_withdrawn_cents": 0, "disputes_reinstated_cents": 0,
        "debit_due_cents": 200, "debited_cents": 200}
    assert_ledger_consistent(db)


def test_a_total_beyond_the_refund_objects_known_debits_only_the_rest(client, db, paid):
    _send_all(client, refund("re_a", paid, 100, event_type="refund.created"), charge_refunded(paid, 350, cents=1000))
    assert balance(db, BOB) == 650
    _send_all(client, refund("re_b", paid, 250, event_type="refund.created"))  # the rest, announced at last
    assert balance(db, BOB) == 650
    assert_ledger_consistent(db)


MALFORMED_REFUNDS = pytest.mark.parametrize("change, reason", [
    ({"status": "refunded"}, "data.object.status must be one of pending, requires_action, succeeded, failed"),
    ({"cents": 0}, "data.object.amount must be a positive integer"),
    ({"cents": 1001}, "refund re_bad of 1001 cents is above payment pi_m's 1000 cents"),
    ({"refund_id": None}, "data.object.id must be an id"),
    ({"currency": "eur"}, "refund in eur of payment pi_m, which was in usd"),
])


def _malformed(client, paid, change):
    """re_bad of 500 cents with change sent: (the event, its answer)."""
    args = {"refund_id": "re_bad", "cents": 500, **change}
    bad = refund(args.pop("refund_id"), paid, args.pop("cents"), **args)
    return bad, send_stripe(client, bad)


@MALFORMED_REFUNDS
def test_a_malformed_refund_object_is_422_recorded_as_failed(client, db, paid, change, reason):
    bad, response = _malformed(client, paid, change)
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert reason in response.json["message"]
    assert stored_event_row(db, bad.id).status == "failed"


@MALFORMED_REFUNDS
def test_a_malformed_refund_object_debits_nothing(client, db, paid, change, reason):
    _malformed(client, paid, change)
    assert balance(db, BOB) == 1000
    assert_ledger_consistent(db)


def test_a_refund_object_announced_with_another_amount_is_409_payment_mismatch(client, db, paid):
    _send_all(client, refund("re_m", paid, 100, event_type="refund.created"))
    other = refund("re_m", paid, 150, status="failed")
    response = send_stripe(client, other)
    assert (response.status, response.json["error"]) == (409, "payment_mismatch")
    assert "refund re_m was announced by event" in response.json["message"]
    assert balance(db, BOB) == 900
    assert_ledger_consistent(db)


def test_a_refund_object_before_its_payment_is_422_then_applied_by_the_retry(client, db):
    early = refund("re_early", "pi_late", 100, event_type="refund.created")
    response = send_stripe(client, early)
    assert (response.status, response.json["message"]) == (422, "unknown payment pi_late")
    send_stripe(client, intent_succeeded("pi_late", cents=500))
    assert send_stripe(client, early).json["status"] == "processed"
    assert balance(db, ALICE) == 1000 + 500 - 100
    assert_ledger_consistent(db)


def test_a_refund_of_an_authorisation_that_expired_uncaptured_moves_nothing(client, db, paid):
    released = refund("re_exp", paid, 1000, event_type="refund.created", reason="expired_uncaptured_charge")
    assert send_stripe(client, released).json["status"] == "processed"
    assert balance(db, BOB) == 1000
    assert _journal(db) == []


# -- disputes ---------------------------------------------------------------------------

def _withdraw(client, paid):
    """du_1 opened, then its funds withdrawn, announced twice."""
    withdrawn = dispute("du_1", paid, 600)
    return _send_all(client, dispute("du_1", paid, 600, event_type="charge.dispute.created"), withdrawn,
                     dispute("du_1", paid, 600))


def test_a_dispute_withdraws_its_amount_once(client, db, paid):
    assert _withdraw(client, paid) == ["processed", "processed", "processed"]
    assert balance(db, BOB) == 400
    assert _journal(db) == [("dispute_withdrawn", "du_1", -600)]
    assert _counted(client, "webhook_ledger_disputes_withdrawn_total") == 1
    assert_ledger_consistent(db)


def test_a_won_dispute_is_reinstated_once(client, db, paid):
    _withdraw(client, paid)
    reinstated = dispute("du_1", paid, 600, event_type="charge.dispute.funds_reinstated", status="won")
    assert _send_all(client, reinstated, dispute("du_1", paid, 600, event_type="charge.dispute.closed", status="won"),
                     dispute("du_1", paid, 600, event_type="charge.dispute.funds_reinstated", status="won")) == \
        ["processed", "processed", "processed"]
    assert balance(db, BOB) == 1000
    assert _journal(db) == [("dispute_withdrawn", "du_1", -600), ("dispute_reinstated", "du_1", 600)]
    assert _counted(client, "webhook_ledger_disputes_reinstated_total") == 1
    assert_ledger_consistent(db)


# The dispute events that move no funds: an inquiry opened, updated or closed, a dispute opened, or lost.
NO_FUNDS_MOVED = pytest.mark.parametrize("event_type, status", [
    ("charge.dispute.created", "warning_needs_response"), ("charge.dispute.updated", "warning_under_review"),
    ("charge.dispute.closed", "warning_closed"), ("charge.dispute.created", "needs_response"),
    ("charge.dispute.closed", "lost"),
])


@NO_FUNDS_MOVED
def test_opening_updating_or_closing_a_dispute_or_an_inquiry_moves_nothing(client, db, paid, event_type, status):
    send_stripe(client, dispute("du_w", paid, 1000, event_type=event_type, status=status))
    assert balance(db, BOB) == 1000


@NO_FUNDS_MOVED
def test_opening_updating_or_closing_a_dispute_or_an_inquiry_is_recorded_completed(
        client, db, paid, event_type, status):
    opened = dispute("du_w", paid, 1000, event_type=event_type, status=status)
    assert send_stripe(client, opened).json["status"] == "processed"
    assert stored_event_row(db, opened.id).status == "completed"


def test_a_reinstatement_before_its_withdrawal_nets_zero(client, db, paid):
    _send_all(client, dispute("du_r", paid, 300, event_type="charge.dispute.funds_reinstated", status="won"),
              dispute("du_r", paid, 300))
    assert balance(db, BOB) == 1000
    assert _journal(db) == []
    assert_ledger_consistent(db)


def test_a_dispute_of_an_unknown_payment_is_422(client, db):
    response = send_stripe(client, dispute("du_u", "pi_nowhere", 100))
    assert (response.status, response.json["message"]) == (422, "unknown payment pi_nowhere")


def test_refunds_and_disputes_together_never_take_more_than_the_payment(client, db, paid):
    _send_all(client, refund("re_all", paid, 1000, event_type="refund.created"), dispute("du_all", paid, 1000))
    assert balance(db, BOB) == 0
    assert _account(db, paid)["debit_due_cents"] == 1000
    # The refund fails: the dispute still holds the money back.
    _send_all(client, refund("re_all", paid, 1000, status="failed"))
    assert balance(db, BOB) == 0
    # The dispute is won as well: all of it back.
    _send_all(client, dispute("du_all", paid, 1000, event_type="charge.dispute.funds_reinstated", status="won"))
    assert balance(db, BOB) == 1000
    assert_ledger_consistent(db)


# -- captures of any API version ----------------------------------------------------------

def test_a_partial_capture_before_basil_debits_no_released_authorisation(client, db):
    assert send_stripe(client, intent_succeeded("pi_cap", cents=6000, authorized=10000)).json["status"] == "processed"
    released = charge_refunded("pi_cap", 4000, cents=10000, captured=6000, api_version=BEFORE_BASIL)
    assert send_stripe(client, released).json["status"] == "processed"
    assert balance(db, ALICE) == 1000 + 6000
    # A real refund of 1000 later: the total counts the release and the refund.
    refunded = charge_refunded("pi_cap", 5000, cents=10000, captured=6000, api_version=BEFORE_BASIL)
    assert send_stripe(client, refunded).json["status"] == "processed"
    assert balance(db, ALICE) == 1000 + 6000 - 1000
    assert_ledger_consistent(db)


ACACIA = "2024-10-28.acacia"  # the first version that sends refund.* for a charge's refunds


def test_a_failed_refund_reaches_the_ledger_under_the_subscription_for_partial_captures(client, db):
    """docs/providers/stripe.md: a partially capturing account before basil subscribes to charge.refunded and
    refund.failed (acacia's event version): the refund the total took is given back when it fails."""
    send_stripe(client, intent_succeeded("pi_capf", cents=6000, authorized=10000))
    for total in (4000, 6000):  # the released authorisation, then a real refund of 2000
        sent = charge_refunded("pi_capf", total, cents=10000, captured=6000, api_version=ACACIA)
        assert send_stripe(client, sent).json["status"] == "processed"
    assert balance(db, ALICE) == 1000 + 6000 - 2000
    failed = refund("re_capf", "pi_capf", 2000, status="failed")
    failed["api_version"] = ACACIA
    assert send_stripe(client, failed).json["status"] == "processed"
    assert balance(db, ALICE) == 1000 + 6000
    assert_ledger_consistent(db)


def test_a_partial_capture_since_basil_counts_only_refunds_in_its_total(client, db):
    send_stripe(client, intent_succeeded("pi_cap2", cents=6000, authorized=10000))
    assert send_stripe(client, charge_refunded("pi_cap2", 1000, cents=10000, captured=6000)).json["status"] == \
        "processed"
    assert balance(db, ALICE) == 1000 + 6000 - 1000
    assert_ledger_consistent(db)


@pytest.mark.parametrize("captured, api_version", [(0, BEFORE_BASIL), (0, "2025-03-31.basil"), (None, BEFORE_BASIL)],
                         ids=["zero-before-basil", "zero-basil", "null-uncaptured"])
def test_a_canceled_authorisation_is_200_with_no_money_moved(client, db, captured, api_version):
    canceled = charge_refunded("pi_never", 5000, cents=5000, captured=0, api_version=api_version)
    if captured is None:  # before basil a canceled charge's amount_captured could be null, captured false
        canceled["data"]["object"]["amount_captured"] = None
    response = send_stripe(client, canceled)
    assert (response.status, response.json["status"]) == (200, "processed")
    assert stored_event_row(db, canceled.id).status == "completed"
    assert balance(db, ALICE) == 1000
    assert_ledger_consistent(db)


def test_a_partially_captured_charge_without_an_api_version_is_422(client, db):
    send_stripe(client, intent_succeeded("pi_nov", cents=6000, authorized=10000))
    unversioned = charge_refunded("pi_nov", 5000, cents=10000, captured=6000)
    unversioned["api_version"] = None
    response = send_stripe(client, unversioned)
    assert response.status == 422
    assert "api_version must name a Stripe API version" in response.json["message"]
    assert balance(db, ALICE) == 7000


# -- what operators see -------------------------------------------------------------------

def _applied_then_reversed(client, paid):
    """re_seen counted, then failed: the failure's event."""
    failed = refund("re_seen", paid, 100, status="failed")
    _send_all(client, refund("re_seen", paid, 100, event_type="refund.created"), failed)
    return failed


def test_the_delivery_line_names_the_movement(client, db, paid, caplog):
    caplog.set_level(logging.INFO, logger="app.receiver.webhooks")
    _applied_then_reversed(client, paid)
    lines = [r for r in caplog.records if r.getMessage() == "delivery"][-2:]
    assert [(r.payment_id, r.movement, r.change, r.outcome) for r in lines] == [
        (paid, "refund re_seen applied", "refund", Outcome.PROCESSED),
        (paid, "refund re_seen reversed", "refund_reversed", Outcome.PROCESSED)]


def test_events_show_names_the_movement(app, client, db, paid):
    failed = _applied_then_reversed(client, paid)
    shown = app.test_cli_runner().invoke(args=["events", "show", failed.id])
    assert shown.exit_code == 0, shown.output
    assert "movement:       refund re_seen reversed: refund of payment pi_m, 100 cents (recorded now: reversed)" \
        in shown.output
    assert "account:        pi_m: credited 1000" in shown.output
    assert "refunds 0 applied and 100 reversed" in shown.output


def test_verify_reports_a_movement_its_stored_events_contradict(app, client, db, paid):
    _send_all(client, refund("re_v", paid, 100, status="failed"))
    db.execute("UPDATE movements SET state = 'applied'")
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 1
    assert "payment 'pi_m': 0 cents debited, its refunds and disputes make 100 due" in verified.output
    assert "its refund 're_v' is applied, its bytes say reversed" in verified.output


def test_purged_movements_resent_in_any_order_move_nothing_again(app, client, db, paid, redis_client):
    announced = [refund("re_p", paid, 200, event_type="refund.created"), refund("re_p", paid, 200, status="failed"),
                 charge_refunded(paid, 500, cents=1000), dispute("du_p", paid, 100)]
    _send_all(client, *announced)
    assert balance(db, BOB) == 1000 - 300 - 100
    db.execute("UPDATE webhook_events SET created_at = now() - interval '400 days'")
    purged = app.test_cli_runner().invoke(args=["events", "purge", "--older-than", "1", "--force"])
    assert purged.exit_code == 0, purged.output
    redis_client.flushall()  # no done marker answers for them either
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 0
    for evt in reversed(announced):
        assert send_stripe(client, evt).status == 200
    assert balance(db, BOB) == 600
