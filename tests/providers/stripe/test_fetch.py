"""A stripe source that fetches (WEBHOOK_FETCH=true, app/providers/stripe.py): each delivery's event is retrieved
from Stripe's API ("Retrieve an event", https://docs.stripe.com/api/events/retrieve, here
devservers/stripe_stand_in.py, which stripe-python itself reads) and its money read from Stripe's copy.
Real PostgreSQL and Redis."""

import pytest
import stripe

from devservers.stripe_stand_in import API_KEY
from tests.helpers import (
    ALICE,
    OPENING,
    SECRETS,
    assert_ledger_consistent,
    balance,
    db_url,
    drain,
    event_rows,
    samples,
    send,
)
from tests.providers.stripe.events import intent_succeeded, stripe_signed

pytestmark = pytest.mark.core


@pytest.fixture
def config(db, redis_server, redis_client, stripe_api):
    return {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
            "WEBHOOK_SECRET": SECRETS["stripe"], "WEBHOOK_FETCH": "true", "WEBHOOK_API_KEY": API_KEY,
            "STRIPE_API_BASE": stripe_api.url}


def _send(client, evt):
    body, headers = stripe_signed(evt)
    return send(client, body, headers)


def test_stripe_pythons_client_retrieves_an_event_from_the_stand_in(stripe_api):
    evt = intent_succeeded("pi_sdk", cents=700)
    stripe_api.add(evt)
    client = stripe.StripeClient(API_KEY, base_addresses={"api": stripe_api.url})
    assert client.v1.events.retrieve(evt.id).data.object.amount_received == 700


def test_the_money_is_read_from_stripes_copy_of_the_event(client, db, stripe_api):
    kept = intent_succeeded("pi_fetched", cents=1200)
    stripe_api.add(kept)
    delivered = intent_succeeded("pi_fetched", cents=99_000, event_id=kept.id)
    assert _send(client, delivered).json["status"] == "processed"
    assert balance(db, ALICE) == OPENING[ALICE] + 1200
    assert samples(client.get("/metrics").text)[
        ("webhook_ledger_provider_contradictions_total", (("source", "default"),))] == 1
    assert_ledger_consistent(db)


def test_an_event_stripe_does_not_have_is_422_and_moves_nothing(client, db, stripe_api):
    response = _send(client, intent_succeeded("pi_unknown", cents=500))
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    assert "Stripe's API has no event" in response.json["message"]
    assert balance(db, ALICE) == OPENING[ALICE]


def test_stripe_unavailable_is_accepted_and_the_drain_applies_it(app, client, db, stripe_api):
    evt = intent_succeeded("pi_later", cents=300)
    stripe_api.add(evt)
    stripe_api.fail_next(500)
    response = _send(client, evt)
    assert (response.status, response.json["status"]) == (202, "accepted")
    assert event_rows(db) == 0
    assert drain(app, db) == 1
    assert balance(db, ALICE) == OPENING[ALICE] + 300


def test_a_completed_event_delivered_again_is_a_duplicate_without_asking_stripe(client, db, stripe_api,
                                                                               redis_client):
    evt = intent_succeeded("pi_again", cents=300)
    stripe_api.add(evt)
    assert _send(client, evt).json["status"] == "processed"
    asked = len(stripe_api.requests)
    assert _send(client, evt).json["status"] == "duplicate"  # the done marker decides
    redis_client.flushall()
    assert _send(client, evt).json["status"] == "duplicate"  # the stored row decides
    assert len(stripe_api.requests) == asked
    assert balance(db, ALICE) == OPENING[ALICE] + 300


def test_a_source_that_does_not_fetch_asks_stripe_nothing(make_app, config, db, stripe_api):
    client = make_app({**config, "WEBHOOK_FETCH": "false"}).test_client()
    asked = len(stripe_api.requests)
    assert _send(client, intent_succeeded("pi_plain", cents=400)).json["status"] == "processed"
    assert len(stripe_api.requests) == asked
