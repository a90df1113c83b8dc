"""The per-event Redis lock: an accelerator, never the source of truth.

`SET lock:webhook:<id> <token> NX PX <ttl>` via redis-py's Lock, released by
its compare-and-delete script, so only the delivery that took it frees it.
When Redis is unreachable the lock is skipped (degraded) and PostgreSQL's
unique constraint alone decides.
"""

import logging

import redis
from redis.backoff import NoBackoff
from redis.exceptions import LockError, RedisError
from redis.retry import Retry

log = logging.getLogger(__name__)

KEY_PREFIX = "lock:webhook:"
ACQUIRED, HELD_ELSEWHERE, DEGRADED = "acquired", "held_elsewhere", "degraded"


def init_app(app):
    timeout = app.config["REDIS_TIMEOUT_MS"] / 1000
    app.extensions["redis"] = redis.Redis.from_url(
        app.config["REDIS_URL"],
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        # redis-py retries three times with backoff by default: seconds of
        # stall per delivery when Redis is down. One try, then degrade.
        retry=Retry(NoBackoff(), 0),
    )


class EventLock:
    """The lock of one event id, taken with a fresh random token."""

    def __init__(self, client, event_id, ttl_ms):
        self._lock = client.lock(KEY_PREFIX + event_id, timeout=ttl_ms / 1000)
        self.event_id = event_id

    def acquire(self):
        """Return ACQUIRED, HELD_ELSEWHERE, or DEGRADED when Redis is unreachable."""
        try:
            return ACQUIRED if self._lock.acquire(blocking=False) else HELD_ELSEWHERE
        except RedisError as exc:
            log.warning("redis unavailable, event %s proceeds unlocked: %s", self.event_id, type(exc).__name__)
            return DEGRADED

    def release(self):
        """Delete the lock if this delivery still owns it; never someone else's."""
        try:
            self._lock.release()
        except LockError:
            log.warning("lock of event %s expired before release; left to its new owner", self.event_id)
        except RedisError as exc:
            log.warning("redis unavailable, lock of event %s left to expire: %s", self.event_id, type(exc).__name__)


def redis_ok(client):
    """Return whether Redis answers a PING now."""
    try:
        return bool(client.ping())
    except RedisError:
        return False
