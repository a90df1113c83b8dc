"""gunicorn's worker for this service: gthread, whose connections get a thread only once their request head has
arrived, and must deliver each request within a deadline (docs/deploying.md, "Slow senders"). It imports nothing
of the app: gunicorn's master loads it by its path."""

import json
import os
import re
import selectors
import socket
import time
import uuid
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Any

# gunicorn ships no type hints.
from gunicorn import util  # type: ignore[import-untyped]
from gunicorn.http import message  # type: ignore[import-untyped]
from gunicorn.http.errors import NoMoreData  # type: ignore[import-untyped]
from gunicorn.workers import gthread  # type: ignore[import-untyped]

SETTING = "REQUEST_READ_TIMEOUT_SECONDS"
# haproxy's `timeout http-request` in deploy/haproxy.cfg, for the same job.
# A provider sends a delivery (at most MAX_BODY_BYTES, 1 MiB) at once, from a
# data centre: 10 s is 100 kB/s for the largest body, and still frees a thread
# held by a stalled sender within a provider's own timeout (GitHub waits 10 s).
DEFAULT_SECONDS = 10.0

# The end of a request head; a line ending in a bare LF, which gunicorn's parser refuses without reading further.
_HEAD_END = b"\r\n\r\n"
_BARE_LF = re.compile(rb"(?<!\r)\n")
# app/receiver/logs.py's rule for a request id the sender chose, found in a head gunicorn could not parse.
_REQUEST_ID = re.compile(rb"\r\nX-Request-ID:[ \t]*([A-Za-z0-9._:-]{1,128})[ \t]*\r\n", re.IGNORECASE)
_READ_SIZE = 65536
# What a thread returns for a kept-alive connection whose next head has not arrived whole.
_IN_LOOP = object()

# gunicorn's own refusals (its handle_error), as the app's errors.py shapes an answer: status -> (error, message).
_REFUSALS = {
    400: ("bad_request", "malformed request"),
    403: ("forbidden", "request forbidden"),
    408: ("request_timeout", "the request did not arrive in time"),
    414: ("uri_too_long", "request line too long"),
    417: ("expectation_failed", "unsupported Expect header"),
    431: ("header_fields_too_large", "request header fields too large"),
    500: ("internal", None),
    501: ("not_implemented", "unsupported transfer coding"),
}
_REASONS = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 414: "URI Too Long",
            417: "Expectation Failed", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented"}


def refusal(status: int, head: bytes = b"") -> bytes:
    """A whole HTTP answer refusing a request: JSON, with the head's X-Request-ID if it is safe, else a new one."""
    error, text = _REFUSALS.get(status, ("http_error", "request refused"))
    body = json.dumps({"error": error, **({"message": text} if text else {})}, separators=(",", ":")).encode()
    found = _REQUEST_ID.search(head)
    request_id = found.group(1) if found else uuid.uuid4().hex.encode()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-ID: %s\r\n"
            b"Connection: close\r\n\r\n%s") % (status, _REASONS.get(status, "Error").encode(), len(body),
                                              request_id, body)


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
    """A client socket whose reads end at a deadline, for one request at a time; everything else is the socket's own."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = 0.0
        self.head = b""  # the request's head as read by the main loop, for a refusal's X-Request-ID
        self.armed = self.timed_out = self.answered = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def start_request(self, deadline: float, head: bytes) -> None:
        self.armed, self.deadline, self.head, self.timed_out, self.answered = True, deadline, head, False, False

    def end_request(self) -> None:
        self.armed = False
        self.head = b""

    def recv(self, size: int, *flags: int) -> bytes:
        if not self.armed:
            return self._sock.recv(size, *flags)
        now = time.monotonic()
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


class _Captured:
    """Stands for the client socket while gunicorn's handle_error writes its HTML answer, keeping only its status."""

    status = 500

    def gettimeout(self) -> float:
        return 0.0

    def sendall(self, data: bytes) -> None:
        self.status = int(data.split(b" ", 2)[1])


def _head_limit(cfg: Any) -> int:
    """The longest head gunicorn's parser reads before it refuses one (gunicorn/http/message.py's arithmetic)."""
    fields = cfg.limit_request_fields if 0 < cfg.limit_request_fields <= message.MAX_HEADERS else message.MAX_HEADERS
    field_size = cfg.limit_request_field_size if cfg.limit_request_field_size > 0 else \
        message.DEFAULT_MAX_HEADERFIELD_SIZE
    line = min(cfg.limit_request_line, message.MAX_REQUEST_LINE) if cfg.limit_request_line > 0 else 1024 * 1024
    return line + 2 + fields * (field_size + 2) + 4


class ThreadWorker(gthread.ThreadWorker):
    """gthread, in which no thread waits for a request's head: the main loop reads it without blocking, and a
    thread takes a connection once its head has arrived. The whole request must arrive within
    REQUEST_READ_TIMEOUT_SECONDS of the connection's opening (its first request) or of its first byte (the
    next ones on a kept-alive connection), its wait for a free thread not counted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout(os.environ)  # checked by gunicorn.conf.py's on_starting
        self.head_limit = _head_limit(self.cfg)
        self.reading: deque[Any] = deque()  # connections reading their heads, in the order of their deadlines

    def _own_heads(self) -> bool:
        # gunicorn wraps a TLS socket itself, and sniffs HTTP/2's preface itself: those it reads as it does.
        return not self.cfg.is_ssl and self.cfg.http2_cleartext in ("off", "upgrade")

    def enqueue_req(self, conn: Any) -> None:
        """A new connection's head is read by the main loop; a kept-alive one (readable, or holding pipelined
        bytes) goes to a thread, which takes what has arrived without waiting and hands back a head not whole."""
        if self._own_heads() and conn.parser is None and not getattr(conn, "head_read", False):
            conn.head = bytearray()
            conn.head_deadline = time.monotonic() + self.read_timeout
            self._read_in_loop(conn)
        else:
            super().enqueue_req(conn)

    def _read_in_loop(self, conn: Any) -> None:
        verdict = self._examine(conn, 0) if conn.head else self._receive(conn)
        if verdict is None:
            self.reading.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_readable, conn))
        else:
            verdict(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        if not fs.cancelled() and fs.exception() is None and fs.result() is _IN_LOOP:
            self._read_in_loop(conn)
        else:
            super().finish_request(conn, fs)

    def _on_head_readable(self, conn: Any, _sock: Any) -> None:
        verdict = self._receive(conn)
        if verdict is not None:
            self.poller.unregister(conn.sock)
            self.reading.remove(conn)
            verdict(conn)

    def _receive(self, conn: Any) -> Any:
        """Read what has arrived of conn's head; what to do with conn next (None: wait for more)."""
        try:
            data = conn.sock.recv(_READ_SIZE, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:  # the sender went away
            return self._close
        held = max(0, len(conn.head) - 3)
        conn.head += data
        return self._examine(conn, held)

    def _examine(self, conn: Any, held: int) -> Any:
        """What to do with conn, whose head's bytes from held on are new (None: wait for more)."""
        head = conn.head
        line_end = head.find(b"\r\n")
        if (head.find(_HEAD_END, held) >= 0 or _BARE_LF.search(head, held)
                or (line_end if line_end >= 0 else len(head) - 2) > self.cfg.limit_request_line > 0):
            # Whole, or one that gunicorn's parser refuses as it stands (a bare LF, a request line too long).
            return self._hand_over
        if len(head) > self.head_limit:
            return partial(self._refuse, status=431)
        return None

    def _hand_over(self, conn: Any) -> None:
        conn.head_read = conn.data_ready = True
        conn.time_left = conn.head_deadline - time.monotonic()  # its wait for a free thread is not counted
        super().enqueue_req(conn)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        if not self.alive:  # a stopping worker waits for a head as long as for a kept-alive connection's request
            for conn in self.reading:
                conn.head_deadline = min(conn.head_deadline, now + gthread.STOP_KEEPALIVE_LINGER)
        while self.reading and self.reading[0].head_deadline <= now:
            conn = self.reading.popleft()
            self.poller.unregister(conn.sock)
            if conn.head:
                self.log.warning("request from %s not received within %g s: answered 408, connection closed",
                                 conn.client[0] if conn.client else "?", self.read_timeout)
                self._refuse(conn, status=408)
            else:
                self._close(conn)  # asked nothing: nothing to answer

    def _refuse(self, conn: Any, status: int) -> None:
        try:
            conn.sock.send(refusal(status, bytes(conn.head)), socket.MSG_DONTWAIT)  # into an empty send buffer
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: Any) -> None:
        self.nr_conns -= 1
        conn.head = bytearray()
        util.close(conn.sock)

    def handle(self, conn: Any) -> Any:  # bool, or _IN_LOOP
        if not self._own_heads():
            return super().handle(conn)
        if not isinstance(conn.sock, DeadlineSocket):
            conn.sock = DeadlineSocket(conn.sock)
        sock = conn.sock
        if conn.head_read:  # read by the main loop
            conn.head_read = False
        else:  # a kept-alive connection: what has arrived, pipelined bytes first
            conn.head = bytearray(conn.parser.unreader.take_buffered())
            conn.head_deadline = time.monotonic() + self.read_timeout
            if (self._examine(conn, 0) if conn.head else self._receive(conn)) != self._hand_over:
                return _IN_LOOP  # not whole: the main loop reads on (or refuses, or closes)
            conn.time_left = self.read_timeout
        head, conn.head = bytes(conn.head), bytearray()
        conn.init()  # the parser, on the DeadlineSocket, if this is the connection's first request
        conn.parser.unreader.unread(head)
        sock.start_request(time.monotonic() + conn.time_left, head)
        try:
            keepalive = super().handle(conn)
        finally:
            sock.end_request()
        if not sock.timed_out:
            return keepalive
        if not sock.answered:
            # Cut before the app saw it (the app answers a body cut short itself).
            self.log.warning("request from %s not received within %g s: answered 408, connection closed",
                             conn.client[0] if conn.client else "?", self.read_timeout)
            try:
                sock.sendall(refusal(408, head))
            except OSError:
                pass
        # Closed here, at once: gunicorn's graceful close waits up to 2 s for the
        # sender to close first, on the worker's main thread, and a sender that
        # stalls does not close (measured: 20 cut connections held the loop 40 s).
        # Everything it sent was read, so the close sends FIN, not a reset.
        sock.close()
        return False

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's refusal (its status, log line and access line), answered in JSON with an X-Request-ID."""
        captured = _Captured()
        super().handle_error(req, captured, addr, exc)
        head = client.head if isinstance(client, DeadlineSocket) else b""
        try:
            util.write_nonblock(client, refusal(captured.status, head))
        except Exception:  # noqa: BLE001 - gunicorn's own handle_error ignores a failed write too
            self.log.debug("Failed to send error message.")
