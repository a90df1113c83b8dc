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

For `flask audit` (app/providers/razorpay/audit.py), through `client.settlement.report` and `client.payment.all`:

- `GET /v1/settlements/recon/combined?year=&month=&day=&count=&skip=` ("Fetch Settlement Recon Details",
  https://razorpay.com/docs/api/settlements/fetch-recon): the transactions settled that day (or month), each a
  recon item (`entity_id`, `type`, `debit`, `credit`, `amount`, `currency`, `fee`, `tax`, `settled`,
  `settlement_id`, `settled_at`, `created_at`, `payment_id`, `dispute_id`), `count` up to 1000, `skip`;
- `GET /v1/payments?from=&to=&count=&skip=` ("Fetch Multiple Payments",
  https://razorpay.com/docs/api/payments/fetch-all-payments): payments created in [from, to], newest first,
  `count` up to 100, as `{"entity": "collection", "count", "items"}`.

Injected faults, for the deadline and slot tests: `delay` seconds before
each answer; `drip` (seconds per byte: the answer is sent a byte at a time);
`hang` (the answer never comes until reset or close); `fail_next(status, times)`
for 401, 404, 429 or 500 in Razorpay's error shape.
"""

import base64
import json
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl

from .faulty_api import FaultyAPI

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


class RazorpayStandIn(FaultyAPI):
    """Razorpay's payment, refund and dispute endpoints on 127.0.0.1: add entities (dicts, as Razorpay's API
    returns them), then ask."""

    def __init__(self, key_id: str = KEY_ID, key_secret: str = KEY_SECRET) -> None:
        super().__init__(f"{key_id}:{key_secret}")
        self._entities: dict[tuple[str, str], bytes] = {}  # (entity, id) -> its bytes
        self._recon: list[dict[str, Any]] = []  # settled transactions, as the recon API lists them
        self._payments: list[dict[str, Any]] = []  # payments, as Fetch Multiple Payments lists them

    def add(self, *entities: dict[str, Any]) -> None:
        """Keep each entity (or its newer state), by its kind and id, as Razorpay's API will return it."""
        with self._lock:
            for entity in entities:
                self._entities[entity["entity"], entity["id"]] = json.dumps(entity).encode()

    def settle(self, *items: dict[str, Any]) -> None:
        """Recon items: transactions settled at their `settled_at`."""
        with self._lock:
            self._recon.extend(items)

    def capture(self, *payments: dict[str, Any]) -> None:
        """Payment entities, listed by Fetch Multiple Payments by their `created_at`."""
        with self._lock:
            self._payments.extend(payments)

    def reset(self) -> None:
        """FaultyAPI.reset, no entity, and the stand-in's own key."""
        super().reset()
        self.credentials = f"{KEY_ID}:{KEY_SECRET}"

    def _forget(self) -> None:
        self._entities.clear()
        self._recon.clear()
        self._payments.clear()

    def count(self, path_prefix: str = "/v1/") -> int:
        return super().count(path_prefix)

    def _route(self, handler: BaseHTTPRequestHandler, method: str, form: bytes,
               fault: int | None) -> tuple[int, bytes]:
        expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
        if handler.headers.get("Authorization") != expected:
            return 401, _error(401)
        if fault is not None:
            return fault, _error(fault)
        path, _, query = handler.path.partition("?")
        if path in ("/v1/settlements/recon/combined", "/v1/payments"):
            return 200, self._listed(path, {name: int(value) for name, value in parse_qsl(query)})
        parts = path.split("/")  # "", "v1", "payments", id
        kind = PATHS.get(parts[2]) if len(parts) == 4 and parts[1] == "v1" else None
        if kind is None:
            return 404, _error(404)
        with self._lock:
            entity = self._entities.get((kind, parts[3]))
        return (200, entity) if entity is not None else (400, _error(400))


    def _listed(self, path: str, params: dict[str, int]) -> bytes:
        """A page of the recon (items settled that day or month) or of the payments (created in [from, to])."""
        with self._lock:
            if path == "/v1/payments":
                items = sorted((p for p in self._payments if params.get("from", 0) <= p["created_at"]
                                <= params.get("to", 2**62)), key=lambda p: -p["created_at"])
                count = min(params.get("count", 10), 100)
            else:
                items = [item for item in self._recon if _day_of(item["settled_at"], params)]
                count = min(params.get("count", 1000), 1000)
        page = items[params.get("skip", 0):params.get("skip", 0) + count]
        return json.dumps({"entity": "collection", "count": len(page), "items": page}).encode()


def _day_of(moment: int, params: dict[str, int]) -> bool:
    day = datetime.fromtimestamp(moment, UTC)
    return (day.year, day.month) == (params.get("year"), params.get("month")) and \
        params.get("day", day.day) == day.day


def _error(status: int) -> bytes:
    code, description, source, reason, field = ERRORS.get(status, ERRORS[500])
    return json.dumps({"error": {"code": code, "description": description, "source": source, "step": "NA",
                                 "reason": reason, "metadata": {}, "field": field}}).encode()
