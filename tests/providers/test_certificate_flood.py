"""Unsigned requests naming new PayPal certificate URLs (issue 44): on a real gunicorn host, while genuine PayPal,
Stripe-fetch and Razorpay-fetch deliveries flow, an attacker POSTs made-up signatures, each naming a new
certificate URL on an allowed host in PayPal's shape. Certificate fetches for requests not yet verified spend
their own budget (app/providers/paypal/certificates.py), never PROVIDER_SLOTS, so no genuine delivery is starved. The
measurement (`CERT_FLOOD_MEASURE=1`, run by hand) prints the share of genuine deliveries answered 503 with 1, 4
and 12 attacker threads. Real PostgreSQL, Redis and gunicorn; PayPal's, Stripe's and Razorpay's APIs on loopback."""

import itertools
import os
import threading
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from devservers.razorpay_stand_in import RazorpayStandIn
from devservers.stripe_stand_in import API_KEY as STRIPE_API_KEY
from tests.helpers import BOB, UNMETERED, db_url, encode, samples, send, source_secret, sources_config
from tests.providers.paypal.certificates import PKI, CertHost, cert_path, paypal_headers
from tests.providers.paypal.events import capture_completed
from tests.providers.paypal.events import new_id as paypal_id
from tests.providers.razorpay.events import new_id as razorpay_id
from tests.providers.razorpay.events import payment_captured
from tests.providers.razorpay.test_delivery import razorpay_headers
from tests.providers.stripe.events import intent_succeeded, stripe_signed

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cert_host(pki):
    host = CertHost(pki)
    yield host
    host.close()


@pytest.fixture(scope="module")
def razorpay_api():
    stand_in = RazorpayStandIn().start()
    yield stand_in
    stand_in.close()


@pytest.fixture
def config(db, redis_server, redis_client, pki, cert_host, paypal_api, stripe_api, razorpay_api):
    """Three fetching sources in one ledger (dollars): PayPal (its certificates from the stand-in host), Stripe and
    Razorpay, each fetching every event from its API's stand-in."""
    # The providers' shared budget out of the way: the genuine deliveries here come faster than its default allows
    # (past it they would be accepted, 202, and drained: tests/receiver/test_pace_fleet.py).
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, **UNMETERED}
    return sources_config(base, {"paypal": None, "stripe": None, "razorpay": None}, LEDGER_CURRENCY="usd",
                          PAYPAL_CERT_HOSTS=f"localhost:{cert_host.port}", PAYPAL_CA_FILE=str(pki.ca_file),
                          WEBHOOK_PAYPAL_SECRET="1JE4291016473214C", WEBHOOK_PAYPAL_API_KEY=paypal_api.api_key,
                          WEBHOOK_PAYPAL_API_BASE=paypal_api.url, WEBHOOK_STRIPE_FETCH="true",
                          WEBHOOK_STRIPE_API_KEY=STRIPE_API_KEY, WEBHOOK_STRIPE_API_BASE=stripe_api.url,
                          WEBHOOK_RAZORPAY_FETCH="true", WEBHOOK_RAZORPAY_API_KEY=razorpay_api.api_key,
                          WEBHOOK_RAZORPAY_API_BASE=razorpay_api.url)


class Genuine:
    """Genuine deliveries of each fetching provider, each event published first on its API's stand-in."""

    def __init__(self, base, pki, cert_host, paypal_api, stripe_api, razorpay_api):
        self.base, self.pki, self.cert_host = base, pki, cert_host
        self.paypal_api, self.stripe_api, self.razorpay_api = paypal_api, stripe_api, razorpay_api

    def paypal(self):
        event = capture_completed(paypal_id(), user=BOB, value="1.00")
        self.paypal_api.add(event)
        body = encode(event)
        return send(self.base, body, paypal_headers(body, self.pki, self.cert_host), source="paypal").status

    def stripe(self):
        evt = intent_succeeded(f"pi_{uuid.uuid4().hex[:20]}", user=BOB, cents=100)
        self.stripe_api.add(evt)
        body, headers = stripe_signed(evt, source_secret("stripe", "stripe"))
        return send(self.base, body, headers, source="stripe").status

    def razorpay(self):
        event = payment_captured(razorpay_id("pay"), user=BOB, paise=100, currency="USD")
        self.razorpay_api.add(event["payload"]["payment"]["entity"])
        body = encode(event)
        return send(self.base, body, razorpay_headers(body, secret=source_secret("razorpay", "razorpay")),
                    source="razorpay").status


def attack(base, pki, cert_host, stop, answers):
    """One attacker thread: a made-up signature naming a new certificate URL each time, until stop is set."""
    for n in itertools.count():
        if stop.is_set():
            return
        body = encode(capture_completed(paypal_id(), user=BOB))
        headers = {**paypal_headers(body, pki, cert_host), "PAYPAL-CERT-URL": cert_host.url(
            f"made-up-{threading.get_ident()}-{n}")}
        answers[send(base, body, headers, source="paypal", timeout=30).status] += 1


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as answer:
        return samples(answer.read().decode())


def warm(genuine, workers):
    """Genuine PayPal deliveries until every worker has fetched PayPal's certificate (each process caches its own):
    a worker that has not, under a flood, waits for the budget like any URL (docs/design.md)."""
    before = genuine.cert_host.requests.count(cert_path("CERT-good"))
    for _ in range(200):
        assert genuine.paypal() == 200
        if genuine.cert_host.requests.count(cert_path("CERT-good")) - before >= workers:
            return
    pytest.fail("a worker never received a genuine PayPal delivery")


def flood(server, genuine, pki, cert_host, attackers, rounds, genuine_threads):
    """The genuine deliveries' answers (by status) while attackers flood the host; and the attackers'."""
    stop, attacked = threading.Event(), Counter()
    threads = [threading.Thread(target=attack, args=(server.base, pki, cert_host, stop, attacked), daemon=True)
               for _ in range(attackers)]
    for thread in threads:
        thread.start()
    try:
        with ThreadPoolExecutor(genuine_threads) as pool:
            statuses = Counter(pool.map(lambda send_one: send_one(),
                                        [genuine.paypal, genuine.stripe, genuine.razorpay] * rounds))
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    return statuses, attacked


@pytest.fixture
def host(gunicorn, pki, cert_host, paypal_api, stripe_api, razorpay_api):
    server = gunicorn(workers=2, threads=4)
    genuine = Genuine(server.base, pki, cert_host, paypal_api, stripe_api, razorpay_api)
    warm(genuine, 2)
    return server, genuine


def test_genuine_deliveries_are_not_starved_by_unsigned_requests_naming_new_certificate_urls(host, pki, cert_host):
    """Four attacker threads; the genuine deliveries one at a time (so that none waits on another's slot): every
    one is processed, none answered 503, and the attackers' requests past the budget were refused unfetched."""
    server, genuine = host
    statuses, attacked = flood(server, genuine, pki, cert_host, attackers=4, rounds=15, genuine_threads=1)
    assert statuses == Counter({200: 45})
    assert attacked[503] > 0 and set(attacked) <= {401, 503}
    assert cert_host.requests.count(cert_path("CERT-good")) <= 2  # PayPal's certificate: once per worker
    refused = metrics(server.base)[
        ("webhook_ledger_provider_calls_total", (("provider", "paypal_certificates"), ("result", "no_budget")))]
    assert refused == attacked[503]  # each attacker's 503 was a fetch refused, never a slot taken


@pytest.mark.skipif(not os.environ.get("CERT_FLOOD_MEASURE"), reason="a measurement, run by hand: "
                    "CERT_FLOOD_MEASURE=<file> pytest tests/providers/test_certificate_flood.py -k measure -n 0")
@pytest.mark.parametrize("attackers", [0, 1, 4, 12])
def test_measure_the_share_of_genuine_deliveries_answered_503_under_a_flood(host, pki, cert_host, attackers):
    """Appends one row of the table to the file CERT_FLOOD_MEASURE names: attackers, genuine deliveries answered
    503 of those sent, by provider, the attackers' requests and the certificate host's. Asserts nothing."""
    server, genuine = host
    seen_before = len(cert_host.requests)
    by_provider = {}
    stop, attacked = threading.Event(), Counter()
    threads = [threading.Thread(target=attack, args=(server.base, pki, cert_host, stop, attacked), daemon=True)
               for _ in range(attackers)]
    for thread in threads:
        thread.start()
    try:
        def one(send_one):
            return send_one.__name__, send_one()

        with ThreadPoolExecutor(3) as pool:
            for provider, status in pool.map(one, [genuine.paypal, genuine.stripe, genuine.razorpay] * 40):
                by_provider.setdefault(provider, Counter())[status] += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    shares = ", ".join(f"{provider} {counts[503]}/{sum(counts.values())}" for provider, counts in by_provider.items())
    with open(os.environ["CERT_FLOOD_MEASURE"], "a") as table:
        table.write(f"attackers={attackers}: genuine answered 503: {shares}; attacker requests "
                    f"{sum(attacked.values())} {dict(attacked)}; certificate host requests "
                    f"{len(cert_host.requests) - seen_before}\n")
