"""Calls to a provider's API: a total deadline per call, and a bounded number of calls at once per process
(docs/providers/README.md, "What is signed and what is fetched")."""

import http.client
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

from ..core.errors import (
    AnswerTooLargeError,
    BudgetSpentError,
    DeadlinePassedError,
    NoSlotError,
    OverBudgetError,
    ProviderRefusedError,
    ProviderUnavailableError,
    RateLimitedError,
)

# An answer past this is refused, whatever the provider: an event or an object is a few kilobytes.
MAX_ANSWER_BYTES = 1024 * 1024

# What is told of each call (app/receiver/metrics.py counts it): the provider, its result (the status, "timeout",
# "unreachable", "no_slot", "no_budget"), and the seconds it took.
Observer = Callable[[str, str, float], None]


class Reply(NamedTuple):
    status: int
    body: bytes
    headers: Mapping[str, str] = {}


class Spend(Protocol):
    """What a call spends of its provider account's shared budget (app/providers/budget.py)."""

    def take(self) -> None: ...  # OverBudgetError when none is left now

    def slow_down(self, headers: Mapping[str, str]) -> None: ...  # the provider answered 429


class Deadline:
    """One monotonic instant that several calls share (a token, then the event, within one delivery)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassedError(f"no answer within {self.seconds:g} s")
        return left


class Outbound:
    """The calls of one process: its slots, and each call's deadline. Thread-safe."""

    def __init__(self, slots: int, deadline_seconds: float, observe: Observer | None = None) -> None:
        self.slots = slots
        self.deadline_seconds = deadline_seconds
        self.observe = observe or (lambda provider, result, seconds: None)
        self._free = threading.BoundedSemaphore(slots)
        self._context: ssl.SSLContext | None = None  # the system's roots, loaded once (a few ms each time)

    def deadline(self) -> Deadline:
        return Deadline(self.deadline_seconds)

    @contextmanager
    def slot(self, provider: str) -> Iterator[None]:
        """Hold one of the process's slots, or ProviderUnavailableError at once when none is free."""
        if not self._free.acquire(blocking=False):
            self.observe(provider, "no_slot", 0.0)
            raise NoSlotError(f"all {self.slots} calls to providers are in flight")
        try:
            yield
        finally:
            self._free.release()

    def request(self, provider: str, method: str, url: str, deadline: Deadline, *,
                headers: Mapping[str, str] | None = None, body: bytes | None = None,
                context: ssl.SSLContext | None = None, max_bytes: int = MAX_ANSWER_BYTES,
                unauthorized_as: str | None = None, spend: Spend | None = None) -> Reply:
        """The status and body of one HTTP call made within deadline, by a caller holding a slot; no redirect is
        followed. ProviderUnavailableError when it cannot end in an answer of at most max_bytes by the deadline."""
        # spend, if any, is taken first (OverBudgetError: no call) and told of a 429. Any status is returned as it came,
        # and counted as it came but a 401, counted as unauthorized_as when given (a token about to be renewed: not
        # yet a refusal of our credentials).
        if spend is not None:
            try:
                spend.take()
            except OverBudgetError:
                self.observe(provider, "over_budget", 0.0)
                raise
        started = time.perf_counter()
        result = "unreachable"
        try:
            reply = self._call(method, url, deadline, headers or {}, body, context, max_bytes)
            result = unauthorized_as if reply.status == 401 and unauthorized_as else str(reply.status)
            if reply.status == 429 and spend is not None:
                spend.slow_down(reply.headers)
            return reply
        except ProviderUnavailableError as exc:
            result = "timeout" if isinstance(exc, DeadlinePassedError) else result
            raise
        finally:
            self.observe(provider, result, time.perf_counter() - started)

    def _call(self, method: str, url: str, deadline: Deadline, headers: Mapping[str, str], body: bytes | None,
              context: ssl.SSLContext | None, max_bytes: int) -> Reply:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            if context is None:
                context = self._context = self._context or ssl.create_default_context()
            connection = http.client.HTTPSConnection(host, port, timeout=deadline.left(), context=context)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=deadline.left())
        cut = threading.Event()
        timer = threading.Timer(deadline.left(), _cut, (connection, cut))
        timer.daemon = True
        timer.start()
        try:
            connection.connect()
            if cut.is_set():  # the deadline passed while the socket was not yet there to cut
                raise TimeoutError
            connection.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body,
                               headers=dict(headers))
            answer = connection.getresponse()
            data = answer.read(max_bytes + 1)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cut.is_set() or isinstance(exc, TimeoutError):
                raise DeadlinePassedError(f"no answer within {deadline.seconds:g} s") from None
            raise ProviderUnavailableError(f"unreachable: {type(exc).__name__}") from None
        finally:
            timer.cancel()
            connection.close()
        if cut.is_set():  # the body ended as the deadline passed: it may be cut short
            raise DeadlinePassedError(f"no answer within {deadline.seconds:g} s")
        if len(data) > max_bytes:
            raise AnswerTooLargeError(f"an answer larger than {max_bytes} bytes")
        return Reply(answer.status, data, dict(answer.getheaders()))


class Budget:
    """What calls made for requests not yet proven authentic may take of one host: at most at_once in flight and
    per_minute started in any 60 s, apart from the slots that authentic work takes. Thread-safe."""

    def __init__(self, at_once: int, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.at_once, self.per_minute, self.clock = at_once, per_minute, clock
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._started: dict[str, deque[float]] = {}  # by host: when each call of the last 60 s started

    @contextmanager
    def spend(self, host: str) -> Iterator[None]:
        """Count one call to host while it runs, or BudgetSpentError at once when its budget is spent."""
        now = self.clock()
        with self._lock:
            started = self._started.setdefault(host, deque())
            while started and started[0] <= now - 60:
                started.popleft()
            if self._in_flight.get(host, 0) >= self.at_once:
                raise BudgetSpentError(f"{self.at_once} calls to {host} in flight already")
            if len(started) >= self.per_minute:
                raise BudgetSpentError(f"{self.per_minute} calls to {host} started in the last minute")
            started.append(now)
            self._in_flight[host] = self._in_flight.get(host, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[host] -= 1


def record(reply: Reply, provider: str, what: str) -> bytes | None:
    """The body of a provider's answer for one record, or None when it has none (404); 401 and 403 raise
    ProviderRefusedError, any other status but 200 ProviderUnavailableError."""
    if reply.status == 404:
        return None
    if reply.status in (401, 403):
        raise ProviderRefusedError(f"{provider} refused our credentials for {what} (HTTP {reply.status}): "
                                   f"check the source's API key")
    if reply.status == 429:
        raise RateLimitedError(f"{provider} answered 429 for {what}")
    if reply.status != 200:
        raise ProviderUnavailableError(f"{provider} answered {reply.status} for {what}")
    return reply.body


def _cut(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The deadline passed: end every wait on the connection's socket now (a read returns, a write fails)."""
    cut.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed
