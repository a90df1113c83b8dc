"""Reading in pages when behind (docs/design.md, "The provider's pace"): a backlog of waiting notifications of one
Stripe source is drained from pages of Stripe's lists (List Events, https://docs.stripe.com/api/events/list; List all
PaymentIntents, https://docs.stripe.com/api/payment_intents/list), not one request each, and each record found is
applied through the fetch path a single read takes, once. Thin bodies as https://docs.stripe.com/api/v2/core/events/object
shows them; Stripe's API is devservers/stripe_stand_in.py, spoken to over HTTP. Real PostgreSQL and Redis."""

import time
import uuid
from datetime import UTC, datetime

import pytest

from app.receiver import pages
from devservers.stripe_stand_in import API_KEY
from tests.helpers import (
    ALICE,
    BOB,
    OPENING,
    SECRETS,
    UNMETERED,
    assert_ledger_consistent,
    balance,
    db_url,
    drain,
    event_rows,
    send,
    waiting_rows,
)
from tests.providers.stripe.events import intent_succeeded, stripe_signed, thin, thin_signed

pytestmark = pytest.mark.core

ACCOUNT, OTHER = "acct_1PagesA", "acct_1PagesB"


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    # WEBHOOK_FETCH: every snapshot event is fetched by id; thin events' objects are read either way.
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stripe_api.url,
            "WEBHOOK_FETCH": "true", **UNMETERED}


def _stamp(unix):
    """A thin event's `created`: RFC 3339 with milliseconds, as Stripe's v2 events carry it."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _intent(cents, user=ALICE, created=None):
    """A succeeded PaymentIntent as Stripe's API has it, created (Unix seconds) a little before now by default."""
    obj = intent_succeeded(f"pi_{uuid.uuid4().hex[:24]}", user=user, cents=cents).data.object.to_dict()
    obj["created"] = int(time.time()) - 5 if created is None else created
    return obj


def _thin_paid(stripe_api, cents, user=ALICE, context=None, created=None):
    """A PaymentIntent put at Stripe (in context) and its thin v1.payment_intent.succeeded, created after it."""
    obj = _intent(cents, user, created)
    stripe_api.put(obj, context=context)
    evt = thin("v1.payment_intent.succeeded", obj, context=context)
    evt["created"] = _stamp(obj["created"] + 2)
    return obj, evt


def _accept_all(client, stripe_api, deliveries):
    """Deliver each (bytes, headers) while Stripe answers 503: each accepted, to wait for the drain."""
    for body, headers in deliveries:
        stripe_api.fail_next(503)
        answer = send(client, body, headers)
        assert (answer.status, answer.json["status"]) == (202, "accepted"), answer.json
    stripe_api.recover()


def _since(stripe_api, asked):
    """The requests the stand-in saw since it had seen asked: (list requests, single reads)."""
    seen = stripe_api.requests[asked:]
    listed = [r for r in seen if "limit" in r]
    return listed, [r for r in seen if r not in listed]


def test_a_backlog_of_thin_and_fetched_events_is_read_in_pages_and_each_payment_credited_once(client, db,
                                                                                             stripe_api):
    thin_count, fetched_count = 250, 150
    deliveries, expected = [], 0
    for n in range(thin_count):
        _, evt = _thin_paid(stripe_api, 100 + n)
        deliveries.append(thin_signed(evt))
        expected += 100 + n
    for n in range(fetched_count):
        evt = intent_succeeded(f"pi_{uuid.uuid4().hex[:24]}", cents=10 + n)
        stripe_api.add(evt)  # Stripe's own copy: what Retrieve an event and List Events answer
        deliveries.append(stripe_signed(evt))
        expected += 10 + n
    _accept_all(client, stripe_api, deliveries)
    assert waiting_rows(db) == thin_count + fetched_count
    asked = len(stripe_api.requests)
    assert drain(client.application, db) == thin_count + fetched_count
    listed, single = _since(stripe_api, asked)
    # A page carries 100 records: a few pages and the single reads of what they did not carry (none here) in all.
    assert 0 < len(listed) + len(single) <= (thin_count + fetched_count) // 20, (len(listed), len(single))
    assert {r.get("list", "event") for r in listed} == {"payment_intent", "event"}
    assert balance(db, ALICE) == OPENING[ALICE] + expected
    assert event_rows(db) == thin_count + fetched_count and waiting_rows(db) == 0
    # Delivered again after the drain: duplicates, no money.
    for body, headers in deliveries[:3] + deliveries[-3:]:
        assert send(client, body, headers).json["status"] == "duplicate"
    assert balance(db, ALICE) == OPENING[ALICE] + expected
    assert_ledger_consistent(db)


def test_a_payment_the_pages_do_not_carry_is_applied_by_its_single_read(client, db, stripe_api):
    deliveries = [thin_signed(_thin_paid(stripe_api, 100)[1]) for _ in range(pages.PAGED_AFTER + 20)]
    # A PaymentIntent created two days before it succeeded: older than the pages look back.
    late, late_evt = _thin_paid(stripe_api, 4321, created=int(time.time()) - 2 * 86400)
    late_evt["created"] = _stamp(int(time.time()) - 3)
    deliveries.append(thin_signed(late_evt))
    _accept_all(client, stripe_api, deliveries)
    asked = len(stripe_api.requests)
    drain(client.application, db)
    listed, single = _since(stripe_api, asked)
    assert listed and [r["id"] for r in single] == [late["id"]]  # its one retrieve, after the pages
    assert balance(db, ALICE) == OPENING[ALICE] + 100 * (pages.PAGED_AFTER + 20) + 4321
    assert waiting_rows(db) == 0
    assert_ledger_consistent(db)


def test_connected_accounts_are_read_in_their_own_pages_and_keep_their_own_money(client, db, stripe_api):
    """The same PaymentIntent ids in two connected accounts, different amounts: each account's list is read in its
    own context (Stripe-Context), and each credit is its own account's object's."""
    deliveries = []
    for _ in range(pages.PAGED_AFTER):
        obj = _intent(300, user=ALICE)
        other = {**obj, "amount": 70, "amount_received": 70, "metadata": {"user_id": str(BOB)}}
        for account, document in ((ACCOUNT, obj), (OTHER, other)):
            stripe_api.put(document, context=account)
            evt = thin("v1.payment_intent.succeeded", document, context=account)
            evt["created"] = _stamp(obj["created"] + 2)
            deliveries.append(thin_signed(evt))
    _accept_all(client, stripe_api, deliveries)
    asked = len(stripe_api.requests)
    assert drain(client.application, db) == 2 * pages.PAGED_AFTER
    listed, single = _since(stripe_api, asked)
    assert not single and {r["context"] for r in listed} == {ACCOUNT, OTHER}
    assert len(listed) <= 6  # two accounts, 100 each: a page (and at most a look past it) each
    assert balance(db, ALICE) == OPENING[ALICE] + 300 * pages.PAGED_AFTER
    assert balance(db, BOB) == OPENING[BOB] + 70 * pages.PAGED_AFTER
    assert_ledger_consistent(db)


def test_fewer_than_a_page_s_worth_are_read_one_by_one(client, db, stripe_api):
    deliveries = [thin_signed(_thin_paid(stripe_api, 100)[1]) for _ in range(pages.PAGED_AFTER - 1)]
    _accept_all(client, stripe_api, deliveries)
    asked = len(stripe_api.requests)
    drain(client.application, db)
    listed, single = _since(stripe_api, asked)
    assert not listed and len(single) == pages.PAGED_AFTER - 1
    assert balance(db, ALICE) == OPENING[ALICE] + 100 * (pages.PAGED_AFTER - 1)
