"""What the providers' API stand-ins share: a loopback HTTP server whose answers a test can delay, drip byte by
byte, hold for ever, or replace with an error status, and which records each request."""

import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import takewhile
from typing import Self


class FaultyAPI:
    """A stand-in's server and faults; a subclass answers each request in _route."""

    def __init__(self, credentials: str) -> None:
        self.credentials = credentials  # <id>:<secret>, HTTP Basic
        self._faults: deque[int] = deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.requests: list[tuple[str, str]] = []  # (method, path) of each request, in order
        self.arrivals: list[float] = []  # when each arrived (time.monotonic()), in the same order
        # A rate limiter, when set: beyond this many requests in one sliding second, 429 in the provider's shape
        # (PayPal publishes no number, only the 429 RATE_LIMIT_REACHED: https://developer.paypal.com/api/rest/
        # reference/rate-limiting/); how many it refused.
        self.limit: int | None = None
        self.limited = 0
        self.delay = 0.0  # seconds before an answer
        self.drip = 0.0  # seconds between an answer's bytes
        self.hang = False  # no answer until reset()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_key(self) -> str:
        """The service's WEBHOOK_<NAME>_API_KEY for it: <id>:<secret>."""
        return self.credentials

    def reset(self) -> None:
        """No fault, no request seen; an answer held by `hang` or `drip` is let go."""
        with self._lock:
            self._forget()
            self._faults.clear()
            self.requests.clear()
            self.arrivals.clear()
            self.limited = 0
            self._closed.set()
            self._closed = threading.Event()
        self.delay, self.drip, self.hang, self.limit = 0.0, 0.0, False, None

    def _forget(self) -> None:
        """A subclass's records, cleared by reset() (under the lock)."""

    def fail_next(self, status: int, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([status] * times)

    @property
    def paths(self) -> list[str]:
        """The path of each request, in order."""
        with self._lock:
            return [path for _, path in self.requests]

    def count(self, path_prefix: str) -> int:
        with self._lock:
            return sum(path.startswith(path_prefix) for _, path in self.requests)

    def peak(self, path_prefix: str = "/") -> int:
        """The most requests to paths starting with path_prefix that arrived within any one second (the rate a
        provider's limiter counts over a sliding second)."""
        with self._lock:
            times = [at for at, (_, path) in zip(self.arrivals, self.requests, strict=True)
                     if path.startswith(path_prefix)]
        most, first = 0, 0
        for last, at in enumerate(times):  # arrivals are in order: a window slides over them
            while at - times[first] >= 1.0:
                first += 1
            most = max(most, last - first + 1)
        return most

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self, port: int = 0) -> Self:
        """Serve on 127.0.0.1:port (0: a free one)."""
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                stand_in._answer(self, "POST")

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                stand_in._answer(self, "GET")

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name=type(self).__name__, daemon=True).start()
        return self

    def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        form = handler.rfile.read(length) if length else b""
        with self._lock:
            now = time.monotonic()
            fault = self._faults.popleft() if self._faults else None
            if fault is None and self.limit is not None and \
                    sum(1 for _ in takewhile(lambda at: at > now - 1.0, reversed(self.arrivals))) >= self.limit:
                fault, self.limited = 429, self.limited + 1
            self.requests.append((method, handler.path))
            self.arrivals.append(now)
        closed = self._closed
        if self.hang:
            closed.wait()
            return
        time.sleep(self.delay)
        status, body = self._route(handler, method, form, fault)
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if self.drip:
            for byte in range(len(body)):
                handler.wfile.write(body[byte:byte + 1])
                handler.wfile.flush()
                if closed.wait(self.drip):
                    return
        else:
            handler.wfile.write(body)

    def _route(self, handler: BaseHTTPRequestHandler, method: str, form: bytes,
               fault: int | None) -> tuple[int, bytes]:
        raise NotImplementedError
