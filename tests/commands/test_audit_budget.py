"""`flask audit`'s requests spend the provider account's budget, shared with every host through Redis
(app/providers/budget.py), as `flask reconcile`'s do: whatever the audit reads, the provider never sees more than
WEBHOOK_API_RATE a second, and a 429 storm pauses every host and ends the run incomplete, never reconciled. Stripe's
stand-in counts with Stripe's own limiter (https://docs.stripe.com/rate-limits); PayPal's and Razorpay's count each
sliding second's requests (devservers/faulty_api.py). Each provider's own client or documented calls, over HTTP."""

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from app.commands import stripe_list
from app.providers import budget, stripe_audit
from app.providers.paypal import audit as paypal_audit
from app.providers.razorpay import audit as razorpay_audit
from devservers.paypal_local import WEBHOOK_ID
from devservers.razorpay_stand_in import RazorpayStandIn
from devservers.stripe_balance import transaction
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import SECRETS, db_url, sources_config
from tests.providers.paypal.test_audit import detail
from tests.providers.razorpay.test_audit import recon

pytestmark = pytest.mark.core

# The account's budget: a few requests a second, so that a small audit reads many times over it.
RATE, RATE_TOTAL = 4, 6
PAUSED = "every host pauses its calls"  # app/providers/budget.py's line when the provider answers 429


@pytest.fixture
def scheme():
    return "stripe"


@pytest.fixture
def stand_in():
    with StripeStandIn() as server:
        yield server


@pytest.fixture
def razorpay_api():
    server = RazorpayStandIn().start()
    yield server
    server.close()


@pytest.fixture
def config(db, redis_server, redis_client, stand_in, paypal_api, razorpay_api):
    """Stripe as the default source, PayPal and Razorpay named ones; each account's budget RATE and RATE_TOTAL."""
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SECRET": SECRETS["stripe"],
            "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url,
            "WEBHOOK_API_RATE": str(RATE), "WEBHOOK_API_RATE_TOTAL": str(RATE_TOTAL)}
    return sources_config(base, {"paypal": None, "razorpay": None}, WEBHOOK_PAYPAL_SECRET=WEBHOOK_ID,
                          WEBHOOK_PAYPAL_API_KEY=paypal_api.api_key, WEBHOOK_PAYPAL_API_BASE=paypal_api.url,
                          WEBHOOK_RAZORPAY_API_KEY=razorpay_api.api_key, WEBHOOK_RAZORPAY_API_BASE=razorpay_api.url)


def audit(app, tmp_path, source, days):
    """`flask audit SOURCE` over the last days: (its exit code, its --json document's header, its output)."""
    out = tmp_path / f"audit{time.monotonic_ns()}.json"
    since = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S")
    result = app.test_cli_runner().invoke(args=["audit", source, "--since", since, "--json", str(out)])
    assert out.exists(), (result.output, result.exception)
    return result.exit_code, json.loads(out.read_text())["header"], result.output


@pytest.fixture
def storm(monkeypatch, caplog):
    """A 429 asked again twice, soon (not over a minute); the budget's log lines kept."""
    monkeypatch.setattr(stripe_list, "RATE_LIMIT_FIRST_DELAY", 0.01)
    monkeypatch.setattr(stripe_list, "RATE_LIMIT_RETRIES", 2)
    monkeypatch.setattr(budget, "RATE_LIMIT_FIRST_DELAY", 0.01)
    monkeypatch.setattr(budget, "RATE_LIMIT_RETRIES", 2)
    caplog.set_level(logging.WARNING, logger="app.providers.budget")
    return caplog


def test_a_stripe_audit_never_asks_more_than_the_budget(app, stand_in, monkeypatch, tmp_path):
    monkeypatch.setattr(stripe_audit, "PAGE_LIMIT", 2)  # 40 transactions: 20 pages, five seconds of the budget
    now = int(time.time())
    stand_in.balance.add(*(transaction(f"txn_fee{n:04d}", now - 7200 - n, "stripe_fee", "fee", -50, None)
                           for n in range(40)))
    # Stripe's limiter at the budget: one request a second more than it would be a 429.
    stand_in.limiter, stand_in.endpoint_limit, stand_in.global_limit = True, RATE, RATE_TOTAL
    code, header, output = audit(app, tmp_path, "default", 1)
    assert (code, header["verdict"]) == (0, "reconciled"), output
    assert len(stand_in.requests) == 20
    assert stand_in.limited == 0 and stand_in.peaks["balance_transaction_list"] <= RATE, stand_in.peaks


def test_a_429_storm_pauses_every_host_and_ends_a_stripe_audit_incomplete(app, stand_in, storm, tmp_path):
    now = int(time.time())
    stand_in.balance.add(transaction("txn_fee0001", now - 7200, "stripe_fee", "fee", -50, None))
    stand_in.limiter, stand_in.endpoint_limit = True, 0  # every request is over Stripe's limit
    code, header, output = audit(app, tmp_path, "default", 1)
    assert (code, header["verdict"]) == (2, "incomplete"), output
    assert "429" in header["reason"]
    assert stand_in.limited == len(stand_in.requests) == 3  # asked once, then twice again: never more
    assert storm.text.count(PAUSED) == 3  # each 429 paused the fleet (the Redis key every host's budget reads)


def test_a_paypal_audit_never_asks_more_than_the_budget(app, paypal_api, monkeypatch, tmp_path):
    monkeypatch.setattr(paypal_audit, "PAGE_SIZE", 1)  # 20 transactions: 20 pages
    initiated = datetime.now(UTC) - timedelta(days=2)
    paypal_api.add_transactions(*(detail(f"9FEE{n:013d}", "T0400", "-1.00", initiated - timedelta(minutes=n))
                                  for n in range(20)))
    code, header, output = audit(app, tmp_path, "paypal", 3)
    assert header["verdict"] != "incomplete", output
    assert paypal_api.count("/v1/reporting/transactions") == 20
    assert paypal_api.peak("/v1/reporting/transactions") <= RATE
    assert paypal_api.peak("/v1/") <= RATE_TOTAL  # the token's request too


def test_a_429_storm_pauses_every_host_and_ends_a_paypal_audit_incomplete(app, paypal_api, storm, tmp_path):
    paypal_api.fail_next(429, times=1000)
    code, header, output = audit(app, tmp_path, "paypal", 3)
    assert (code, header["verdict"]) == (2, "incomplete"), output
    assert "429" in header["reason"]
    assert len(paypal_api.requests) == 3
    assert storm.text.count(PAUSED) == 3


def test_a_razorpay_audit_never_asks_more_than_the_budget(app, razorpay_api, monkeypatch, tmp_path):
    monkeypatch.setattr(razorpay_audit, "RECON_COUNT", 1)  # 20 settled items: 21 requests for their day
    settled = int((datetime.now(UTC) - timedelta(days=1)).replace(hour=12).timestamp())
    razorpay_api.settle(*(recon(f"trf_{n:014d}", "transfer", 100, settled, settled - 3600) for n in range(20)))
    code, header, output = audit(app, tmp_path, "razorpay", 2)
    assert header["verdict"] != "incomplete", output
    assert razorpay_api.count("/v1/settlements/recon") >= 21
    assert razorpay_api.peak("/v1/settlements/recon") <= RATE
    assert razorpay_api.peak("/v1/") <= RATE_TOTAL


def test_a_429_storm_pauses_every_host_and_ends_a_razorpay_audit_incomplete(app, razorpay_api, storm, tmp_path):
    razorpay_api.fail_next(429, times=1000)
    code, header, output = audit(app, tmp_path, "razorpay", 2)
    assert (code, header["verdict"]) == (2, "incomplete"), output
    assert "429" in header["reason"]
    assert len(razorpay_api.requests) == 3
    assert storm.text.count(PAUSED) == 3
