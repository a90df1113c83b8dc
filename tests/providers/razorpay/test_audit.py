"""`flask audit` of a razorpay source (app/providers/razorpay/audit.py): Razorpay's own client reads the settlement
recon API and Fetch Multiple Payments from devservers/razorpay_stand_in.py; the ledger is filled by signed
deliveries. Three settlement days match; a payment captured on day 3 and settled on day 4 is pending in day 3's
run and matched in day 4's."""

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from devservers.razorpay_stand_in import RazorpayStandIn
from tests.helpers import assert_ledger_consistent, db_url, record_currency, sources_config
from tests.providers.razorpay.events import payment_captured, payment_entity, refund_event
from tests.providers.razorpay.test_delivery import SOURCE, send_razorpay

pytestmark = pytest.mark.core

DAY = timedelta(days=1)


@pytest.fixture(scope="module")
def razorpay_api_server():
    stand_in = RazorpayStandIn().start()
    yield stand_in
    stand_in.close()


@pytest.fixture
def razorpay_api(razorpay_api_server):
    razorpay_api_server.reset()
    return razorpay_api_server


@pytest.fixture
def config(db, redis_server, redis_client, razorpay_api):
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url}
    record_currency(db, "inr")
    return sources_config(base, {SOURCE: None}, LEDGER_CURRENCY="inr",
                          WEBHOOK_RAZORPAY_API_KEY=razorpay_api.api_key, WEBHOOK_RAZORPAY_API_BASE=razorpay_api.url)


def recon(entity, kind, paise, settled_at, created_at, payment_id=None, fee=0):
    """A recon item as Fetch Settlement Recon Details lists it (https://razorpay.com/docs/api/settlements/fetch-recon)."""
    credit, debit = (paise, 0) if kind == "payment" else (0, paise)
    return {"entity_id": entity, "type": kind, "debit": debit, "credit": credit - fee, "amount": paise,
            "currency": "INR", "fee": fee, "tax": 0, "on_hold": False, "settled": True, "created_at": created_at,
            "settled_at": settled_at, "settlement_id": f"setl_{settled_at}", "posted_at": None,
            "credit_type": "default", "description": None, "notes": None, "payment_id": payment_id or (
                entity if kind == "payment" else None), "settlement_utr": "utr0001", "order_id": None,
            "order_receipt": None, "method": "upi", "card_network": None, "card_issuer": None, "card_type": None,
            "dispute_id": None}


def audit(app, tmp_path, since, until):
    out = tmp_path / f"audit{time.monotonic_ns()}.json"
    result = app.test_cli_runner().invoke(args=[
        "audit", SOURCE, "--since", since.strftime("%Y-%m-%dT%H:%M:%S"), "--until",
        until.strftime("%Y-%m-%dT%H:%M:%S"), "--grace", "0s", "--json", str(out)])
    return result.exit_code, json.loads(out.read_text()), result.output


def test_three_settlement_days_match_and_a_payment_settled_on_day_four_is_pending_in_day_three(
        app, client, db, razorpay_api, tmp_path):
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [today - 3 * DAY, today - 2 * DAY, today - DAY, today]  # day 1 to day 4 (today)
    settled_at = [int((day + timedelta(minutes=1)).timestamp()) for day in days]
    # Each of days 1 to 3 captures three payments, settled the next day; day 1 also refunds one of day 0's.
    for n, day in enumerate(days[:3]):
        for k in range(3):
            payment_id = f"pay_d{n}k{k}000000000"
            captured = int((day + timedelta(hours=2 + k)).timestamp())
            assert send_razorpay(client, payment_captured(payment_id, paise=10000 + k)).status == 200
            razorpay_api.capture(payment_entity(payment_id, paise=10000 + k, created_at=captured))
            razorpay_api.settle(recon(payment_id, "payment", 10000 + k, settled_at[n + 1], captured, fee=236))
    early = "pay_early000000000"  # captured the day before day 1, settled on day 1, refunded on day 1
    assert send_razorpay(client, payment_captured(early, paise=5000)).status == 200
    razorpay_api.settle(recon(early, "payment", 5000, settled_at[0], settled_at[0] - 86400))
    assert send_razorpay(client, refund_event("refund.processed", "rfnd_d1000000000000", early, 2000,
                                              "processed")).status == 200
    razorpay_api.settle(recon("rfnd_d1000000000000", "refund", 2000, settled_at[1], settled_at[0] + 60,
                              payment_id=early))
    razorpay_api.settle(recon("trf_fee_d2", "transfer", 700, settled_at[2], settled_at[2]))

    # Day 1 settles nothing captured in the window but the refund; days 2 and 3 settle days 1 and 2's payments.
    for n in range(3):
        code, document, output = audit(app, tmp_path, days[n], days[n] + DAY)
        assert code == 0, output
        assert document["breaks"] == [], output
    # Day 3's run: day 3's payments are captured, not settled (that is day 4): pending, never broken.
    code, day3, output = audit(app, tmp_path, days[2], days[2] + DAY)
    assert (code, day3["header"]["verdict"]) == (0, "reconciled_with_pending"), output
    assert sorted(item["key"] for item in day3["pending"]) == [f"pay_d2k{k}000000000" for k in range(3)]
    # Day 4's run (today, up to now): they are settled and match.
    code, day4, output = audit(app, tmp_path, days[3], datetime.now(UTC))
    assert (code, day4["header"]["verdict"], day4["pending"]) == (0, "reconciled", []), output
    assert day4["header"]["objects"]["payment"] == 3
    assert db.execute("SELECT count(*) FROM audit_breaks").fetchone()[0] == 0
    assert_ledger_consistent(db)


def test_a_settled_payment_the_ledger_never_credited_is_missing_in_ledger(app, client, db, razorpay_api, tmp_path):
    yesterday = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - DAY
    at = int((yesterday + timedelta(hours=3)).timestamp())
    razorpay_api.settle(recon("pay_lost0000000000", "payment", 9000, at, at - 86400))
    code, document, output = audit(app, tmp_path, yesterday, yesterday + DAY)
    assert code == 1, output
    assert [(item["class"], item["provider_key"]) for item in document["breaks"]] == \
        [("missing_in_ledger", "pay_lost0000000000")]
