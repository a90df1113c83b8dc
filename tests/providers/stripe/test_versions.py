"""Stripe's API versions from basil to endive against the fields the Stripe rules read (docs/providers/stripe.md,
"Limits"): each version's events, with the fields each version added to them, move what basil's
do; a dispute Stripe prevented or one under appeal moves nothing until its funds move."""

import json

import pytest

from app.intake.events import State, effect_of, parse
from app.providers import stripe
from tests.helpers import ALICE, SECRETS, assert_ledger_consistent, balance, send, stored_event_row
from tests.providers.effects import NOTHING, credit, running_total, seen
from tests.providers.effects import dispute as disputed
from tests.providers.effects import refund as refunded
from tests.providers.stripe.events import (
    charge_refunded,
    checkout_session,
    dispute,
    intent_succeeded,
    refund,
    send_stripe,
    stripe_signed,
)

# Two tests need PostgreSQL and Redis. The matrix of every rule by every version (about 600 cases) is the full
# suite's (`make test`), its newest version alone in the unit tier (`make check`); the other tests are marked unit.
pytestmark = pytest.mark.core

# Every version from basil to endive (docs/providers/stripe.md cites where each is listed).
VERSIONS = [
    "2025-03-31.basil", "2025-04-30.basil", "2025-05-28.basil", "2025-06-30.basil", "2025-07-30.basil",
    "2025-08-27.basil", "2025-09-30.clover", "2025-10-29.clover", "2025-11-17.clover", "2025-12-15.clover",
    "2026-01-28.clover", "2026-02-25.clover", "2026-03-25.dahlia", "2026-04-22.dahlia", "2026-05-27.dahlia",
    "2026-06-24.dahlia", "2026-07-29.dahlia", "2026-08-26.dahlia", "2026-09-30.endive", "2026-10-28.endive",
    "2026-11-18.endive",
]
# The matrix's versions: the newest one's cases are unit (`make check`), the others core (`make test`).
IN_THE_MATRIX = [*VERSIONS[:-1], pytest.param(VERSIONS[-1], marks=pytest.mark.unit)]
APPLIED, REVERSED = State.APPLIED, State.REVERSED
# Adaptive Pricing (since 2025-03-31.basil): what the customer saw, beside the integration's amount and currency.
SHOWN_IN_EUR = {"presentment_details": {"presentment_amount": 850, "presentment_currency": "eur"}}


def _effect(evt):
    return seen(effect_of(parse(str(evt).encode(), "stripe")))


def _with(evt, **fields):
    """evt with fields added to its data.object."""
    evt.data.object.update(fields)
    return evt


def _withdrawn(cents, reinstated=False):
    """A Dispute's balance transactions: its funds withdrawn (negative), then perhaps reinstated (positive)."""
    return [-cents] + ([cents] if reinstated else [])


# Each rule's event as every version renders it, with the fields versions since basil added to its object.
MOVES = {
    "intent-succeeded": (
        lambda v: intent_succeeded("pi_1", cents=600, authorized=1000, customer="cus_1", api_version=v),
        credit("pi_1", ALICE, 600, "usd", "cus_1")),
    "intent-succeeded-shown-in-another-currency": (
        lambda v: _with(intent_succeeded("pi_1", cents=900, api_version=v), **SHOWN_IN_EUR),
        credit("pi_1", ALICE, 900, "usd")),
    "charge-refunded-partially-captured": (
        lambda v: charge_refunded("pi_1", 1500, cents=10000, captured=6000, api_version=v),
        running_total("pi_1", 1500, "usd")),
    "charge-refunded-shown-in-another-currency": (
        lambda v: _with(charge_refunded("pi_1", 900, cents=900, api_version=v), **SHOWN_IN_EUR),
        running_total("pi_1", 900, "usd")),
    "charge-refunded-never-captured": (lambda v: charge_refunded("pi_1", 250, captured=0, api_version=v), NOTHING),
    "refund-created": (
        lambda v: refund("re_1", "pi_1", 300, event_type="refund.created", api_version=v),
        refunded("pi_1", "re_1", 300, "usd", APPLIED)),
    **{f"refund-pending-{reason}": (
        lambda v, reason=reason: _with(refund("re_1", "pi_1", 300, status="pending", api_version=v),
                                       pending_reason=reason),
        refunded("pi_1", "re_1", 300, "usd", APPLIED)) for reason in ("processing", "insufficient_funds",
                                                                       "charge_pending")},
    "refund-shown-in-another-currency": (
        lambda v: _with(refund("re_1", "pi_1", 300, api_version=v), customer="cus_1", **SHOWN_IN_EUR),
        refunded("pi_1", "re_1", 300, "usd", APPLIED)),
    "refund-failed": (
        lambda v: refund("re_1", "pi_1", 300, status="failed", api_version=v),
        refunded("pi_1", "re_1", 300, "usd", REVERSED)),
    "refund-expired-uncaptured": (
        lambda v: refund("re_1", "pi_1", 300, reason="expired_uncaptured_charge", api_version=v), NOTHING),
    "dispute-funds-withdrawn": (
        lambda v: dispute("dp_1", "pi_1", 500, api_version=v, balance_transactions=_withdrawn(500)),
        disputed("pi_1", "dp_1", 500, "usd", APPLIED)),
    "dispute-funds-reinstated": (
        lambda v: dispute("dp_1", "pi_1", 500, "charge.dispute.funds_reinstated", "won", api_version=v,
                          balance_transactions=_withdrawn(500, reinstated=True)),
        disputed("pi_1", "dp_1", 500, "usd", REVERSED)),
    "session-completed": (lambda v: checkout_session("pi_1", cents=900, api_version=v),
                          credit("pi_1", ALICE, 900, "usd")),
    "session-completed-shown-in-another-currency": (
        lambda v: _with(checkout_session("pi_1", cents=900, api_version=v), **SHOWN_IN_EUR),
        credit("pi_1", ALICE, 900, "usd")),
    "session-unpaid": (lambda v: checkout_session("pi_1", payment_status="unpaid", api_version=v), NOTHING),
}


@pytest.mark.parametrize("version", IN_THE_MATRIX)
@pytest.mark.parametrize("build, expected", MOVES.values(), ids=MOVES.keys())
def test_every_version_moves_what_basil_moves(version, build, expected):
    assert _effect(build(version)) == expected


# Dispute statuses that say no funds moved, in the events that move none: prevented (Stripe blocked or resolved it
# before it became a chargeback: case_type block or resolution), and an appeal of a decision, whose outcome moves
# by funds_reinstated as any other win.
STATUSES = [("prevented", "block"), ("prevented", "resolution"), ("appeal_needs_response", "chargeback"),
            ("appeal_under_review", "chargeback")]
NO_FUNDS = ["charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed"]


@pytest.mark.parametrize("version", IN_THE_MATRIX)
@pytest.mark.parametrize("status, case_type", STATUSES)
@pytest.mark.parametrize("event_type", NO_FUNDS)
def test_a_prevented_or_appealed_dispute_moves_nothing(version, status, case_type, event_type):
    assert _effect(dispute("dp_1", "pi_1", 500, event_type, status, api_version=version,
                           case_type=case_type)) == NOTHING


def _thin(event_type, obj):
    """A thin event naming the Dispute obj, read with obj as fetched (app/receiver/fetch.py's with_related)."""
    document = {"id": "evt_test_thin_dispute", "object": "v2.core.event", "type": event_type,
                "created": "2026-12-03T14:00:00.000Z", "livemode": True, "context": None,
                "related_object": {"id": obj["id"], "type": obj["object"], "url": f"/v1/disputes/{obj['id']}"}}
    return seen(effect_of(stripe.with_related(parse(json.dumps(document).encode(), "stripe"), obj)))


@pytest.mark.unit
@pytest.mark.parametrize("status, case_type", STATUSES)
@pytest.mark.parametrize("event_type", ["v1." + event_type for event_type in NO_FUNDS])
def test_a_thin_event_of_a_prevented_or_appealed_dispute_moves_what_its_balance_transactions_show(
        status, case_type, event_type):
    obj = dispute("dp_1", "pi_1", 500, status=status, case_type=case_type).data.object.to_dict()
    assert _thin(event_type, obj) == NOTHING
    if status.startswith("appeal"):  # an appeal follows a dispute lost: its funds were withdrawn
        lost = {**obj, "balance_transactions": [{"amount": -500, "currency": "usd"}]}
        assert _thin(event_type, lost) == disputed("pi_1", "dp_1", 500, "usd", APPLIED)


@pytest.mark.parametrize("scheme", ["stripe"])
def test_a_prevented_disputes_events_are_answered_200_and_an_appealed_ones_funds_still_move(client, db):
    send_stripe(client, intent_succeeded("pi_disputed", cents=800, api_version="2025-09-30.clover"))
    credited = balance(db)
    for event_type in NO_FUNDS:
        evt = dispute("dp_prevented", "pi_disputed", 800, event_type, "prevented", api_version="2025-09-30.clover",
                      case_type="resolution")
        answer = send_stripe(client, evt)
        assert (answer.status, answer.json) == (200, {"status": "processed", "event_id": evt.id})
        assert stored_event_row(db, evt.id).status == "completed"
    assert balance(db) == credited
    version = "2026-10-28.endive"
    send_stripe(client, dispute("dp_appealed", "pi_disputed", 300, api_version=version,
                                balance_transactions=_withdrawn(300)))
    assert balance(db) == credited - 300
    for status in ("lost", "appeal_needs_response", "appeal_under_review"):
        send_stripe(client, dispute("dp_appealed", "pi_disputed", 300, "charge.dispute.updated", status,
                                    api_version=version, balance_transactions=_withdrawn(300)))
    assert balance(db) == credited - 300
    send_stripe(client, dispute("dp_appealed", "pi_disputed", 300, "charge.dispute.funds_reinstated", "won",
                                api_version=version, balance_transactions=_withdrawn(300, reinstated=True)))
    assert balance(db) == credited


# Stripe's API upgrade run side by side (https://docs.stripe.com/webhooks/versioning): a
# second endpoint on the same URL with the new version (?version=..., its own signing secret) beside the old one,
# each event sent once to each, in its endpoint's version's shape. Both secrets are the route's list.
OLD_VERSION, NEW_VERSION, NEW_SECRET = "2024-06-20", "2026-11-18.endive", "whsec_new_endpoint_endive"


def _one_payment_in(version):
    """One payment's events, ids fixed, as an endpoint of version renders them: a partial capture (6000 of 10000)
    with a refund of 1500 (before basil, amount_refunded also counts the 4000 released), a refund object, and a
    dispute withdrawn then reinstated; each version's own added fields on the newer shapes."""
    newer = version == NEW_VERSION
    paid = intent_succeeded("pi_upgrade", cents=6000, authorized=10000, event_id="evt_up_paid", api_version=version)
    total = charge_refunded("pi_upgrade", 1500 if newer else 5500, cents=10000, captured=6000,
                           event_id="evt_up_total", api_version=version)
    refunded = refund("re_upgrade", "pi_upgrade", 1500, event_id="evt_up_refund", api_version=version)
    withdrawn = dispute("dp_upgrade", "pi_upgrade", 2000, event_id="evt_up_withdrawn", api_version=version,
                        balance_transactions=_withdrawn(2000))
    reinstated = dispute("dp_upgrade", "pi_upgrade", 2000, "charge.dispute.funds_reinstated", "won",
                         event_id="evt_up_reinstated", api_version=version,
                         balance_transactions=_withdrawn(2000, reinstated=True))
    events = [paid, total, refunded, withdrawn, reinstated]
    return [_with(evt, **SHOWN_IN_EUR) for evt in events[:2]] + events[2:] if newer else events


@pytest.mark.parametrize("scheme", ["stripe"])
@pytest.mark.parametrize("new_first", [False, True], ids=["old-first", "new-first"])
def test_an_api_upgrade_run_side_by_side_moves_each_movement_once(make_app, config, db, new_first):
    """Each event arrives twice, once per endpoint, in its version's shape, under its secret, on ?version= of the
    same URL: the first copy applies, the second is a duplicate (the same effect in other bytes), whichever
    version comes first; the ledger is what one delivery of each gives."""
    client = make_app({**config, "WEBHOOK_SECRET": f"{SECRETS['stripe']},{NEW_SECRET}"}).test_client()
    copies = [[stripe_signed(evt) for evt in _one_payment_in(OLD_VERSION)],
              [stripe_signed(evt, NEW_SECRET) for evt in _one_payment_in(NEW_VERSION)]]
    first, second = copies[::-1] if new_first else copies
    before = balance(db)
    for (body, headers), twin in zip(first, second, strict=True):
        answer = send(client, body, headers, path="/api/webhooks?version=" + (OLD_VERSION, NEW_VERSION)[new_first])
        assert (answer.status, answer.json["status"]) == (200, "processed")
        answer = send(client, *twin, path="/api/webhooks?version=" + (NEW_VERSION, OLD_VERSION)[new_first])
        assert (answer.status, answer.json["status"]) == (200, "duplicate")
    assert balance(db) == before + 6000 - 1500
    payment = db.execute("SELECT amount_cents, refunded_cents, debited_cents FROM payments WHERE payment_id = %s",
                         ["pi_upgrade"]).fetchone()
    assert tuple(payment) == (6000, 1500, 1500)
    journal = db.execute("SELECT kind, amount_cents FROM ledger_journal WHERE payment_id = 'pi_upgrade' ORDER BY id")
    # The refund object is the running total's 1500 explained, not another 1500.
    assert [tuple(row) for row in journal] == [("credit", 6000), ("refund", -1500), ("dispute_withdrawn", -2000),
                                               ("dispute_reinstated", 2000)]
    assert_ledger_consistent(db)
