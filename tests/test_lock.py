"""app/lock.py: the lock and the "done" marker that lets Redis answer
re-deliveries of committed events without PostgreSQL."""

import hashlib
import threading

import psycopg
import pytest

from app.lock import EventLock, LockState, done_key, lock_key

from .helpers import ALICE, UNKNOWN_USER, balance, deliver, encode, payment


def test_redelivery_of_a_committed_event_is_answered_by_redis_alone(app, client, db, redis_client):
    event = payment("evt_fast")
    assert deliver(client, event).json["status"] == "processed"
    assert redis_client.get(done_key("evt_fast")) == hashlib.sha256(encode(event)).hexdigest().encode()
    app.extensions["db_pool"].close()  # any use of PostgreSQL now fails
    again = deliver(client, event)
    assert (again.status_code, again.json) == (200, {"status": "duplicate", "event_id": "evt_fast"})
    assert balance(db) == 1250


def test_scripts_forgotten_by_redis_are_sent_again(client, db, redis_client):
    redis_client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
    assert deliver(client, payment("evt_noscript")).json["status"] == "processed"
    assert redis_client.exists(done_key("evt_noscript")) and not redis_client.exists(lock_key("evt_noscript"))
    assert deliver(client, payment("evt_noscript")).json["status"] == "duplicate"


def test_different_bytes_under_a_done_id_still_reach_postgres(client, db, redis_client):
    assert deliver(client, payment("evt_changed", cents=5)).json["status"] == "processed"
    changed = deliver(client, payment("evt_changed", cents=500))
    assert (changed.status_code, changed.json["error"]) == (409, "payload_mismatch")
    assert db.execute("SELECT mismatches FROM webhook_events").fetchone()[0] == 1
    assert balance(db) == 1005


@pytest.mark.parametrize("event", [payment("evt_unknown_user", user=UNKNOWN_USER),
                                   payment("evt_zero", cents=0)])
def test_failed_events_are_not_marked_done(client, db, redis_client, event):
    assert deliver(client, event).status_code == 422
    assert not redis_client.exists(done_key(event["id"]))
    assert not redis_client.exists(lock_key(event["id"]))


def test_marker_is_written_only_after_commit(make_app, config, db, redis_client):
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 10000}).test_client()
    event = payment("evt_in_flight", cents=1)
    answer = {}
    with psycopg.connect(config["DATABASE_URL"]) as blocker:
        blocker.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        thread = threading.Thread(target=lambda: answer.update(r=deliver(client, event)))
        thread.start()
        thread.join(1.0)  # the delivery is now waiting on the row lock, inside its transaction
        assert thread.is_alive()
        assert redis_client.exists(lock_key("evt_in_flight"))
        assert not redis_client.exists(done_key("evt_in_flight"))
        blocker.rollback()
    thread.join(10)
    assert answer["r"].json["status"] == "processed"
    assert redis_client.exists(done_key("evt_in_flight"))


def test_flushed_marker_is_restored_by_the_postgres_answer(client, db, redis_client):
    event = payment("evt_restored")
    deliver(client, event)
    redis_client.flushall()
    assert deliver(client, event).json["status"] == "duplicate"  # PostgreSQL decided
    assert redis_client.exists(done_key("evt_restored"))
    assert balance(db) == 1250


def test_release_never_deletes_a_lock_taken_by_another_token(app, redis_client):
    scripts = app.extensions["redis_scripts"]
    first = EventLock(scripts, "evt_tokens", b"\x01" * 32, ttl_ms=50, done_ttl_ms=1000)
    assert first.acquire() == LockState.ACQUIRED
    redis_client.delete(lock_key("evt_tokens"))  # as if it expired
    second = EventLock(scripts, "evt_tokens", b"\x01" * 32, ttl_ms=10000, done_ttl_ms=1000)
    assert second.acquire() == LockState.ACQUIRED
    first.release(committed=False)
    assert EventLock(scripts, "evt_tokens", b"\x01" * 32, 10000, 1000).acquire() == LockState.HELD_ELSEWHERE
