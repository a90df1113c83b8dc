"""The per-event Redis lock and the "done" marker: accelerators, never the source of truth
(docs/design.md, "Invariant 3" and "Invariant 4")."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from ..intake.events import DEFAULT_SOURCE, Effect, Event
from ..settings.config import Settings
from ..store.ledger import Result
from ..store.outcome import Outcome
from .redis_client import UNAVAILABLE, RedisLink, UnusableError

if TYPE_CHECKING:
    import redis
    from flask import Flask
    from redis.cluster import RedisCluster

log = logging.getLogger(__name__)

LOCK_PREFIX, DONE_PREFIX = "lock:webhook:", "done:webhook:"


class LockState(StrEnum):
    """What taking an event's lock found; logged and counted under these names."""

    ACQUIRED = "acquired"  # this delivery holds the lock
    HELD_ELSEWHERE = "held_elsewhere"  # a twin delivery holds it now
    DONE = "done"  # this effect was committed before: a duplicate
    DEGRADED = "degraded"  # Redis could not be used (unavailable or a fault): PostgreSQL alone decides


class InProgressError(RuntimeError):
    """Another delivery of the event holds its lock now: answered 409, retry later."""


# Redis hashes only what lies between the first "{" and the next "}": the
# source's name and a ":" at least (a name has no "}"), the same for both keys
# of an event whatever its id, so that one script may touch both on a cluster.
def lock_key(event_id: str, source: str = DEFAULT_SOURCE) -> str:
    return f"{LOCK_PREFIX}{{{source}:{event_id}}}"


def done_key(event_id: str, source: str = DEFAULT_SOURCE) -> str:
    return f"{DONE_PREFIX}{{{source}:{event_id}}}"


# The done marker is '<effect SHA-256>:<stored bytes' SHA-256>' (hex): the
# bytes' hash lets a duplicate's log line name both bodies.
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


# The readiness probe runs the acquire script as a delivery would (same
# command, ACL, slot, memory) on an id of its own, with a 1 ms lock that
# expires on its own. An event with this id would at worst see a 409 for 1 ms.
PROBE_EVENT_ID = "webhook-ledger:ready-probe"
# done markers deleted per round trip by forget_done: a batch small enough
# that the server never blocks long on one.
FORGET_BATCH = 1000


def init_app(app: Flask) -> None:
    settings = Settings.of(app)
    if settings.redis_url is None:  # read for a command that needs no Redis (config.Needs)
        return
    link = RedisLink(settings.redis_url, settings.redis_cluster, settings.redis_timeout_ms / 1000)
    app.extensions["redis"] = link
    app.extensions["locks"] = Locks(link, settings)


def redis_of(app: Flask) -> RedisLink | None:
    """The app's Redis link; None for a command that reads no REDIS_URL (config.Needs)."""
    link: RedisLink | None = app.extensions.get("redis")
    return link


class Locks:
    """Each delivery's EventLock, on the app's Redis link, held and remembered as long as the settings say."""

    def __init__(self, link: RedisLink, settings: Settings) -> None:
        self._link = link
        self._ttl_ms, self._done_ttl_ms = settings.lock_ttl_ms, settings.redis_done_ttl_seconds * 1000

    @staticmethod
    def of(app: Flask) -> Locks:
        """The locks init_app made for the app."""
        locks: Locks = app.extensions["locks"]
        return locks

    def event_lock(self, event: Event, effect: Effect, payload_sha256: bytes) -> EventLock:
        """The lock of one delivery of event, whose effect and received bytes are given."""
        return EventLock(self._link, event, effect.sha256, payload_sha256, ttl_ms=self._ttl_ms,
                         done_ttl_ms=self._done_ttl_ms)


class EventLock:
    """The lock of one delivery of one event, with a fresh random token."""

    def __init__(self, link: RedisLink, event: Event, effect_sha256: bytes, payload_sha256: bytes, *, ttl_ms: int,
                 done_ttl_ms: int) -> None:
        self._link = link
        self._keys = [lock_key(event.id, event.source), done_key(event.id, event.source)]
        self._token = secrets.token_hex(16)
        self._effect_sha256 = effect_sha256.hex()
        self._payload_sha256 = payload_sha256
        self._ttl_ms, self._done_ttl_ms = ttl_ms, done_ttl_ms
        self.event_id = event.id
        self.state: LockState | None = None  # what acquire found; None before it ran
        self.fault: str | None = None  # the reason of a Redis fault met by this delivery, if any
        self.stored_sha256: bytes | None = None  # of the committed bytes, when the marker answered

    def apply_once(self, apply: Callable[[], Result]) -> Result:
        """Run apply (one transaction) under the lock, or answer without it; the lock marks the event done only if
        apply committed."""
        # A done marker of this effect is a duplicate, answered without PostgreSQL; a twin holding the lock is
        # InProgressError (409, retry later); without Redis (DEGRADED) apply runs unlocked and PostgreSQL alone decides.
        state = self.acquire()
        if state == LockState.DONE:
            return Result(Outcome.DUPLICATE, stored_sha256=self.stored_sha256)
        if state == LockState.HELD_ELSEWHERE:
            raise InProgressError("another delivery of this event is being processed; retry later")
        applied = None  # None when the transaction raised: release() leaves no done marker
        try:
            applied = apply()
        finally:
            if state == LockState.ACQUIRED:
                self.release(applied)
        return applied

    def acquire(self) -> LockState:
        """Return ACQUIRED, HELD_ELSEWHERE, DONE, or DEGRADED when Redis cannot be used (also kept in state)."""
        self.state = self._acquire()
        return self.state

    def _acquire(self) -> LockState:
        try:
            taken = self._link.run(ACQUIRE, self._keys, [self._token, self._ttl_ms, self._effect_sha256])
        except UnusableError as exc:
            self._failed(exc.reason, "event %r proceeds unlocked")
            return LockState.DEGRADED
        if isinstance(taken, bytes):
            stored = taken[65:]
            self.stored_sha256 = bytes.fromhex(stored.decode()) if stored else None
            return LockState.DONE
        return LockState.ACQUIRED if taken == 1 else LockState.HELD_ELSEWHERE

    def release(self, result: Result | None) -> None:
        """Delete the lock if this delivery still owns it; mark the event done if result is committed."""
        marker = ""
        if result is not None and result.committed:
            # A duplicate leaves the bytes stored before; a processed event stored these.
            stored = self._payload_sha256
            if result.outcome == Outcome.DUPLICATE and result.stored_sha256:
                stored = result.stored_sha256
            marker = self._effect_sha256 + ":" + stored.hex()
        args: list[str | int] = [self._token, marker, self._done_ttl_ms]
        try:
            if not self._link.run(RELEASE, self._keys, args):
                log.warning("lock of event %r expired before release; left to its new owner", self.event_id)
        except UnusableError as exc:
            self._failed(exc.reason, "lock of event %r left to expire")

    def _failed(self, reason: str, what: str) -> None:
        if reason == UNAVAILABLE:
            log.warning(f"redis unavailable, {what}", self.event_id)
        else:
            self.fault = reason  # logged (at most once a minute) by the link, counted with the delivery


def is_done(app: Flask, event: Event) -> bool:
    """Whether Redis remembers event committed (any effect); False when Redis cannot say (PostgreSQL decides)."""
    link = redis_of(app)
    assert link is not None  # the service reads REDIS_URL
    try:
        return bool(link.run(IS_DONE, [done_key(event.id, event.source)], []))
    except UnusableError:
        return False


# KEYS: done marker. 1 when it exists.
IS_DONE = "return redis.call('exists', KEYS[1])"


def probe(link: RedisLink) -> str | None:
    """Return None if Redis runs the lock script now, else why not (UNAVAILABLE or a fault's reason)."""
    keys = [lock_key(PROBE_EVENT_ID), done_key(PROBE_EVENT_ID)]
    try:
        link.run(ACQUIRE, keys, [secrets.token_hex(16), 1, ""])
    except UnusableError as exc:
        return exc.reason
    return None


def forget_done(link: RedisLink) -> int:
    """Delete every done marker, on every primary of a cluster; return how many were deleted."""
    # After PostgreSQL lost commits (a failover, a restore), a marker could answer `duplicate` for an event that
    # PostgreSQL no longer has.
    client = link.client()
    deleted, batch = 0, []
    # SCAN, not KEYS: the server answers other clients between two batches.
    # A cluster client's scan_iter walks every primary in turn.
    for key in client.scan_iter(match=f"{DONE_PREFIX}*", count=FORGET_BATCH):
        batch.append(key)
        if len(batch) == FORGET_BATCH:
            deleted += _unlink(client, batch)
            batch = []
    return deleted + (_unlink(client, batch) if batch else 0)


def _unlink(client: redis.Redis | RedisCluster, keys: list[bytes]) -> int:
    # One UNLINK per key in one pipeline: the keys of a batch lie in many
    # slots, which a single multi-key UNLINK on a cluster refuses (CROSSSLOT).
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    return sum(pipe.execute())
