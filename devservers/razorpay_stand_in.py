"""A loopback stand-in for the three Razorpay API endpoints the service fetches from, for the tests.

It implements their documented contract and nothing more, so that Razorpay's
own client (razorpay-python: `Client(auth=..., base_url=...)`,
`client.payment.fetch`, `client.refund.fetch`, `client.dispute.fetch`) talks
to it over HTTP, unmocked, as the service's own fetch does:

- `GET /v1/payments/{id}` ("Fetch a Payment With ID",
  https://razorpay.com/docs/api/payments/fetch-with-id/), `GET /v1/refunds/{id}`
  ("Fetch Refund With ID", https://razorpay.com/docs/api/refunds/fetch-with-id)
  and `GET /v1/disputes/{id}` ("Fetch a Dispute With ID",
  https://razorpay.com/docs/api/disputes/fetch/): the entity as Razorpay keeps
  it (`id`, `entity`, `amount`, `currency`, `status`, ...).
- HTTP Basic with the key id and key secret ("Authentication",
  https://razorpay.com/docs/api/authentication/): any other is 401 "The API key
  provided is invalid".
- Errors in Razorpay's shape (`{"error": {"code", "description", "source",
  "step", "reason", "metadata", "field"}}`, https://razorpay.com/docs/errors/):
  an id it does not have is 400 `BAD_REQUEST_ERROR` "The id provided does not
  exist", another path 404 "The requested URL was not found on the server"
  (https://razorpay.com/docs/errors/common).

Injected faults, for the deadline and slot tests: `delay` seconds before
each answer; `drip` (seconds per byte: the answer is sent a byte at a time);
`hang` (the answer never comes until reset or close); `fail_next(status, times)`
for 401, 404, 429 or 500 in Razorpay's error shape.
"""

import base64
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY_ID = "rzp_test_standInKeyId01"
KEY_SECRET = "standInKeySecret0123456789"
PATHS = {"payments": "payment", "refunds": "refund", "disputes": "dispute"}  # /v1/<path>/{id} -> its entity
ERRORS = {
    400: ("BAD_REQUEST_ERROR", "The id provided does not exist", "business", "input_validation_failed", "id"),
    401: ("BAD_REQUEST_ERROR", "The API key provided is invalid", "NA", "NA", None),
    404: ("BAD_REQUEST_ERROR", "The requested URL was not found on the server", "NA", "NA", None),
    429: ("BAD_REQUEST_ERROR", "Too many requests", "NA", "NA", None),
    500: ("SERVER_ERROR", "We are facing some trouble completing your request at the moment. Please try again "
                          "shortly.", "internal", "NA", None),
}


class RazorpayStandIn:
    """Razorpay's payment, refund and dispute endpoints on 127.0.0.1: add entities (dicts, as Razorpay's API
    returns them), then ask."""

    def __init__(self, key_id: str = KEY_ID, key_secret: str = KEY_SECRET) -> None:
        self.credentials = f"{key_id}:{key_secret}"
        self._entities: dict[tuple[str, str], bytes] = {}  # (entity, id) -> its bytes
        self._faults: deque[int] = deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.requests: list[str] = []  # the path of each request, in order
        self.delay = 0.0
        self.drip = 0.0
        self.hang = False
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_key(self) -> str:
        """The service's WEBHOOK_<NAME>_API_KEY for it: <key id>:<key secret>."""
        return self.credentials

    def add(self, *entities: dict[str, Any]) -> None:
        """Keep each entity (or its newer state), by its kind and id, as Razorpay's API will return it."""
        with self._lock:
            for entity in entities:
                self._entities[entity["entity"], entity["id"]] = json.dumps(entity).encode()

    def reset(self) -> None:
        """No entity, no fault, no request seen, the stand-in's own key; an answer held by `hang` or `drip` is
        let go."""
        with self._lock:
            self._entities.clear()
            self._faults.clear()
            self.requests.clear()
            self._closed.set()
            self._closed = threading.Event()
        self.delay, self.drip, self.hang = 0.0, 0.0, False
        self.credentials = f"{KEY_ID}:{KEY_SECRET}"

    def fail_next(self, status: int, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([status] * times)

    def count(self, path_prefix: str = "/v1/") -> int:
        with self._lock:
            return sum(path.startswith(path_prefix) for path in self.requests)

    # -- the server --------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "RazorpayStandIn":
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                stand_in._answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="razorpay-stand-in", daemon=True).start()
        return self

    def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append(handler.path)
            fault = self._faults.popleft() if self._faults else None
        closed = self._closed
        if self.hang:
            closed.wait()
            return
        time.sleep(self.delay)
        status, body = self._route(handler, fault)
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

    def _route(self, handler: BaseHTTPRequestHandler, fault: int | None) -> tuple[int, bytes]:
        expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
        if handler.headers.get("Authorization") != expected:
            return 401, _error(401)
        if fault is not None:
            return fault, _error(fault)
        parts = handler.path.split("?")[0].split("/")  # "", "v1", "payments", id
        kind = PATHS.get(parts[2]) if len(parts) == 4 and parts[1] == "v1" else None
        if kind is None:
            return 404, _error(404)
        with self._lock:
            entity = self._entities.get((kind, parts[3]))
        return (200, entity) if entity is not None else (400, _error(400))


def _error(status: int) -> bytes:
    code, description, source, reason, field = ERRORS.get(status, ERRORS[500])
    return json.dumps({"error": {"code": code, "description": description, "source": source, "step": "NA",
                                 "reason": reason, "metadata": {}, "field": field}}).encode()
