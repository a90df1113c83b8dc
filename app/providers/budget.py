"""One provider account's request budget, shared by every host through Redis: requests per second per endpoint and
in total, and a pause for the whole fleet after a 429 (docs/design.md, "The provider's pace")."""

import collections
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from ..core.errors import OverBudgetError, RateLimitedError
from ..locking.redis_client import RedisLink, UnusableError

T = TypeVar("T")

log = logging.getLogger(__name__)

# The window the rates are counted over: a sliding second, as Stripe counts (https://docs.stripe.com/rate-limits),
# and a margin: a request granted at Redis's time reaches the provider a little later (the connection, a busy
# host's scheduling), and two grants a second apart must not arrive within one. Measured on the bench's two loaded
# hosts (docs/performance.md), a bare second let 13 arrive in one second for a budget of 10.
WINDOW_MS = 1000 + 250
# Without Redis each process takes this share of the budget alone: two hosts of four workers each stay within it.
FALLBACK_SHARE = 8
# A 429 that names no wait (no Retry-After) pauses the fleet this long; one that names a longer wait, at most
# MAX_PAUSE_MS (a hostile or mistaken header cannot stop the drain for long).
DEFAULT_PAUSE_MS, MAX_PAUSE_MS = 1000, 60_000

# A sliding-window log per key (a sorted set of grant times, Redis's own clock): a request is granted when the
# account's total and the endpoint's counts over the last window are both under their rates, or while no 429 pause
# holds. KEYS: total log, endpoint log, pause. ARGV: total rate, endpoint rate, window (ms), a unique member.
# Returns 0 (granted) or the milliseconds until a grant may come.
TAKE = """
local paused = redis.call('pttl', KEYS[3])
if paused > 0 then return paused end
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local window = tonumber(ARGV[3])
local wait = 0
for i, rate in ipairs({tonumber(ARGV[1]), tonumber(ARGV[2])}) do
  redis.call('zremrangebyscore', KEYS[i], '-inf', now - window)
  if redis.call('zcard', KEYS[i]) >= rate then
    local oldest = redis.call('zrange', KEYS[i], 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + window - now + 1)
  end
end
if wait > 0 then return wait end
for i = 1, 2 do
  redis.call('zadd', KEYS[i], now, ARGV[4])
  redis.call('pexpire', KEYS[i], window)
end
return 0
"""
# A command's 429s (the audit's, through outbound; reconcile's stripe-python ones in app/providers/stripe/api.py),
# asked again after 1 s, 2 s, 4 s, ... up to 16 s, about a minute in all, then the run ends incomplete.
RATE_LIMIT_RETRIES, RATE_LIMIT_FIRST_DELAY, RATE_LIMIT_MAX_DELAY = 6, 1.0, 16.0

# KEYS: pause. ARGV: milliseconds. A longer pause already set is kept.
PAUSE = """
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then redis.call('set', KEYS[1], '1', 'PX', ARGV[1]) end
return 1
"""


class Budget:
    """The budget of one provider account (named by a hash of its API key, never the key), on the app's Redis."""

    def __init__(self, link: RedisLink | None, provider: str, api_key: str, rate: int, total: int) -> None:
        self.link, self.rate, self.total = link, rate, total
        account = hashlib.sha256(api_key.encode()).hexdigest()[:16]
        # One hash slot for every key of the account, so that one script may touch them on a cluster.
        self._prefix = f"budget:{{{provider}:{account}}}:"
        self._local = _LocalWindow(max(1, rate // FALLBACK_SHARE), max(1, total // FALLBACK_SHARE))
        self._shared = True  # whether the last grant came from Redis (said once when it changes)
        self._paused_until = 0.0  # this process's own copy of the fleet's pause, kept without Redis too

    def take(self, endpoint: str) -> None:
        """Spend one request of endpoint's, or OverBudgetError with the wait until one may be granted."""
        left = self._paused_until - time.monotonic()
        if left > 0:
            raise OverBudgetError("the provider answered 429: every host waits", left)
        wait_ms = self._take_shared(endpoint)
        if wait_ms is None:
            wait_ms = self._local.take(endpoint)
        if wait_ms > 0:
            raise OverBudgetError(f"over the provider's budget ({self.rate}/s per endpoint, {self.total}/s in all)",
                                  wait_ms / 1000)

    def _take_shared(self, endpoint: str) -> int | None:
        if self.link is None:
            return None
        keys = [self._prefix + "total", self._prefix + "endpoint:" + endpoint, self._prefix + "pause"]
        try:
            wait = int(self.link.run(TAKE, keys, [self.total, self.rate, WINDOW_MS, secrets.token_hex(8)]))
        except UnusableError as exc:
            self._say(False, exc.reason)
            return None
        self._say(True)
        return wait

    def _say(self, shared: bool, reason: str | None = None) -> None:
        if shared != self._shared:
            self._shared = shared
            if shared:
                log.warning("provider budget shared through Redis again")
            else:
                log.warning("provider budget: Redis cannot be used (%s): each process takes 1/%d of it until it can",
                            reason, FALLBACK_SHARE)

    @property
    def shared(self) -> bool:
        """Whether the budget is kept in Redis now (else each process keeps its share)."""
        return self._shared

    def slow_down(self, headers: Mapping[str, str]) -> None:
        """A 429: pause every host for the provider's Retry-After (else DEFAULT_PAUSE_MS), at most MAX_PAUSE_MS."""
        pause_ms = DEFAULT_PAUSE_MS
        raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if raw is not None and raw.strip().isdigit():
            pause_ms = max(DEFAULT_PAUSE_MS, min(MAX_PAUSE_MS, int(raw.strip()) * 1000))
        self._paused_until = max(self._paused_until, time.monotonic() + pause_ms / 1000)
        if self.link is not None:
            try:
                self.link.run(PAUSE, [self._prefix + "pause"], [pause_ms])
            except UnusableError:
                pass  # this process pauses all the same
        log.warning("the provider answered 429: every host pauses its calls for %d ms", pause_ms)

    def on(self, endpoint: str) -> "Spend":
        return Spend(self, endpoint)


class Spend:
    """One endpoint of a budget: what a call spends (outbound.Outbound.request takes it)."""

    def __init__(self, budget: Budget, endpoint: str) -> None:
        self.budget, self.endpoint = budget, endpoint

    def take(self) -> None:
        self.budget.take(self.endpoint)

    def slow_down(self, headers: Mapping[str, str]) -> None:
        self.budget.slow_down(headers)


class _LocalWindow:
    """This process's sliding-window share, while Redis cannot be used."""

    def __init__(self, rate: int, total: int) -> None:
        self.rate, self.total = rate, total
        self._lock = threading.Lock()
        self._grants: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def take(self, endpoint: str) -> int:
        """0 when granted, else the milliseconds until a grant may come."""
        now = time.monotonic()
        with self._lock:
            wait = 0.0
            for key, rate in (("", self.total), (endpoint, self.rate)):
                grants = self._grants[key]
                while grants and grants[0] <= now - WINDOW_MS / 1000:
                    grants.popleft()
                if len(grants) >= rate:
                    wait = max(wait, grants[0] + WINDOW_MS / 1000 - now)
            if wait > 0:
                return max(1, int(wait * 1000) + 1)
            self._grants[""].append(now)
            self._grants[endpoint].append(now)
            return 0


def patiently(call: Callable[[], T]) -> T:
    """call (one request that spends a budget, through outbound), for a command, which may wait: the budget's
    refusals waited out as long as it says, a 429 (which paused every host) asked again after a growing delay.
    RateLimitedError once the provider has answered 429 RATE_LIMIT_RETRIES times more."""
    delay, retries = RATE_LIMIT_FIRST_DELAY, 0
    while True:
        try:
            return call()
        except OverBudgetError as exc:
            time.sleep(exc.wait_seconds)
        except RateLimitedError:
            if retries == RATE_LIMIT_RETRIES:
                raise
            retries += 1
            time.sleep(delay)
            delay = min(delay * 2, RATE_LIMIT_MAX_DELAY)
