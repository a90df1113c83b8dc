"""app/locking/lock.py: the lock and the "done" marker that lets Redis answer
re-deliveries of committed events without PostgreSQL."""

import hashlib
import threading

import psycopg
import pytest
from redis.crc import key_slot

from app.intake.events import parse
from app.locking.lock import FORGET_BATCH, EventLock, LockState, done_key, lock_key
from tests.helpers import ALICE, UNKNOWN_USER, assert_ledger_consistent, balance, encode, payment, send

pytestmark = pytest.mark.core


def test_redelivery_of_a_committed_event_is_answered_by_redis_alone(app, client, db, redis_client):
    event = payment("evt_fast")
    assert send(client, event).json["status"] == "processed"
    # The marker: the effect's SHA-256, then that of the bytes stored.
    effect, stored = redis_client.get(done_key("evt_fast")).decode().split(":")
    assert (len(effect), stored) == (64, hashlib.sha256(encode(event)).hexdigest())
    app.extensions["db_pool"].close()  # any use of PostgreSQL now fails
    again = send(client, event)
    assert (again.status, again.json) == (200, {"status": "duplicate", "event_id": "evt_fast"})
    assert balance(db) == 1250


def test_scripts_forgotten_by_redis_are_sent_again(client, db, redis_client):
    redis_client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
    assert send(client, payment("evt_noscript")).json["status"] == "processed"
    assert redis_client.exists(done_key("evt_noscript")) and not redis_client.exists(lock_key("evt_noscript"))
    assert send(client, payment("evt_noscript")).json["status"] == "duplicate"


def test_different_bytes_under_a_done_id_still_reach_postgres(client, db, redis_client):
    assert send(client, payment("evt_changed", cents=5)).json["status"] == "processed"
    changed = send(client, payment("evt_changed", cents=500))
    assert (changed.status, changed.json["error"]) == (409, "payload_mismatch")
    assert db.execute("SELECT mismatches FROM webhook_events").fetchone()[0] == 1
    assert balance(db) == 1005


@pytest.mark.parametrize("event", [payment("evt_unknown_user", user=UNKNOWN_USER),
                                   payment("evt_zero", cents=0)])
def test_failed_events_are_not_marked_done(client, db, redis_client, event):
    assert send(client, event).status == 422
    assert not redis_client.exists(done_key(event["id"]))
    assert not redis_client.exists(lock_key(event["id"]))


def test_marker_is_written_only_after_commit(make_app, config, db, redis_client):
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 10000}).test_client()
    event = payment("evt_in_flight", cents=1)
    answer = {}
    with psycopg.connect(config["DATABASE_URL"]) as blocker:
        blocker.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        thread = threading.Thread(target=lambda: answer.update(r=send(client, event)))
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
    send(client, event)
    redis_client.flushall()
    assert send(client, event).json["status"] == "duplicate"  # PostgreSQL decided
    assert redis_client.exists(done_key("evt_restored"))
    assert balance(db) == 1250


def test_release_never_deletes_a_lock_taken_by_another_token(app, redis_client):
    link = app.extensions["redis"]
    event = parse(encode(payment("evt_tokens")))
    first = EventLock(link, event, b"\x02" * 32, b"\x01" * 32, ttl_ms=50, done_ttl_ms=1000)
    assert first.acquire() == LockState.ACQUIRED
    redis_client.delete(lock_key("evt_tokens"))  # as if it expired
    second = EventLock(link, event, b"\x02" * 32, b"\x01" * 32, ttl_ms=10000, done_ttl_ms=1000)
    assert second.acquire() == LockState.ACQUIRED
    first.release(None)  # not committed
    third = EventLock(link, event, b"\x02" * 32, b"\x01" * 32, ttl_ms=10000, done_ttl_ms=1000)
    assert third.acquire() == LockState.HELD_ELSEWHERE


@pytest.mark.unit
@pytest.mark.parametrize("event_id", ["evt_1", "evt_2", "a{b}c", "{x}", "x}y", "}y", "ünïcödé", "e" * 255])
@pytest.mark.parametrize("source", ["default", "billing"])
def test_an_events_two_keys_share_one_cluster_slot(event_id, source):
    assert key_slot(lock_key(event_id, source).encode()) == key_slot(done_key(event_id, source).encode())
    assert lock_key(event_id, source) != lock_key(event_id + "x", source)


# -- after PostgreSQL lost commits (a failover, a restore from backup) --------

def _lose_the_commit(db, event_id, user=ALICE):
    """What a restore to a point before the event's COMMIT leaves: no row, no credit, the old balance."""
    cents, = db.execute("DELETE FROM ledger_journal WHERE event_id = %s RETURNING amount_cents", [event_id]).fetchone()
    db.execute("DELETE FROM payments WHERE event_id = %s", [event_id])
    db.execute("DELETE FROM webhook_events WHERE event_id = %s", [event_id])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents - %s WHERE user_id = %s", [cents, user])


def test_after_forget_done_a_redelivery_reaches_postgres(app, client, db, redis_client):
    event = payment("evt_lost_commit", cents=300)
    assert send(client, event).json["status"] == "processed"
    _lose_the_commit(db, "evt_lost_commit")
    # The marker outlived the commit: Redis alone would answer, and the credit be lost.
    assert send(client, event).json["status"] == "duplicate"
    assert balance(db) == 1000

    result = app.test_cli_runner().invoke(args=["redis", "forget-done"])
    assert (result.exit_code, result.output) == (
        0, "forgot 1 done markers: re-deliveries of those events now reach PostgreSQL\n")
    assert send(client, event).json["status"] == "processed"
    assert balance(db) == 1300
    assert_ledger_consistent(db)
    assert send(client, event).json["status"] == "duplicate"  # marked done again


MARKERS = 2 * FORGET_BATCH + 345  # three batches, the last one partial


def _forget_done_among_other_keys(app, redis_client):
    """MARKERS markers, one of the earlier spelling, a lock and an unrelated key; then `redis forget-done`."""
    pipe = redis_client.pipeline(transaction=False)
    for n in range(MARKERS):
        pipe.set(done_key(f"evt_{n}"), "00" * 32)
    pipe.set("done:webhook:evt_before_hash_tags", "00" * 32)  # the earlier spelling, without braces
    pipe.set(lock_key("evt_in_flight"), "token", px=60000)
    pipe.set("unrelated", "kept")
    pipe.execute()
    return app.test_cli_runner().invoke(args=["redis", "forget-done"])


def test_forget_done_deletes_every_marker_in_batches(app, redis_client):
    result = _forget_done_among_other_keys(app, redis_client)
    assert result.output.startswith(f"forgot {MARKERS + 1} done markers")
    assert list(redis_client.scan_iter(match="done:*")) == []


def test_forget_done_keeps_every_key_that_is_not_a_marker(app, redis_client):
    _forget_done_among_other_keys(app, redis_client)
    assert redis_client.exists(lock_key("evt_in_flight"), "unrelated") == 2


def test_forget_done_with_redis_down_says_so(make_app, config):
    app = make_app({**config, "REDIS_URL": "redis://127.0.0.1:1/0"})
    result = app.test_cli_runner().invoke(args=["redis", "forget-done"])
    assert result.exit_code == 1
    assert result.output == "Error: redis failed (unavailable); some markers may be left: run it again\n"
