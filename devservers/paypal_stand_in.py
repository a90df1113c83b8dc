"""A loopback stand-in for the two PayPal REST endpoints the service calls, for the tests and `make bench`.

It implements their documented contract and nothing more, so that PayPal's
own SDK (paypalrestsdk: `Api(endpoint=...)`, `WebhookEvent.find`) talks to it
over HTTP, unmocked, as the service's own client does:

- `POST /v1/oauth2/token` ("Get an access token",
  https://developer.paypal.com/api/rest/authentication/): HTTP Basic with the
  REST app's client id and secret, body `grant_type=client_credentials`;
  answers `{"scope", "access_token", "token_type": "Bearer", "app_id",
  "expires_in": 32400, "nonce"}`; other credentials are 401
  `{"error": "invalid_client", "error_description": "Client Authentication failed"}`.
- `GET /v1/notifications/webhooks-events/{event_id}` ("Show event
  notification details", Webhooks Management v1,
  https://developer.paypal.com/api/webhooks/v1/): `Authorization: Bearer`
  a token it issued (else 401 `AUTHENTICATION_FAILURE`); the event as PayPal
  keeps it (id, create_time, resource_type, event_type, summary, resource,
  links), or 404 `RESOURCE_NOT_FOUND` (PayPal's error shape: name, message,
  debug_id, information_link, https://developer.paypal.com/api/rest/responses/).

Injected faults, for the deadline and slot tests: `delay` seconds before
each answer; `drip` (seconds per byte: the answer is sent a byte at a time);
`hang` (the answer never comes until close); `fail_next(status, times)` for
401, 403, 404, 429 or 500 in PayPal's error shapes.
"""

import base64
import json
import secrets
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CLIENT_ID = "AZstandInClientId0123456789"
CLIENT_SECRET = "EKstandInSecret0123456789"
EVENTS_PATH = "/v1/notifications/webhooks-events/"
TOKEN_PATH = "/v1/oauth2/token"
TOKEN_SECONDS = 32400  # what PayPal's sandbox answers (nine hours)
ERRORS = {
    401: {"name": "AUTHENTICATION_FAILURE", "message": "Authentication failed due to invalid authentication "
                                                       "credentials or a missing Authorization header."},
    403: {"name": "NOT_AUTHORIZED", "message": "Authorization failed due to insufficient permissions."},
    404: {"name": "RESOURCE_NOT_FOUND", "message": "The specified resource does not exist."},
    429: {"name": "RATE_LIMIT_REACHED", "message": "Too many requests. Blocked due to rate limiting."},
    500: {"name": "INTERNAL_SERVER_ERROR", "message": "An internal server error occurred."},
}


class PayPalStandIn:
    """PayPal's token and event endpoints on 127.0.0.1: add events (dicts, as PayPal sends them), then ask."""

    def __init__(self, client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET) -> None:
        self.credentials = f"{client_id}:{client_secret}"
        self._events: dict[str, bytes] = {}
        self._tokens: set[str] = set()
        self._faults: deque[int] = deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.requests: list[tuple[str, str]] = []  # (method, path) of each request, in order
        self.delay = 0.0
        self.drip = 0.0
        self.hang = False
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_key(self) -> str:
        """The service's WEBHOOK_<NAME>_API_KEY for it: <client id>:<secret>."""
        return self.credentials

    def add(self, *events: dict[str, Any]) -> None:
        """Keep each event, by its id, as PayPal's API will return it."""
        with self._lock:
            for event in events:
                self._events[event["id"]] = json.dumps(event).encode()

    def reset(self) -> None:
        """No event, no fault, no request seen; an answer held by `hang` or `drip` is let go."""
        with self._lock:
            self._events.clear()
            self._faults.clear()
            self.requests.clear()
            self._closed.set()
            self._closed = threading.Event()
        self.delay, self.drip, self.hang = 0.0, 0.0, False

    def fail_next(self, status: int, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([status] * times)

    def revoke_tokens(self) -> None:
        """Forget every token issued, as PayPal does when an app's secret is rotated."""
        with self._lock:
            self._tokens.clear()

    def count(self, path_prefix: str) -> int:
        with self._lock:
            return sum(path.startswith(path_prefix) for _, path in self.requests)

    # -- the server --------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self, port: int = 0) -> "PayPalStandIn":
        """Serve on 127.0.0.1:port (0: a free one)."""
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                stand_in._answer(self, "POST")

            def do_GET(self) -> None:
                stand_in._answer(self, "GET")

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
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
            self.requests.append((method, handler.path))
            fault = self._faults.popleft() if self._faults else None
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
        if fault is not None:
            return fault, self._error(fault)
        authorization = handler.headers.get("Authorization", "")
        if method == "POST" and handler.path == TOKEN_PATH:
            expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
            if authorization != expected or b"grant_type=client_credentials" not in form:
                return 401, json.dumps({"error": "invalid_client",
                                        "error_description": "Client Authentication failed"}).encode()
            token = "A21AA" + secrets.token_urlsafe(24)
            with self._lock:
                self._tokens.add(token)
            return 200, json.dumps({"scope": "https://uri.paypal.com/services/webhooks", "access_token": token,
                                    "token_type": "Bearer", "app_id": "APP-80W284485P519543T",
                                    "expires_in": TOKEN_SECONDS, "nonce": secrets.token_hex(8)}).encode()
        if method == "GET" and handler.path.startswith(EVENTS_PATH):
            with self._lock:
                known = authorization.removeprefix("Bearer ") in self._tokens
                event = self._events.get(handler.path.removeprefix(EVENTS_PATH))
            if not authorization.startswith("Bearer ") or not known:
                return 401, self._error(401)
            return (200, event) if event is not None else (404, self._error(404))
        return 404, self._error(404)

    @staticmethod
    def _error(status: int) -> bytes:
        name, message = ERRORS.get(status, ERRORS[500]).values()
        debug_id = secrets.token_hex(6)
        return json.dumps({"name": name, "message": message, "debug_id": debug_id,
                           "information_link": "https://developer.paypal.com/api/rest/responses/"}).encode()
