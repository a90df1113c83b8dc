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
from redis.exceptions import NoScriptError, RedisError
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


def lock_key(event_id):
    return LOCK_PREFIX + event_id


def done_key(event_id):
    return DONE_PREFIX + event_id

# KEYS: lock, done marker. ARGV: token, lock TTL (ms), body SHA-256 (hex).
# 2: these bytes were committed before; 1: lock taken; 0: held by a twin.
ACQUIRE = """
if redis.call('get', KEYS[2]) == ARGV[3] then return 2 end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# KEYS: lock, done marker. ARGV: token, body SHA-256 or '' (not committed), marker TTL (ms).
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

    def __init__(self, scripts, event_id, body_sha256, ttl_ms, done_ttl_ms):
        self._acquire, self._release = scripts
        self._keys = [lock_key(event_id), done_key(event_id)]
        self._token = secrets.token_hex(16)
        self._sha256 = body_sha256.hex()
        self._ttl_ms, self._done_ttl_ms = ttl_ms, done_ttl_ms
        self.event_id = event_id

    def acquire(self):
        """Return ACQUIRED, HELD_ELSEWHERE, DONE, or DEGRADED when Redis is unreachable."""
        try:
            taken = _run(self._acquire, self._keys, self._token, self._ttl_ms, self._sha256)
        except RedisError as exc:
            log.warning("redis unavailable, event %r proceeds unlocked: %s", self.event_id, type(exc).__name__)
            return LockState.DEGRADED
        return {2: LockState.DONE, 1: LockState.ACQUIRED}.get(taken, LockState.HELD_ELSEWHERE)

    def release(self, committed):
        """Delete the lock if this delivery still owns it; mark the event done if committed."""
        try:
            if not _run(self._release, self._keys, self._token, self._sha256 if committed else "", self._done_ttl_ms):
                log.warning("lock of event %r expired before release; left to its new owner", self.event_id)
        except RedisError as exc:
            log.warning("redis unavailable, lock of event %r left to expire: %s", self.event_id, type(exc).__name__)


def _run(script, keys, *args):
    """EVALSHA through the client's execute_command, EVAL when Redis does not
    have the script (restarted, flushed): redis-py's Script call adds layers
    that cost more than the round trip (docs/performance.md)."""
    client = script.registered_client
    try:
        return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return client.execute_command("EVAL", script.script, len(keys), *keys, *args)


def redis_ok(client):
    """Return whether Redis answers a PING now."""
    try:
        return bool(client.ping())
    except RedisError:
        return False
