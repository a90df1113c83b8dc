"""app/ledger.py: the one transaction, its journal of credits and its payload check."""

import hashlib
import json

import pytest

from .helpers import ALICE, assert_ledger_consistent, balance, deliver, encode, payment, signed_headers


def _row(db, event_id):
    return db.execute("SELECT status, attempts, mismatches, last_mismatch_at IS NOT NULL, payload_sha256 "
                      "FROM webhook_events WHERE event_id = %s", [event_id]).fetchone()


def test_processed_credit_is_journaled_in_the_same_transaction(client, db):
    body = encode(payment("evt_journal", cents=250))
    client.post("/api/webhooks", data=body, headers=signed_headers(body))
    assert db.execute("SELECT event_id, user_id, amount_cents FROM ledger_credits").fetchall() == \
        [("evt_journal", ALICE, 250)]
    assert _row(db, "evt_journal")[4] == hashlib.sha256(body).digest()


@pytest.mark.parametrize("first_cents, stored_status", [(250, "completed"), (0, "failed")])
def test_same_id_with_a_different_body_is_409_recorded_and_has_no_effect(client, db, first_cents, stored_status):
    original = payment("evt_twice", cents=first_cents)
    deliver(client, original)
    before = (balance(db), _row(db, "evt_twice")[:2])

    forged = payment("evt_twice", cents=99999)
    response = deliver(client, forged)
    assert response.status_code == 409
    assert response.json["error"] == "payload_mismatch"
    assert response.json["event_id"] == "evt_twice"
    assert (balance(db), _row(db, "evt_twice")[:2]) == before
    assert before[1][0] == stored_status
    assert _row(db, "evt_twice")[2:4] == (1, True)
    stored = db.execute("SELECT payload FROM webhook_events WHERE event_id = 'evt_twice'").fetchone()[0]
    assert stored["data"]["amountCents"] == first_cents  # the stored payload is not overwritten
    assert_ledger_consistent(db)


def test_same_effect_in_other_bytes_is_a_duplicate(client, db):
    event = payment("evt_bytes", cents=5)
    deliver(client, event)
    response = deliver(client, json.dumps(event, indent=1).encode())
    assert response.json == {"status": "duplicate", "event_id": "evt_bytes"}
    assert balance(db) == 1005
    assert _row(db, "evt_bytes")[2] == 0  # not a mismatch


def test_identical_redelivery_is_still_a_duplicate(client, db):
    event = payment("evt_same", cents=5)
    deliver(client, event)
    assert deliver(client, event).json == {"status": "duplicate", "event_id": "evt_same"}
    assert _row(db, "evt_same")[2] == 0
