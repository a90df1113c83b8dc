"""The per-event Redis lock, and the "done" marker: accelerators, never the
source of truth.

Taking the lock is `SET lock:webhook:<id> <token> NX PX <ttl>`; releasing it
is a compare-and-delete on the token, so only the delivery that took it
frees it. After a commit, the release also leaves `done:webhook:<id>` = the
body's SHA-256, so that a re-delivery of the same bytes is answered
`duplicate` by Redis alone, without reaching PostgreSQL. The marker is
written only after PostgreSQL committed; when Redis forgot it (flushed,
restarted, expired), PostgreSQL's unique constraint answers instead. When
Redis is unreachable the lock is skipped (degraded).
"""

import logging
import secrets
from enum import StrEnum

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

log = logging.getLogger(__name__)

LOCK_PREFIX, DONE_PREFIX = "lock:webhook:", "done:webhook:"


class LockState(StrEnum):
    """What taking an event's lock found; logged and counted under these names."""

    ACQUIRED = "acquired"  # this delivery holds the lock
    HELD_ELSEWHERE = "held_elsewhere"  # a twin delivery holds it now
    DONE = "done"  # these bytes were committed before: a duplicate
    DEGRADED = "degraded"  # Redis did not answer: PostgreSQL alone decides


class InProgress(RuntimeError):
    """Another delivery of the event holds its lock now: answered 409, retry later."""


def lock_key(event_id, source="default"):
    # The braces are a hash tag: on a Redis Cluster both keys of an event
    # fall in one slot, so that one script may touch both.
    return f"{LOCK_PREFIX}{{{source}:{event_id}}}"


def done_key(event_id, source="default"):
    return f"{DONE_PREFIX}{{{source}:{event_id}}}"


# The done marker's value: the committed effect's SHA-256, ':', and that of
# the stored bytes (hex), so that the same effect in other bytes is a
# duplicate answered here, and its log line can name both bodies.
# KEYS: lock, done marker. ARGV: token, lock TTL (ms), effect SHA-256 (hex).
# The marker: this effect was committed before; 1: lock taken; 0: held by a twin.
ACQUIRE = """
local done = redis.call('get', KEYS[2])
if done and string.sub(done, 1, 64) == ARGV[3] then return done end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# KEYS: lock, done marker. ARGV: token, the marker or '' (not committed), marker TTL (ms).
RELEASE = """
if ARGV[2] ~= '' then redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def init_app(app):
    timeout = app.config["REDIS_TIMEOUT_MS"] / 1000
    client = redis.Redis.from_url(
        app.config["REDIS_URL"],
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        # redis-py retries three times with backoff by default: seconds of
        # stall per delivery when Redis is down. One try, then degrade.
        retry=Retry(NoBackoff(), 0),
    )
    app.extensions["redis"] = client
    # Script objects run EVALSHA and load the script again after a restart.
    app.extensions["redis_scripts"] = (client.register_script(ACQUIRE), client.register_script(RELEASE))


class EventLock:
    """The lock of one delivery of one event, with a fresh random token."""

    def __init__(self, scripts, event, body_sha256, ttl_ms, done_ttl_ms):
        self._acquire, self._release = scripts
        self._keys = [lock_key(event.id, event.source), done_key(event.id, event.source)]
        self._token = secrets.token_hex(16)
        self._effect = event.effect.hex()
        self._sha256 = body_sha256
        self._ttl_ms, self._done_ttl_ms = ttl_ms, done_ttl_ms
        self.event_id = event.id
        self.stored_sha256 = None  # of the committed bytes, when the marker answered

    def acquire(self):
        """Return ACQUIRED, HELD_ELSEWHERE, DONE, or DEGRADED when Redis is unreachable."""
        try:
            taken = self._acquire(keys=self._keys, args=[self._token, self._ttl_ms, self._effect])
        except RedisError as exc:
            log.warning("redis unavailable, event %r proceeds unlocked: %s", self.event_id, type(exc).__name__)
            return LockState.DEGRADED
        if isinstance(taken, bytes):
            stored = taken[65:]
            self.stored_sha256 = bytes.fromhex(stored.decode()) if stored else None
            return LockState.DONE
        return LockState.ACQUIRED if taken == 1 else LockState.HELD_ELSEWHERE

    def release(self, result):
        """Delete the lock if this delivery still owns it; mark the event done if result is committed."""
        marker = ""
        if result is not None and result.committed:
            # A duplicate leaves the bytes stored before; a processed event stored these.
            stored = result.stored_sha256 if result.outcome == "duplicate" and result.stored_sha256 else self._sha256
            marker = self._effect + ":" + stored.hex()
        try:
            if not self._release(keys=self._keys, args=[self._token, marker, self._done_ttl_ms]):
                log.warning("lock of event %r expired before release; left to its new owner", self.event_id)
        except RedisError as exc:
            log.warning("redis unavailable, lock of event %r left to expire: %s", self.event_id, type(exc).__name__)


def redis_ok(client):
    """Return whether Redis answers a PING now."""
    try:
        return bool(client.ping())
    except RedisError:
        return False
