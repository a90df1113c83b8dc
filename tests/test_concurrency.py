"""Concurrent deliveries against the real gunicorn: exactly one credit per
event, under every signature scheme, on the default source and a named one."""

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from .helpers import (
    ALICE,
    BOB,
    EVERY_SCHEME,
    EVERY_SCHEME_AND_A_NAMED_SOURCE,
    assert_ledger_consistent,
    balance,
    burst,
    encode,
    event_rows,
    payment,
    send,
    signed_headers,
    source_secret,
    sources_config,
)

pytestmark = pytest.mark.core


def _assert_one_processed(answers, event_id):
    outcomes = Counter((status, body.get("status")) for status, body, _ in answers)
    assert outcomes[(200, "processed")] == 1, outcomes
    assert set(outcomes) <= {(200, "processed"), (200, "duplicate"), (409, "in_progress")}, outcomes
    for status, body, headers in answers:
        assert body["event_id"] == event_id
        if status == 409:
            assert int(headers["Retry-After"]) >= 1


@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_fifty_concurrent_twins_credit_once(gunicorn, db, sign, source):
    server = gunicorn(workers=3, threads=4)
    body = encode(payment("evt_burst", cents=125))
    _assert_one_processed(burst([server.base], body, sign(body), source=source), "evt_burst")
    assert balance(db) == 1125
    assert event_rows(db, source) == event_rows(db) == 1
    assert_ledger_consistent(db)


@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_fifty_concurrent_twins_across_two_hosts_credit_once(gunicorn, db, sign, source):
    hosts = [gunicorn(workers=2, threads=4), gunicorn(workers=2, threads=4)]
    body = encode(payment("evt_two_hosts", user=BOB, cents=990))
    _assert_one_processed(burst([h.base for h in hosts], body, sign(body), source=source), "evt_two_hosts")
    assert balance(db, BOB) == 990
    assert event_rows(db, source) == event_rows(db) == 1
    assert_ledger_consistent(db)


def test_concurrent_twins_of_one_id_on_two_sources_credit_once_each(gunicorn, db, config):
    """Two providers that happen to use one id, each sending twins at the same instant: two events, two credits."""
    named = sources_config(config, {"billing": None, "stripe": None})
    hosts = [gunicorn(workers=2, threads=4, **named), gunicorn(workers=2, threads=4, **named)]
    body = encode(payment("evt_shared", cents=70))
    sends = [(source, signed_headers(body, source_secret(source, scheme), scheme=scheme))
             for source, scheme in (("billing", "hmac-sha256"), ("stripe", "stripe"))] * 25
    barrier = threading.Barrier(len(sends))

    def send_one(i):
        source, headers = sends[i]
        barrier.wait()
        # Each source's twins are spread over both hosts.
        return source, send(hosts[i // 2 % 2].base, body, headers, source=source)

    with ThreadPoolExecutor(len(sends)) as pool:
        answers = list(pool.map(send_one, range(len(sends))))
    for source in ("billing", "stripe"):
        _assert_one_processed([answer for sent_to, answer in answers if sent_to == source], "evt_shared")
        assert event_rows(db, source) == 1
    assert balance(db) == 1140
    assert db.execute("SELECT source FROM ledger_journal ORDER BY source").fetchall() == [("billing",), ("stripe",)]
    assert_ledger_consistent(db)


@EVERY_SCHEME
def test_shuffled_deliveries_of_many_events_sum_to_distinct_credits(gunicorn, db, sign):
    """A provider that retries every non-2xx until it gets a 2xx."""
    hosts = [gunicorn(workers=2, threads=4), gunicorn(workers=2, threads=4)]
    rng = random.Random(7)
    events = [payment(f"evt_many_{i}", user=rng.choice([ALICE, BOB]), cents=rng.randint(1, 5000))
              for i in range(60)]
    deliveries = [e for e in events for _ in range(rng.randint(1, 6))]
    rng.shuffle(deliveries)

    def deliver_until_acknowledged(i_event):
        i, event = i_event
        body = encode(event)
        for _ in range(200):
            status, answer, _ = send(hosts[i % 2].base, body, sign(body))
            if status == 200:
                return event["id"], answer["status"]
            assert status == 409, (status, answer)
        raise AssertionError(f"{event['id']} never acknowledged")

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(deliver_until_acknowledged, enumerate(deliveries)))

    processed = Counter(event_id for event_id, status in results if status == "processed")
    assert processed == Counter({e["id"]: 1 for e in events})
    for user, opening in ((ALICE, 1000), (BOB, 0)):
        expected = opening + sum(e["data"]["amountCents"] for e in events if e["data"]["userId"] == str(user))
        assert balance(db, user) == expected
    assert_ledger_consistent(db)


def test_movements_of_one_users_payments_never_wait_in_a_circle(gunicorn, db):
    """150 payments of one user, each announced again and refunded at the same time, 8 at once: every movement
    locks its payment's row before its user's, so none waits for another in a circle (no 503 from contention)."""
    server = gunicorn(workers=2, threads=4)

    def send_one(event):
        return send(server.base, event)

    payments = [payment(f"evt_storm_{n}", user=BOB, cents=100, paymentId=f"pay_storm_{n}") for n in range(150)]
    for event in payments:
        assert send_one(event).status == 200
    storm = []
    for n in range(len(payments)):
        storm.append(payment(f"evt_storm_again_{n}", user=BOB, cents=100, paymentId=f"pay_storm_{n}"))
        storm.append({"id": f"evt_storm_refund_{n}", "type": "payment.refunded",
                      "data": {"paymentId": f"pay_storm_{n}", "amountRefundedCents": 40}})
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send_one, storm))
    assert Counter(status for status, _, _ in answers) == {200: 300}
    assert balance(db, BOB) == 150 * 60
    assert_ledger_consistent(db)
