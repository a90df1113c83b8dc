"""app/store/ledger.py: the one statement, its journal, and the effect check of a re-delivered id."""

import hashlib
import json
import uuid

import pytest

from tests.helpers import ALICE, assert_ledger_consistent, balance, encode, payment, send, stored_event_row

pytestmark = pytest.mark.core


def test_processed_credit_is_journaled_in_the_same_transaction(client, db):
    body = encode(payment("evt_journal", cents=250))
    send(client, body)
    assert db.execute("SELECT event_id, user_id, amount_cents FROM ledger_journal").fetchall() == \
        [("evt_journal", ALICE, 250)]
    assert stored_event_row(db, "evt_journal").payload_sha256 == hashlib.sha256(body).digest()


# The first delivery of evt_twice, then the stored status it leaves: a credit applied, or refused (0 cents).
FIRSTS = pytest.mark.parametrize("first_cents, stored_status", [(250, "completed"), (0, "failed")])


def _forged_after(client, db, first_cents, stored_status):
    """evt_twice delivered with first_cents, then again with another amount.

    Returns (the balance, the row's status and attempts) before the second delivery, and its answer."""
    send(client, payment("evt_twice", cents=first_cents))
    stored = stored_event_row(db, "evt_twice")
    assert stored.status == stored_status
    return (balance(db), stored.status, stored.attempts), send(client, payment("evt_twice", cents=99999))


@FIRSTS
def test_same_id_with_a_different_body_is_409_payload_mismatch(client, db, first_cents, stored_status):
    _, response = _forged_after(client, db, first_cents, stored_status)
    assert response.status == 409
    assert response.json["error"] == "payload_mismatch"
    assert response.json["event_id"] == "evt_twice"


@FIRSTS
def test_same_id_with_a_different_body_is_recorded_as_a_mismatch(client, db, first_cents, stored_status):
    _forged_after(client, db, first_cents, stored_status)
    after = stored_event_row(db, "evt_twice")
    assert after.mismatches == 1 and after.last_mismatch_at is not None


@FIRSTS
def test_same_id_with_a_different_body_has_no_effect(client, db, first_cents, stored_status):
    before, _ = _forged_after(client, db, first_cents, stored_status)
    after = stored_event_row(db, "evt_twice")
    assert (balance(db), after.status, after.attempts) == before
    payload = db.execute("SELECT payload FROM webhook_events_json WHERE event_id = 'evt_twice'").fetchone()[0]
    assert payload["data"]["amountCents"] == first_cents  # the stored payload is not overwritten
    assert_ledger_consistent(db)


def test_same_effect_in_other_bytes_is_a_duplicate(client, db):
    event = payment("evt_bytes", cents=5)
    send(client, event)
    response = send(client, json.dumps(event, indent=1).encode())
    assert response.json == {"status": "duplicate", "event_id": "evt_bytes"}
    assert balance(db) == 1005
    assert stored_event_row(db, "evt_bytes").mismatches == 0  # not a mismatch


def test_identical_redelivery_is_still_a_duplicate(client, db):
    event = payment("evt_same", cents=5)
    send(client, event)
    assert send(client, event).json == {"status": "duplicate", "event_id": "evt_same"}
    assert stored_event_row(db, "evt_same").mismatches == 0


# -- effects compare on normalised values ------------------------------------------

DORA = uuid.UUID("dddddddd-aaaa-4bbb-8ccc-eeeeeeeeeeee")  # hex letters, so that its spellings differ


@pytest.mark.parametrize("first, again", [
    ({}, {"userId": str(DORA).upper()}),
    ({}, {"userId": "{" + str(DORA) + "}"}),
    ({}, {"userId": DORA.hex}),
    ({"currency": "usd"}, {"currency": "USD"}),
    ({}, {"currency": "usd"}),  # the ledger's currency, implied, then named
], ids=["upper-case-uuid", "braced-uuid", "uuid-without-hyphens", "currency-case", "currency-implied"])
def test_the_same_credit_spelled_otherwise_is_a_duplicate(client, db, first, again):
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [DORA])
    assert send(client, payment("evt_spelled", user=DORA, cents=70, **first)).json["status"] == "processed"
    response = send(client, payment("evt_spelled", user=DORA, cents=70, **again))
    assert response.json == {"status": "duplicate", "event_id": "evt_spelled"}
    assert balance(db, DORA) == 70
    assert stored_event_row(db, "evt_spelled").mismatches == 0  # not a mismatch
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone()[0] == 1


@pytest.mark.parametrize("first, again, first_status", [
    ({"currency": None}, {}, 422),   # a null currency is refused, a missing one implied
    ({}, {"currency": None}, 200),
    ({"currency": "eur"}, {}, 422),
])
def test_a_refused_and_an_applied_body_never_compare_equal(client, db, first, again, first_status):
    assert send(client, payment("evt_refused", cents=70, **first)).status == first_status
    before = balance(db)
    response = send(client, payment("evt_refused", cents=70, **again))
    assert (response.status, response.json["error"]) == (409, "payload_mismatch")
    assert balance(db) == before
