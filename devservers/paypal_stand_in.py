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

- `GET /v1/reporting/transactions?start_date=&end_date=&fields=all&page_size=&page=` (Transaction Search,
  https://developer.paypal.com/docs/api/transaction-search/v1/), for `flask audit`: the transactions whose
  `transaction_info.transaction_initiation_date` is in [start_date, end_date], a range of at most 31 days (else
  400 `INVALID_REQUEST`), `page_size` up to 500, as `{"transaction_details", "account_number", "start_date",
  "end_date", "last_refreshed_datetime", "page", "total_items", "total_pages", "links"}`.

Injected faults, for the deadline and slot tests: `delay` seconds before
each answer; `drip` (seconds per byte: the answer is sent a byte at a time);
`hang` (the answer never comes until close); `fail_next(status, times)` for
401, 403, 404, 429 or 500 in PayPal's error shapes.
"""

import base64
import json
import secrets
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl

from .faulty_api import FaultyAPI

CLIENT_ID = "AZstandInClientId0123456789"
CLIENT_SECRET = "EKstandInSecret0123456789"
EVENTS_PATH = "/v1/notifications/webhooks-events/"
TOKEN_PATH = "/v1/oauth2/token"
SEARCH_PATH = "/v1/reporting/transactions"  # Transaction Search
TOKEN_SECONDS = 32400  # what PayPal's sandbox answers (nine hours)
ERRORS = {
    401: {"name": "AUTHENTICATION_FAILURE", "message": "Authentication failed due to invalid authentication "
                                                       "credentials or a missing Authorization header."},
    403: {"name": "NOT_AUTHORIZED", "message": "Authorization failed due to insufficient permissions."},
    404: {"name": "RESOURCE_NOT_FOUND", "message": "The specified resource does not exist."},
    429: {"name": "RATE_LIMIT_REACHED", "message": "Too many requests. Blocked due to rate limiting."},
    500: {"name": "INTERNAL_SERVER_ERROR", "message": "An internal server error occurred."},
}


class PayPalStandIn(FaultyAPI):
    """PayPal's token and event endpoints on 127.0.0.1: add events (dicts, as PayPal sends them), then ask."""

    def __init__(self, client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET) -> None:
        super().__init__(f"{client_id}:{client_secret}")
        self._events: dict[str, bytes] = {}
        self._tokens: set[str] = set()
        self._transactions: list[dict[str, Any]] = []  # Transaction Search's transaction_details

    def add(self, *events: dict[str, Any]) -> None:
        """Keep each event, by its id, as PayPal's API will return it."""
        with self._lock:
            for event in events:
                self._events[event["id"]] = json.dumps(event).encode()

    def add_transactions(self, *details: dict[str, Any]) -> None:
        """Transaction details (each with its transaction_info), listed by Transaction Search."""
        with self._lock:
            self._transactions.extend(details)

    def _forget(self) -> None:
        self._events.clear()
        self._transactions.clear()

    def revoke_tokens(self) -> None:
        """Forget every token issued, as PayPal does when an app's secret is rotated."""
        with self._lock:
            self._tokens.clear()

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
        if method == "GET" and handler.path.startswith(SEARCH_PATH + "?"):
            with self._lock:
                known = authorization.removeprefix("Bearer ") in self._tokens
            if not authorization.startswith("Bearer ") or not known:
                return 401, self._error(401)
            return self._search(dict(parse_qsl(handler.path.partition("?")[2])))
        return 404, self._error(404)

    def _search(self, params: dict[str, str]) -> tuple[int, bytes]:
        """A page of Transaction Search: at most 31 days, oldest first, page_size up to 500."""
        start, end = datetime.fromisoformat(params["start_date"]), datetime.fromisoformat(params["end_date"])
        if end - start > timedelta(days=31):
            return 400, json.dumps({"name": "INVALID_REQUEST", "message": "Request is not well-formed, syntactically "
                                    "incorrect, or violates schema.", "debug_id": secrets.token_hex(6),
                                    "details": [{"field": "start_date", "issue": "Date range is greater than 31 "
                                                 "days"}]}).encode()
        size, page = min(int(params.get("page_size", 100)), 500), int(params.get("page", 1))
        with self._lock:
            found = sorted((d for d in self._transactions
                            if start <= datetime.fromisoformat(d["transaction_info"]["transaction_initiation_date"])
                            <= end), key=lambda d: d["transaction_info"]["transaction_initiation_date"])
        pages = max(1, -(-len(found) // size))
        return 200, json.dumps({"transaction_details": found[(page - 1) * size:page * size],
                                "account_number": "XZXSPECPDZHZU", "start_date": params["start_date"],
                                "end_date": params["end_date"], "last_refreshed_datetime": params["end_date"],
                                "page": page, "total_items": len(found), "total_pages": pages,
                                "links": []}).encode()

    @staticmethod
    def _error(status: int) -> bytes:
        name, message = ERRORS.get(status, ERRORS[500]).values()
        debug_id = secrets.token_hex(6)
        return json.dumps({"name": name, "message": message, "debug_id": debug_id,
                           "information_link": "https://developer.paypal.com/api/rest/responses/"}).encode()
