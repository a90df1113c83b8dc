"""gunicorn's worker for this service: gthread, whose connections get a thread only once their whole request (head
and body) has arrived, and must deliver each request within a deadline (docs/deploying.md, "Slow senders"). It
imports nothing of the app: gunicorn's master loads it by its path."""

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
from typing import Any, NamedTuple

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

# The app's MAX_BODY_BYTES default (app/settings/config.py): a body the main loop buffers at most, per connection.
BODY_SETTING, DEFAULT_BODY_BYTES = "MAX_BODY_BYTES", 1048576
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A chunk-size line longer than this is no sender's: gunicorn's parser, on a thread, refuses it.
_MAX_CHUNK_LINE = 1024

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
    """The request did not arrive within its deadline: to gunicorn a client that went away, to the app a
    TimeoutError (408)."""
    # gunicorn closes on NoMoreData without a traceback; Werkzeug, reading the body, turns it into ClientDisconnected,
    # a TimeoutError, which errors.py answers 408.

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


def body_limit(environ: Mapping[str, str]) -> int:
    """MAX_BODY_BYTES as the app reads it (the app itself refuses a value that is not a positive integer)."""
    value = environ.get(BODY_SETTING, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_BODY_BYTES


class Framing(NamedTuple):
    """How a request's body ends, read from its head: its Content-Length, or chunked; and whether the sender waits
    for a 100 Continue before sending it."""

    length: int | None
    chunked: bool
    expects_continue: bool


def framing(head: bytes, limit: int) -> Framing | None:
    """How the body after head ends; None when there is none to wait for: no body, one over limit (the app answers
    413 from its length alone), or framing gunicorn's parser refuses (it answers 400 at once)."""
    fields: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            fields.setdefault(name.strip().lower(), []).append(value.strip().lower())
    lengths, codings = fields.get(b"content-length", []), fields.get(b"transfer-encoding", [])
    expects = fields.get(b"expect") == [b"100-continue"] and head.split(b"\r\n", 1)[0].endswith(b"HTTP/1.1")
    if codings:
        chunked = not lengths and codings[-1].rsplit(b",", 1)[-1].strip() == b"chunked"
        return Framing(None, True, expects) if chunked else None
    if len(lengths) != 1 or not lengths[0].isdigit() or not 0 < int(lengths[0]) <= limit:
        return None
    return Framing(int(lengths[0]), False, expects)


def chunked_end(data: bytes, body_at: int, position: int, limit: int) -> int | None:
    """Where to go on scanning the chunked body that starts at body_at in data, from its chunk at position: the
    chunk not yet whole; None to scan no more (the body is whole, or over limit, or malformed: gunicorn's parser
    reads it, or refuses it, on a thread)."""
    while True:
        line_end = data.find(b"\r\n", position)
        if line_end < 0:
            return position if len(data) - position <= _MAX_CHUNK_LINE else None
        size = data[position:line_end].split(b";", 1)[0].strip()
        if not size or len(size) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size):
            return None
        if int(size, 16) == 0:  # the last chunk, then trailers up to an empty line
            whole = data.startswith(b"\r\n", line_end + 2) or data.find(_HEAD_END, line_end) >= 0
            return None if whole else position
        following = line_end + 2 + int(size, 16) + 2
        if following - body_at > limit or following > len(data):
            return None if following - body_at > limit else position
        position = following


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


def _new_request(conn: Any, received: bytearray) -> None:
    """conn about to read a request whose first bytes are received: nothing known yet of its body."""
    conn.head, conn.body_at, conn.chunk_at, conn.framing, conn.continued = received, None, None, None, False


def _head_limit(cfg: Any) -> int:
    """The longest head gunicorn's parser reads before it refuses one (gunicorn/http/message.py's arithmetic)."""
    fields = cfg.limit_request_fields if 0 < cfg.limit_request_fields <= message.MAX_HEADERS else message.MAX_HEADERS
    field_size = cfg.limit_request_field_size if cfg.limit_request_field_size > 0 else \
        message.DEFAULT_MAX_HEADERFIELD_SIZE
    line = min(cfg.limit_request_line, message.MAX_REQUEST_LINE) if cfg.limit_request_line > 0 else 1024 * 1024
    return line + 2 + fields * (field_size + 2) + 4


class ThreadWorker(gthread.ThreadWorker):
    """gthread, in which no thread waits for a request: the main loop reads its head and body without blocking, and a
    thread takes the connection once they have arrived (within REQUEST_READ_TIMEOUT_SECONDS)."""
    # The body up to MAX_BODY_BYTES, by its Content-Length or its chunks. The deadline runs from the connection's
    # opening (its first request) or from its first byte (the next ones on a kept-alive connection), its wait for a
    # free thread not counted.

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout(os.environ)  # checked by gunicorn.conf.py's on_starting
        self.body_limit = body_limit(os.environ)
        self.head_limit = _head_limit(self.cfg)
        self.reading: deque[Any] = deque()  # connections reading their heads, in the order of their deadlines

    def _own_heads(self) -> bool:
        # gunicorn wraps a TLS socket itself, and sniffs HTTP/2's preface itself: those it reads as it does.
        return not self.cfg.is_ssl and self.cfg.http2_cleartext in ("off", "upgrade")

    def enqueue_req(self, conn: Any) -> None:
        """A new connection's head is read by the main loop; a kept-alive one (readable, or holding pipelined
        bytes) goes to a thread, which takes what has arrived without waiting and hands back a head not whole."""
        if self._own_heads() and conn.parser is None and not getattr(conn, "head_read", False):
            _new_request(conn, bytearray())
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
        """What to do with conn, whose request's bytes (conn.head) from held on are new (None: wait for more)."""
        head = conn.head
        if conn.body_at is None:
            end = head.find(_HEAD_END, held)
            line_end = head.find(b"\r\n")
            if end < 0 and (_BARE_LF.search(head, held)
                            or (line_end if line_end >= 0 else len(head) - 2) > self.cfg.limit_request_line > 0):
                return self._hand_over  # one that gunicorn's parser refuses as it stands (a bare LF, a long line)
            if end < 0:
                return partial(self._refuse, status=431) if len(head) > self.head_limit else None
            conn.body_at = conn.chunk_at = end + 4
            conn.framing = framing(bytes(head[:end]), self.body_limit)
        body = conn.framing
        if body is None:
            return self._hand_over
        if body.chunked:
            conn.chunk_at = chunked_end(head, conn.body_at, conn.chunk_at, self.body_limit)
            arrived = conn.chunk_at is None
        else:
            arrived = len(head) - conn.body_at >= body.length
        if arrived:
            return self._hand_over
        if body.expects_continue and not conn.continued:  # the sender waits for it before sending its body
            conn.continued = True
            try:
                conn.sock.send(_CONTINUE, socket.MSG_DONTWAIT)  # into an empty send buffer
            except OSError:
                pass
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
            if conn.body_at is not None:
                # A body cut short: to the app, which reads what came, meets the deadline passed at once, and
                # answers 408 as a delivery of its own (logged and counted), on a thread for that moment only.
                self._hand_over(conn)
            elif conn.head:
                self.log.warning("request from %s not received within %g s: answered 408, connection closed",
                                 conn.client[0] if conn.client else "?", self.read_timeout)
                self._refuse(conn, status=408)
            else:
                self._close(conn)  # asked nothing: nothing to answer

    def _refuse(self, conn: Any, status: int) -> None:
        try:
            conn.sock.send(refusal(status, bytes(conn.head[:conn.body_at])), socket.MSG_DONTWAIT)  # an empty buffer
        except OSError:
            pass
        self._close(conn)

    def _close(self, conn: Any) -> None:
        self.nr_conns -= 1
        _new_request(conn, bytearray())
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
            _new_request(conn, bytearray(conn.parser.unreader.take_buffered()))
            conn.head_deadline = time.monotonic() + self.read_timeout
            if (self._examine(conn, 0) if conn.head else self._receive(conn)) != self._hand_over:
                return _IN_LOOP  # not whole: the main loop reads on (or refuses, or closes)
            conn.time_left = self.read_timeout
        received, head = bytes(conn.head), bytes(conn.head[:conn.body_at])
        _new_request(conn, bytearray())
        conn.init()  # the parser, on the DeadlineSocket, if this is the connection's first request
        conn.parser.unreader.unread(received)
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
