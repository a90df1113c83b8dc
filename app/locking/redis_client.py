"""This process's Redis, one server or a Redis Cluster: its scripts, and its failures told apart as unavailable
or a fault (docs/design.md, "When things break")."""

import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry

log = logging.getLogger(__name__)

UNAVAILABLE = "unavailable"
# One ERROR line a minute per reason says that a fault goes on without
# flooding the log at the delivery rate; /ready reports a fault this long
# after it was last seen (a fault may hit only some keys or only writes).
FAULT_INTERVAL = 60.0
# An error code as Redis sends it, first word of the error: NOPERM, OOM, ...
_CODE = re.compile(r"[A-Z][A-Z_]{1,31}")


class UnusableError(Exception):
    """Redis could not be used for this call; reason is UNAVAILABLE or the fault's."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def reason_of(exc: RedisError | RedisClusterException) -> str:
    """UNAVAILABLE when Redis did not answer; else the code Redis answered, or the client's exception class."""
    if isinstance(exc, RedisClusterException) and isinstance(exc.__cause__, RedisError | RedisClusterException):
        return reason_of(exc.__cause__)  # "cannot be connected": the last node's own error says why
    if isinstance(exc, RedisClusterException) and str(exc).endswith("must map to the same key slot"):
        return "CROSSSLOT"  # the cluster client's own check, before the server would answer the same
    auth = isinstance(exc, AuthenticationError | AuthorizationError)
    if isinstance(exc, ConnectionError | TimeoutError) and not auth:
        return UNAVAILABLE
    if isinstance(exc, ResponseError | AuthenticationError | AuthorizationError):
        code = exc.status_code or str(exc).split(" ", 1)[0]
        if _CODE.fullmatch(code):
            return code
    return type(exc).__name__


class RedisLink:
    """The client (a cluster's is made on first use), its registered scripts, and the faults seen."""

    def __init__(self, url: str, cluster: bool, timeout_s: float) -> None:
        self._url, self._cluster, self._timeout_s = url, cluster, timeout_s
        # A cluster client asks a node for the slot map as it is made: made
        # later, a cluster that is down at start only degrades the service.
        self._client: redis.Redis | RedisCluster | None = None if cluster else self._connect()
        self._made = threading.Lock()
        self._scripts: dict[str, Script] = {}
        self._faults: dict[str, list[Any]] = {}  # reason -> [monotonic time last seen, last logged, seen since logged]
        self._faults_lock = threading.Lock()

    def _connect(self) -> redis.Redis | RedisCluster:
        options = {"socket_timeout": self._timeout_s, "socket_connect_timeout": self._timeout_s}
        if self._cluster:
            # No retry of a failed call either: the client has already
            # refreshed its slot map, so the next delivery goes to the right node.
            return RedisCluster.from_url(self._url, retry=Retry(NoBackoff(), 0), **options)
        # redis-py retries three times with backoff by default: seconds of
        # stall per delivery when Redis is down. One try, then degrade.
        return redis.Redis.from_url(self._url, retry=Retry(NoBackoff(), 0), **options)

    def client(self) -> redis.Redis | RedisCluster:
        """The client, made now if it is a cluster's and not made yet (this may raise, as a call would)."""
        if self._client is None:
            with self._made:
                if self._client is None:
                    self._client = self._connect()
        return self._client

    def run(self, script: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run a Lua script (EVALSHA, loaded again after a restart); raise UnusableError when Redis cannot be used."""
        try:
            if script not in self._scripts:
                self._scripts[script] = self.client().register_script(script)
            registered = self._scripts[script]
            # EVALSHA straight through execute_command, cheaper than redis-py's
            # Script call (docs/performance.md). When Redis lacks the script
            # (restarted, flushed, a new primary), the Script call loads it
            # (SCRIPT LOAD, as the documented ACL allows; not EVAL) and runs it.
            try:
                return registered.registered_client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
            except NoScriptError:
                return registered(keys=keys, args=args)
        except (RedisError, RedisClusterException) as exc:
            raise UnusableError(self.failed(exc)) from None

    def failed(self, exc: RedisError | RedisClusterException) -> str:
        """Record a failed call; log a fault at most once per FAULT_INTERVAL per reason. Return the reason."""
        reason = reason_of(exc)
        if reason == UNAVAILABLE:
            return reason
        now = time.monotonic()
        with self._faults_lock:
            seen = self._faults.setdefault(reason, [now, None, 0])
            seen[0], seen[2] = now, seen[2] + 1
            if seen[1] is not None and now - seen[1] < FAULT_INTERVAL:
                return reason
            seen[1], count = now, seen[2]
            seen[2] = 0
        # Only the text of an error that Redis sent: it names no key or value
        # of ours (redis-py's own messages may quote the command's arguments).
        detail = f": {str(exc)[:200]}" if isinstance(exc, ResponseError) else ""
        log.error("redis fault %s (%s%s): deliveries go on without Redis, on PostgreSQL alone; "
                  "seen %d times since its last report (one every %d s at most)",
                  reason, type(exc).__name__, detail, count, FAULT_INTERVAL)
        return reason

    def recent_fault(self) -> str | None:
        """The reason of the fault seen last, if it was seen in the last FAULT_INTERVAL; else None."""
        now = time.monotonic()
        with self._faults_lock:
            recent = [(seen[0], reason) for reason, seen in self._faults.items() if now - seen[0] < FAULT_INTERVAL]
        return max(recent)[1] if recent else None
