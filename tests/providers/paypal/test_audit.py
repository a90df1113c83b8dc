"""`flask audit` of a paypal source (app/providers/paypal/audit.py): PayPal's Transaction Search on
devservers/paypal_stand_in.py (an OAuth 2.0 token, then `GET /v1/reporting/transactions`, 31 days a query); the
ledger filled by deliveries signed as PayPal signs them. A dispute, which Transaction Search names by no dispute id,
is matched_by_amount_only, never missing."""

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.providers.paypal.events import capture_completed, dispute_event, new_dispute_id, refund_event
from tests.providers.paypal.test_scheme import cert_host, config, pki, send_paypal  # noqa: F401 - the fixtures PayPal's tests use

pytestmark = pytest.mark.core


def detail(txn, code, value, initiated, reference=None, fee=None):
    """One transaction_details item (https://developer.paypal.com/docs/api/transaction-search/v1/)."""
    info = {"paypal_account_id": "6STWC2LSUYYYE", "transaction_id": txn, "transaction_event_code": code,
            "transaction_initiation_date": initiated.strftime("%Y-%m-%dT%H:%M:%S+0000"),
            "transaction_updated_date": initiated.strftime("%Y-%m-%dT%H:%M:%S+0000"),
            "transaction_amount": {"currency_code": "USD", "value": value}, "transaction_status": "S",
            "protection_eligibility": "01"}
    if reference:
        info["paypal_reference_id"], info["paypal_reference_id_type"] = reference, "TXN"
    if fee:
        info["fee_amount"] = {"currency_code": "USD", "value": fee}
    return {"transaction_info": info, "payer_info": {}, "shipping_info": {}, "cart_info": {}, "store_info": {},
            "auction_info": {}, "incentive_info": {}}


def audit(app, tmp_path, *args):
    out = tmp_path / f"audit{time.monotonic_ns()}.json"
    since = (datetime.now(UTC) - timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%S")
    result = app.test_cli_runner().invoke(args=["audit", "paypal", "--since", since, "--json", str(out), *args])
    return result.exit_code, json.loads(out.read_text()), result.output


def test_a_dispute_is_matched_by_amount_only_never_missing(app, db, send_paypal, paypal_api, tmp_path):  # noqa: F811
    base = datetime.now(UTC) - timedelta(days=35)  # two queries of Transaction Search: 31 days at most each
    captures = [f"5O1903{n:05d}X" for n in range(4)]
    for n, capture in enumerate(captures):
        assert send_paypal(capture_completed(capture, value="21.00")).status == 200
        paypal_api.add_transactions(detail(capture, "T0006", "21.00", base + timedelta(days=n * 9), fee="-0.91"))
    refund_id = "1JU08902781691411"
    assert send_paypal(refund_event("PAYMENT.CAPTURE.REFUNDED", refund_id, captures[1], "5.00")).status == 200
    paypal_api.add_transactions(detail(refund_id, "T1107", "-5.00", base + timedelta(days=10), captures[1]))
    dispute_id = new_dispute_id()
    assert send_paypal(dispute_event("CUSTOMER.DISPUTE.RESOLVED", dispute_id, captures[2], "21.00",
                                     status="RESOLVED", outcome="RESOLVED_BUYER_FAVOUR")).status == 200
    paypal_api.add_transactions(detail("8MC585209K746392H", "T1201", "-21.00", base + timedelta(days=20),
                                       captures[2]))
    paypal_api.add_transactions(detail("9SW07823KA5546020", "T0400", "-40.00", base + timedelta(days=30)))
    code, document, output = audit(app, tmp_path, "--grace", "0s")
    assert code == 0, output  # flagged, not broken
    assert [(item["class"], item["ledger_key"]) for item in document["breaks"]] == \
        [("matched_by_amount_only", dispute_id)], output
    assert document["statements"]["usd"]["non_user"] == {"T04": -4000}
    assert document["statements"]["usd"]["fees"] == 4 * 91
    assert document["header"]["objects"] == {"payment": 4, "refund": 1, "dispute": 1}
    assert db.execute("SELECT class, priority FROM audit_breaks").fetchall() == [("matched_by_amount_only", False)]


def test_transactions_younger_than_paypals_three_hours_are_pending(app, db, send_paypal, paypal_api,  # noqa: F811
                                                                   tmp_path):
    capture = "5O190301234X"
    assert send_paypal(capture_completed(capture, value="9.00")).status == 200  # in the ledger, not listed yet
    code, document, output = audit(app, tmp_path, "--grace", "0s")
    assert (code, document["header"]["verdict"]) == (0, "reconciled_with_pending"), output
    assert [item["key"] for item in document["pending"]] == [capture]


def test_credentials_paypal_refuses_end_the_run_incomplete_naming_the_setting(app, db, send_paypal,  # noqa: F811
                                                                              paypal_api, tmp_path):
    configured, paypal_api.credentials = paypal_api.credentials, "another-client:another-secret"
    try:  # PayPal no longer knows the configured key
        code, document, output = audit(app, tmp_path)
    finally:
        paypal_api.credentials = configured  # the stand-in serves the module's other tests
    assert (code, document["header"]["verdict"]) == (2, "incomplete"), output
    assert "PayPal refused our credentials" in document["header"]["reason"], document["header"]
    assert "WEBHOOK_PAYPAL_API_KEY" in document["header"]["reason"], document["header"]
    assert paypal_api.api_key.split(":")[1] not in output + json.dumps(document)
