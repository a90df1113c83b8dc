"""The provider's pace on a fleet: two gunicorn hosts sharing PostgreSQL and Redis, Stripe's API stood in with its
rate limiter (25 per endpoint and 100 in all per sliding second, https://docs.stripe.com/rate-limits) and a 150 ms
answer. A burst of thin events above the budget is all 2xx at first delivery, never a 429, every payment credited
once without a re-delivery; and so when Redis is flushed or stopped, the provider fails for a while, or a host dies
mid-drain. PayPal's deliveries, each fetched from its REST API, likewise: PayPal publishes no rate limit, only that
too many requests are answered 429 RATE_LIMIT_REACHED (https://developer.paypal.com/api/rest/reference/
rate-limiting/), so its stand-in refuses what goes over the budget itself."""

import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import stripe

from devservers import Redis
from devservers.paypal_stand_in import EVENTS_PATH
from devservers.stripe_stand_in import API_KEY, ENDPOINT_LIMIT
from tests.helpers import (
    ALICE,
    OPENING,
    SECRETS,
    assert_ledger_consistent,
    balance,
    db_url,
    encode,
    send,
    sources_config,
    wait_drained,
    waiting_rows,
)
from tests.providers.paypal.certificates import WEBHOOK_ID, paypal_headers
from tests.providers.paypal.events import capture_completed, new_id
from tests.providers.paypal.test_scheme import cert_host, pki  # noqa: F401 - PayPal's certificate host and its PKI
from tests.providers.stripe.events import intent_succeeded, thin, thin_signed

pytestmark = pytest.mark.core

# The budget the hosts share: the default (docs/configuration.md).
RATE, RATE_TOTAL = 10, 20


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api, pki, cert_host, paypal_api):  # noqa: F811
    """Stripe as the default source, PayPal as the source `paypal` (its budget the same default: RATE, RATE_TOTAL)."""
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url,
            "WEBHOOK_API_RATE": str(RATE), "WEBHOOK_API_RATE_TOTAL": str(RATE_TOTAL)}
    return sources_config(base, {"paypal": None}, WEBHOOK_PAYPAL_SECRET=WEBHOOK_ID,
                          PAYPAL_CERT_HOSTS=f"localhost:{cert_host.port}", PAYPAL_CA_FILE=str(pki.ca_file),
                          WEBHOOK_PAYPAL_API_KEY=paypal_api.api_key, WEBHOOK_PAYPAL_API_BASE=paypal_api.url)


@pytest.fixture
def stripe_at_pace(stripe_api):
    """Stripe's API with its limiter and a 150 ms answer; what it saw is read from it."""
    stripe_api.limiter, stripe_api.delay = True, 0.15
    stripe_api.peaks.clear()
    stripe_api.limited = stripe_api.peak_total = 0
    yield stripe_api
    stripe_api.limiter = False


@pytest.fixture
def paypal_at_pace(paypal_api):
    """PayPal's REST API answering in 150 ms, refusing 429 RATE_LIMIT_REACHED past the budget's total a second."""
    paypal_api.delay, paypal_api.limit = 0.15, RATE_TOTAL
    return paypal_api


def _paypal_payments(paypal_api, pki, cert_host, count):  # noqa: F811
    """count PAYMENT.CAPTURE.COMPLETED deliveries of 1.00 USD to ALICE (bytes and headers signed as PayPal signs),
    each event held by PayPal's API to be fetched."""
    deliveries = []
    for _ in range(count):
        event = capture_completed(new_id(), user=ALICE, value="1.00")
        paypal_api.add(event)
        body = encode(event)
        deliveries.append((body, paypal_headers(body, pki, cert_host)))
    return deliveries


def _payments(stripe_api, count, cents=100):
    """count thin v1.payment_intent.succeeded deliveries (signed bytes and headers), their objects at Stripe."""
    deliveries = []
    for _ in range(count):
        obj = intent_succeeded(f"pi_{uuid.uuid4().hex[:24]}", cents=cents).data.object.to_dict()
        stripe_api.put(obj)
        deliveries.append(thin_signed(thin("v1.payment_intent.succeeded", obj)))
    return deliveries


def _burst(hosts, deliveries, midway=None, source=None):
    """Each delivery sent once, to the hosts in turn (source's endpoint: the default source's unless given), 16 at
    once; midway() runs once half have been sent. Statuses."""
    half = threading.Event()
    sent = [0]
    lock = threading.Lock()

    def post(indexed):
        index, delivery = indexed
        answer = send(hosts[index % len(hosts)].base, *delivery, source=source)
        with lock:
            sent[0] += 1
            if sent[0] == len(deliveries) // 2:
                half.set()
        return answer.status

    runner = None
    if midway is not None:
        runner = threading.Thread(target=lambda: (half.wait(), midway()))
        runner.start()
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(post, enumerate(deliveries)))
    if runner is not None:
        runner.join()
    return statuses


def test_stripe_pythons_client_raises_rate_limit_error_from_the_stand_ins_limiter(stripe_api):
    stripe_api.limiter = True
    try:
        obj = intent_succeeded(f"pi_{uuid.uuid4().hex[:24]}").data.object.to_dict()
        stripe_api.put(obj)
        client = stripe.StripeClient(API_KEY, base_addresses={"api": stripe_api.url}, max_network_retries=0)
        with pytest.raises(stripe.RateLimitError) as raised:
            for _ in range(ENDPOINT_LIMIT + 1):
                client.v1.payment_intents.retrieve(obj["id"])
        assert raised.value.json_body["error"]["code"] == "rate_limit" and stripe_api.limited >= 1
    finally:
        stripe_api.limiter = False


def test_a_burst_above_the_budget_on_two_hosts_is_2xx_never_429_and_credited_once(gunicorn, db, stripe_at_pace):
    hosts = [gunicorn(workers=2, threads=4) for _ in range(2)]
    deliveries = _payments(stripe_at_pace, 120)
    statuses = _burst(hosts, deliveries)
    assert set(statuses) <= {200, 202}, statuses  # every notification 2xx at its first delivery
    wait_drained(db, within=120)
    assert balance(db, ALICE) == OPENING[ALICE] + 120 * 100  # each credited once, none delivered again
    assert stripe_at_pace.limited == 0  # the fleet never met Stripe's limiter
    assert stripe_at_pace.peaks["payment_intent"] <= RATE, stripe_at_pace.peaks  # never over the budget
    assert len(stripe_at_pace.requests) >= 120
    assert_ledger_consistent(db)


def test_redis_flushed_mid_burst_loses_nothing_and_doubles_nothing(gunicorn, db, redis_client, stripe_at_pace):
    hosts = [gunicorn(workers=2, threads=4) for _ in range(2)]
    deliveries = _payments(stripe_at_pace, 80)
    statuses = _burst(hosts, deliveries, midway=redis_client.flushall)
    assert set(statuses) <= {200, 202}, statuses
    wait_drained(db, within=120)
    assert balance(db, ALICE) == OPENING[ALICE] + 80 * 100
    assert stripe_at_pace.limited == 0  # a flushed window lets through one more second's budget: still under 25
    assert_ledger_consistent(db)


def test_redis_stopped_mid_burst_loses_nothing_and_doubles_nothing(gunicorn, db, stripe_at_pace):
    own = Redis().start()  # the hosts' Redis alone: stopped, not flushed, halfway
    try:
        hosts = [gunicorn(workers=2, threads=4, REDIS_URL=own.url) for _ in range(2)]
        deliveries = _payments(stripe_at_pace, 80)
        statuses = _burst(hosts, deliveries, midway=own.stop)
    finally:
        own.stop()
    assert set(statuses) <= {200, 202}, statuses
    wait_drained(db, within=120)
    assert balance(db, ALICE) == OPENING[ALICE] + 80 * 100
    # Each process went on with its share of the budget (1/8), and said so once.
    assert all("Redis cannot be used" in host.log_path.read_text() for host in hosts)
    # The second Redis stopped lets through its last window's grants and every process's first share of its own
    # (here 10 + 4 in one second, over the budget for that second): still never a 429.
    assert stripe_at_pace.limited == 0
    assert_ledger_consistent(db)


def test_a_paypal_burst_above_the_budget_on_two_hosts_is_2xx_never_429_and_credited_once(
        gunicorn, db, pki, cert_host, paypal_at_pace):  # noqa: F811
    hosts = [gunicorn(workers=2, threads=4) for _ in range(2)]
    deliveries = _paypal_payments(paypal_at_pace, pki, cert_host, 120)
    statuses = _burst(hosts, deliveries, source="paypal")
    assert set(statuses) <= {200, 202}, statuses  # every notification 2xx at its first delivery
    wait_drained(db, within=120)
    assert balance(db, ALICE) == OPENING[ALICE] + 120 * 100  # each credited once, none delivered again
    assert paypal_at_pace.limited == 0  # never a 429
    assert paypal_at_pace.peak(EVENTS_PATH) <= RATE  # never over the budget: per endpoint...
    assert paypal_at_pace.peak("/v1/") <= RATE_TOTAL  # ...and in all, the tokens' requests with them
    assert paypal_at_pace.count(EVENTS_PATH) >= 120
    assert_ledger_consistent(db)


def test_stripe_failing_for_a_while_then_recovering_loses_nothing_and_doubles_nothing(gunicorn, db, stripe_at_pace):
    hosts = [gunicorn(workers=2, threads=4) for _ in range(2)]
    deliveries = _payments(stripe_at_pace, 60)
    stripe_at_pace.fail_next(500, times=10_000)  # Stripe answers 500 to everything for a while
    statuses = _burst(hosts, deliveries)
    assert set(statuses) <= {200, 202}, statuses
    # Down for a while (by time, not by a count of failures: each drain backs off, so a count would last as long
    # as the backoff makes it), then up: everything that waits is tried within MAX_BACKOFF_SECONDS of it.
    time.sleep(15)
    assert waiting_rows(db) > 0
    stripe_at_pace.recover()
    wait_drained(db, within=180)
    assert balance(db, ALICE) == OPENING[ALICE] + 60 * 100
    assert_ledger_consistent(db)


def test_a_host_killed_mid_drain_loses_nothing_and_doubles_nothing(gunicorn, db, stripe_at_pace):
    doomed = gunicorn(workers=2, threads=4)
    deliveries = _payments(stripe_at_pace, 40)
    stripe_at_pace.fail_next(503, times=10_000)  # Stripe is down: all 40 accepted, to be drained
    assert set(_burst([doomed], deliveries)) == {202}
    stripe_at_pace.recover()
    asked = len(stripe_at_pace.requests)
    killed = threading.Event()

    def kill_after_some(number):
        if number == asked + 8 and not killed.is_set():  # its drains have claimed and are fetching
            killed.set()
            os.killpg(doomed.proc.pid, signal.SIGKILL)

    stripe_at_pace.on_request = kill_after_some
    try:
        killed.wait(60)
        assert killed.is_set(), "the doomed host's drain never asked Stripe"
        doomed.proc.wait(10)
        gunicorn(workers=2, threads=4)  # another host: its drains take the dead one's claims once they expire
        wait_drained(db, within=150)
    finally:
        stripe_at_pace.on_request = None
    assert balance(db, ALICE) == OPENING[ALICE] + 40 * 100
    assert_ledger_consistent(db)
