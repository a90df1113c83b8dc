"""gunicorn's worker for this service: gthread, with a deadline on each request's arrival
(docs/deploying.md, "Slow senders"). It imports nothing of the app: gunicorn's master loads it by its path."""

import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

# gunicorn ships no type hints.
from gunicorn.http.errors import NoMoreData  # type: ignore[import-untyped]
from gunicorn.workers import gthread  # type: ignore[import-untyped]

SETTING = "REQUEST_READ_TIMEOUT_SECONDS"
# haproxy's `timeout http-request` in deploy/haproxy.cfg, for the same job.
# A provider sends a delivery (at most MAX_BODY_BYTES, 1 MiB) at once, from a
# data centre: 10 s is 100 kB/s for the largest body, and still frees a thread
# held by a stalled sender within a provider's own timeout (GitHub waits 10 s).
DEFAULT_SECONDS = 10.0

# What a sender whose headers never ended is told, before the connection closes.
# (Every answer carries an X-Request-ID, this one too, though no app saw it.)
_HEADERS_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                    b"X-Request-ID: %s\r\nConnection: close\r\n\r\n%s")
_HEADERS_TIMEOUT_BODY = b'{"error":"request_timeout","message":"the request did not arrive in time"}'


class RequestTimeout(NoMoreData, TimeoutError):
    """The request did not arrive within its deadline.

    To gunicorn it is a client that went away (NoMoreData: closed without a
    traceback); to the app reading the body (through Werkzeug, which turns it
    into ClientDisconnected) a TimeoutError, which errors.py answers 408.
    """

    def __str__(self) -> str:
        return "the request did not arrive in time"


def read_timeout(environ: Mapping[str, str]) -> float:
    """REQUEST_READ_TIMEOUT_SECONDS in seconds; ValueError, naming the setting, if it is not a positive number."""
    value = environ.get(SETTING, "").strip() or str(DEFAULT_SECONDS)
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{SETTING} must be a positive number of seconds, not {value!r}")
    return seconds


class DeadlineSocket:
    """A client socket whose reads end at a deadline, for one request at a time.

    The clock starts at the request's first read, so that the time a kept-alive
    connection waits for its next request (gunicorn's `keepalive`) is not counted.
    Everything else is the socket's own.
    """

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock, self._seconds = sock, seconds
        self.deadline: float | None = None
        self.armed = self.timed_out = self.answered = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def start_request(self) -> None:
        self.armed, self.deadline, self.timed_out, self.answered = True, None, False, False

    def end_request(self) -> None:
        self.armed = False

    def recv(self, size: int, *flags: int) -> bytes:
        if not self.armed:
            return self._sock.recv(size, *flags)
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self._seconds
        if now >= self.deadline:
            self.timed_out = True
            raise RequestTimeout()
        prior = self._sock.gettimeout()  # gunicorn's own, when it drains a body
        self._sock.settimeout(self.deadline - now if prior is None else min(prior, self.deadline - now))
        try:
            return self._sock.recv(size, *flags)
        except TimeoutError:
            if time.monotonic() < self.deadline:
                raise  # the caller's shorter timeout, not ours
            self.timed_out = True
            raise RequestTimeout() from None
        finally:
            self._sock.settimeout(prior)

    def sendall(self, data: bytes, *flags: int) -> None:
        self.answered = True
        return self._sock.sendall(data, *flags)

    def send(self, data: bytes, *flags: int) -> int:
        self.answered = True
        return self._sock.send(data, *flags)


class ThreadWorker(gthread.ThreadWorker):
    """gthread, whose connections read through a DeadlineSocket."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout(os.environ)  # checked by gunicorn.conf.py's on_starting

    def handle(self, conn: Any) -> bool:
        if self.cfg.is_ssl:
            # gunicorn wraps the socket itself in TLS: terminate TLS in a proxy in front instead.
            return super().handle(conn)
        if not isinstance(conn.sock, DeadlineSocket):
            conn.sock = DeadlineSocket(conn.sock, self.read_timeout)
        sock = conn.sock
        sock.start_request()
        try:
            keepalive = super().handle(conn)
        finally:
            sock.end_request()
        if not sock.timed_out:
            return keepalive
        if not sock.answered:
            # Cut inside its headers, before the app saw it (the app answers a body cut short itself).
            self.log.warning("request from %s not received within %g s: answered 408, connection closed",
                             conn.client[0] if conn.client else "?", self.read_timeout)
            try:
                sock.sendall(_HEADERS_TIMEOUT % (len(_HEADERS_TIMEOUT_BODY), uuid.uuid4().hex.encode(),
                                                 _HEADERS_TIMEOUT_BODY))
            except OSError:
                pass
        # Closed here, at once: gunicorn's graceful close waits up to 2 s for the
        # sender to close first, on the worker's main thread, and a sender that
        # stalls does not close (measured: 20 cut connections held the loop 40 s).
        # Everything it sent was read, so the close sends FIN, not a reset.
        sock.close()
        return False
