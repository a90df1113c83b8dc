"""A loopback stand-in for Stripe's List Events (`GET /v1/events`) and Retrieve an event (`GET /v1/events/{id}`),
for the reconcile and fetch tests and `make bench`.

It implements the documented contract and nothing more, so that the real
stripe-python talks to it over HTTP, unmocked:
https://docs.stripe.com/api/events/list, https://docs.stripe.com/api/events/retrieve and
https://docs.stripe.com/api/pagination.

- retrieve: the Event object by id, whatever its age; an unknown id is 404
  `resource_missing` ("No such event: 'evt_...'"), and so is an event of
  another account: a connected account's event (its top-level `account`,
  https://docs.stripe.com/connect/webhooks) is retrieved as that account, with
  `Stripe-Account: acct_...` (https://docs.stripe.com/connect/authentication),
  the platform's own without it;

- newest first ("sorted by creation date, with the most recent appearing
  first"); events created in the same second keep the order they were added
  in, newest first, so the order is total and cursors are exact;
- `limit` 1 to 100 (default 10); `starting_after` (older than the cursor) and
  `ending_before` (newer than it: the `limit` events just before it); an
  unknown cursor is 400 `resource_missing`;
- `created` as a Unix time or `created[gt|gte|lt|lte]`; `type` (one name, `*`
  as a wildcard) or `types` (up to 20 names), not both;
- `{"object": "list", "url": "/v1/events", "has_more": ..., "data": [...]}`;
- only the last 30 days are listed ("List events, going back up to 30 days");
- `Authorization: Bearer <key>` (stripe-python's way): any other key is 401;
- Connect (https://docs.stripe.com/connect/authentication, https://docs.stripe.com/connect/webhooks): List
  Events with `Stripe-Account: acct_...` lists that connected account's events alone, each carrying its
  `account` ("The connected account that originates the event": https://docs.stripe.com/api/events/object);
  without the header, the key's own account's (those with no `account`); an account `add_account` did not add,
  or `disconnect`ed, is 403 `account_invalid`, as Stripe answers a platform that cannot act as it;
- List all connected accounts (`GET /v1/accounts`: https://docs.stripe.com/api/accounts/list), newest first,
  paginated as every list (`limit`, `starting_after`, `ending_before`), each an Account object
  (https://docs.stripe.com/api/accounts/object: `id`, `object` "account", `created`, ...);
- retrieve a PaymentIntent, Charge, Refund, Dispute or Checkout Session (`GET /v1/payment_intents/{id}`,
  `/v1/charges/{id}`, `/v1/refunds/{id}`, `/v1/disputes/{id}`, `/v1/checkout/sessions/{id}`:
  https://docs.stripe.com/api/payment_intents/retrieve and its siblings,
  https://docs.stripe.com/api/checkout/sessions/retrieve) and a thin event (`GET /v2/core/events/{id}`: https://docs.stripe.com/api/v2/core/events/retrieve),
  each in its current state (`put` replaces it) and in one account's context: `Stripe-Context` (or the
  older `Stripe-Account`) names it, https://docs.stripe.com/context; none is the key's own account; an
  unknown id there is 404 `resource_missing` ("No such payment_intent: 'pi_...'");
- list them (`GET /v1/payment_intents`, `/v1/charges`, `/v1/refunds`, `/v1/disputes`, `/v1/checkout/sessions`:
  https://docs.stripe.com/api/payment_intents/list and its siblings), each in the context it was put in (as
  retrieving), newest first by `created` (objects created in the same second newest put first), paginated as every
  list (`limit` 1 to 100, `starting_after`, `ending_before`, `created` as a Unix time or `created[gt|gte|lt|lte]`),
  `{"object": "list", "url": "/v1/payment_intents", "has_more": ..., "data": [...]}`;
- the limiter counts each list as its own endpoint (`event_list`, `payment_intent_list`, ...), apart from
  retrieving one (`event`, `payment_intent`, ...), as Stripe counts each operation (https://docs.stripe.com/rate-limits);
- injected answers: `fail_next(429)` or `fail_next(500, times=3)`, Stripe's
  error shape; `delay` per answer and `on_request` let a test act mid-run;
- hostile answers, which Stripe's contract rules out, for reconcile's
  defences: `hostile` set to one of HOSTILE's modes, `add_as_created`
  for an event whose own `created` is not a Unix time, and `add_listed_under`
  for an event listed in an account other than the one it names.
"""

import bisect
import fnmatch
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .stripe_balance import BalanceTransactions

API_KEY = "rk_test_standInRestrictedKey0123456789"
HORIZON_SECONDS = 30 * 86400  # "going back up to 30 days"
MAX_LIMIT, DEFAULT_LIMIT, MAX_TYPES = 100, 10, 20
CREATED_OPERATORS = ("gt", "gte", "lt", "lte")
# A list answer Stripe would never give: `StripeStandIn.hostile`'s modes.
HOSTILE = {
    "empty_with_more": "every page empty, saying has_more: true",
    "ignore_cursor": "starting_after and ending_before ignored: the newest page again and again",
    "ignore_ending_before": "ending_before ignored: the newest page again and again",
    "cut_short": "a 200 whose body is the page's JSON less its last byte",
    "not_a_page": "a 200 whose JSON is an object with `data` not a list",
}
ERRORS = {
    429: ("invalid_request_error", "rate_limit", "Too many requests hit the API too quickly."),
    500: ("api_error", None, "An unknown error occurred."),
    503: ("api_error", None, "Service unavailable."),
}


# Stripe's published limits: per endpoint, and in all in live mode (https://docs.stripe.com/rate-limits).
ENDPOINT_LIMIT, GLOBAL_LIMIT = 25, 100


class BadRequestError(ValueError):
    """A parameter Stripe would refuse: 400 invalid_request_error naming it."""

    def __init__(self, param: str, message: str, code: str = "parameter_invalid") -> None:
        super().__init__(message)
        self.param, self.code = param, code


class StripeStandIn:
    """Stripe's event list on 127.0.0.1: add events (dicts or stripe-python objects), then list them."""

    def __init__(self, api_key: str = API_KEY, clock: Callable[[], float] = time.time) -> None:
        self.api_key, self.clock = api_key, clock
        self._events: list[dict[str, Any]] = []  # oldest first, as added (by created, then order of adding)
        self._sorted: list[tuple[int, int]] = []  # their keys, in the same order
        self._keys: dict[str, tuple[int, int]] = {}  # id -> (created, order added): its place in the list
        self._lock = threading.Lock()
        self._faults: deque[int] = deque()
        self.requests: list[dict[str, Any]] = []  # each list request's parameters, as parsed
        self.arrivals: list[float] = []  # when each request arrived (time.monotonic()), in the same order
        self.delay = 0.0  # seconds before each answer (Stripe answers in 100 to 500 ms across the internet)
        # Stripe's rate limiter, when on: 25 requests per endpoint and 100 in all per sliding second, beyond them
        # 429 rate_limit (https://docs.stripe.com/rate-limits); what it saw: each endpoint's peak over any second,
        # and how many it refused.
        self.limiter = False
        self.endpoint_limit, self.global_limit = ENDPOINT_LIMIT, GLOBAL_LIMIT
        self.peaks: dict[str, int] = {}
        self.peak_total = 0
        self.limited = 0
        self._window: deque[tuple[float, str]] = deque()
        self.on_request: Callable[[int], None] | None = None  # called with the request's number, before answering
        self.hostile: str | None = None  # one of HOSTILE's modes, for every list request
        self._server: ThreadingHTTPServer | None = None
        self._objects: dict[tuple[str | None, str, str], dict[str, Any]] = {}  # (context, object, id) -> it
        self._put_order: dict[tuple[str | None, str, str], int] = {}  # its first put's number: the list's tie-break
        self._listed_under: dict[str, str | None] = {}  # event id -> the account whose list it is in (None: the key's)
        self._accounts: list[dict[str, Any]] = []  # connected accounts, oldest first
        self._disconnected: set[str] = set()  # listed, but refused as a Stripe-Account
        self.balance = BalanceTransactions()  # GET /v1/balance_transactions: devservers/stripe_balance.py

    # -- the data ---------------------------------------------------------------

    def add(self, *events: Any) -> None:
        """Add Event objects (a dict, or a stripe-python StripeObject); each keeps its own `created`, and is listed
        in the account its `account` names (none: the key's own)."""
        for event in events:
            document = event.to_dict() if hasattr(event, "to_dict") else dict(event)
            self._insert(int(document["created"]), document.get("account"), document)

    def add_as_created(self, created: int, *events: Any) -> None:
        """Add events listed as created at `created` (Unix seconds), whatever their own `created` says."""
        for event in events:
            document = event.to_dict() if hasattr(event, "to_dict") else dict(event)
            self._insert(created, document.get("account"), document)

    def add_listed_under(self, account: str | None, *events: Any) -> None:
        """Add events listed in account's List Events (None: the key's own), whatever their own `account` says."""
        for event in events:
            document = event.to_dict() if hasattr(event, "to_dict") else dict(event)
            self._insert(int(document["created"]), account, document)

    def _insert(self, created: int, account: str | None, document: dict[str, Any]) -> None:
        with self._lock:
            key = (created, len(self._keys))
            self._keys[document["id"]] = key
            self._listed_under[document["id"]] = account
            index = bisect.bisect(self._sorted, key)
            self._sorted.insert(index, key)
            self._events.insert(index, document)

    def add_account(self, *account_ids: str) -> None:
        """Connect accounts to the platform (each an Account object in GET /v1/accounts, created in order)."""
        with self._lock:
            for account_id in account_ids:
                self._accounts.append({
                    "id": account_id, "object": "account", "business_profile": {"name": None, "url": None},
                    "business_type": None, "capabilities": {}, "charges_enabled": True, "country": "US",
                    "created": int(self.clock()) - 86400 + len(self._accounts), "default_currency": "usd",
                    "details_submitted": True, "email": None, "metadata": {}, "payouts_enabled": True,
                    "type": "express"})

    def disconnect(self, account_id: str) -> None:
        """Refuse account_id as a Stripe-Account from now on (403), while GET /v1/accounts still lists it."""
        with self._lock:
            self._disconnected.add(account_id)

    def reconnect(self, account_id: str) -> None:
        """Accept account_id as a Stripe-Account again."""
        with self._lock:
            self._disconnected.discard(account_id)

    def put(self, obj: Any, context: str | None = None) -> None:
        """Add an object (a PaymentIntent, Charge, Refund, Dispute, Checkout Session or thin event), or replace it
        by its current state, in an account's context (None: the key's own account)."""
        document = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
        with self._lock:
            key = (context, document["object"], document["id"])
            self._objects[key] = document
            self._put_order.setdefault(key, len(self._put_order))

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next `times` requests with status (429, 500, 503) in Stripe's error shape."""
        self._faults.extend([status] * times)

    def recover(self) -> None:
        """Answer every request from now on: the faults not yet answered are dropped."""
        self._faults.clear()

    # -- the list ---------------------------------------------------------------

    def list_events(self, params: Mapping[str, Any], account: str | None = None) -> dict[str, Any]:
        """The answer to GET /v1/events with params (parsed as stripe-python encodes them) in account's context (its
        Stripe-Account; None: the key's own account); raise BadRequestError."""
        limit = _limit(params.get("limit"))
        if "type" in params and "types" in params:
            raise BadRequestError("types", "You may pass either `type` or `types`, but not both.")
        wanted = _types(params)
        low, high = _created_range(params.get("created"))
        low = max(low, (math.ceil(self.clock() - HORIZON_SECONDS), -1))
        after, before = params.get("starting_after"), params.get("ending_before")
        with self._lock:
            if after is not None:
                high = min(high, _cursor(self._keys, after, "starting_after"))
            elif before is not None:
                low = max(low, (_cursor(self._keys, before, "ending_before")[0],
                                _cursor(self._keys, before, "ending_before")[1] + 1))
            start, end = bisect.bisect_left(self._sorted, low), bisect.bisect_left(self._sorted, high)
            # The page's events, and one more to tell has_more: from the cursor outwards.
            found = []
            indexes = range(start, end) if before is not None and after is None else range(end - 1, start - 1, -1)
            for index in indexes:
                event = self._events[index]
                if wanted(event["type"]) and self._listed_under[event["id"]] == account:
                    found.append(self._events[index])
                    if len(found) > limit:
                        break
        page, has_more = found[:limit], len(found) > limit
        if before is not None and after is None:
            page.reverse()  # the events just newer than the cursor, newest first
        return {"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}

    def list_balance_transactions(self, params: Mapping[str, Any], account: str | None = None) -> dict[str, Any]:
        """The answer to GET /v1/balance_transactions with params in account's context (devservers/stripe_balance.py);
        raise BadRequestError."""
        limit = _limit(params.get("limit"))
        try:
            return self.balance.list(params, account, limit, _created_range(params.get("created")))
        except KeyError as exc:
            param, cursor = exc.args
            raise BadRequestError(param, f"No such balance_transaction: '{cursor}'", "resource_missing") from None

    def list_payouts(self, params: Mapping[str, Any], account: str | None = None) -> dict[str, Any]:
        """The answer to GET /v1/payouts with params in account's context; raise BadRequestError."""
        try:
            return self.balance.list_payouts(params, account, _limit(params.get("limit")),
                                             _created_range(params.get("created")))
        except KeyError as exc:
            param, cursor = exc.args
            raise BadRequestError(param, f"No such payout: '{cursor}'", "resource_missing") from None

    def hostile_answer(self, params: Mapping[str, Any], account: str | None = None) -> dict[str, Any] | bytes:
        """The answer to GET /v1/events in the mode `hostile` names (HOSTILE)."""
        mode = self.hostile
        if mode == "empty_with_more":
            return {"object": "list", "url": "/v1/events", "has_more": True, "data": []}
        ignored = {"ignore_cursor": ("starting_after", "ending_before"), "ignore_ending_before": ("ending_before",)}
        page = self.list_events({name: value for name, value in params.items() if name not in ignored.get(mode, ())},
                                account)
        if mode == "cut_short":
            return json.dumps(page).encode()[:-1]
        if mode == "not_a_page":
            return {"object": "list", "url": "/v1/events", "has_more": False, "data": {"events": page["data"]}}
        return page

    def list_accounts(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to GET /v1/accounts with params: the connected accounts, newest first; raise BadRequestError."""
        limit = _limit(params.get("limit"))
        after, before = params.get("starting_after"), params.get("ending_before")
        with self._lock:
            newest_first = self._accounts[::-1]
        return _page(newest_first, limit, after, before, "account", "/v1/accounts")

    def list_objects(self, kind: str, params: Mapping[str, Any], context: str | None) -> dict[str, Any]:
        """The answer to listing kind's objects (GET /v1/payment_intents ...) with params in context: newest first;
        raise BadRequestError."""
        limit = _limit(params.get("limit"))
        low, high = _created_range(params.get("created"))
        with self._lock:
            keyed = sorted(((int(obj.get("created") or 0), self._put_order[key]), obj)
                           for key, obj in self._objects.items() if key[0] == context and key[1] == kind)
        newest_first = [obj for (created, _), obj in reversed(keyed) if low[0] <= created < high[0]]
        return _page(newest_first, limit, params.get("starting_after"), params.get("ending_before"), kind,
                     "/" + _LISTS[kind])

    def retrieve_event(self, event_id: str, account: str | None = None) -> tuple[int, dict[str, Any]]:
        """The answer to GET /v1/events/{id} as account (Stripe-Account; None: the platform's own): the Event, or 404
        resource_missing, for an event of another account too."""
        with self._lock:
            key = self._keys.get(event_id)
            found = self._events[bisect.bisect_left(self._sorted, key)] if key is not None else None
        if found is None or found.get("account") != account:
            return 404, _error("invalid_request_error", "resource_missing", f"No such event: '{event_id}'", "id")
        return 200, found

    # -- the server ---------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "StripeStandIn":
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="stripe-stand-in", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "StripeStandIn":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, path: str, query: str, authorization: str | None,
               context: str | None = None) -> tuple[int, dict[str, Any] | bytes]:
        """(status, JSON body, or bytes sent as they are) for one request (context: its Stripe-Context or
        Stripe-Account header)."""
        if authorization != f"Bearer {self.api_key}":
            shown = (authorization or "").removeprefix("Bearer ")[:8]
            return 401, _error("invalid_request_error", None, f"Invalid API Key provided: {shown}***")
        retrieved = _OBJECT_PATH.fullmatch(path)
        if retrieved:
            return self.retrieve_object(_OBJECTS[retrieved[1]], retrieved[2], context)
        listed = _LIST_PATH.fullmatch(path)
        if listed:
            kind = _OBJECTS[listed[1]]
            params = _decode(parse_qsl(query, keep_blank_values=True))
            fault = self._arrive({**params, "list": kind, "context": context}, f"{kind}_list")
            if fault is not None:
                return fault, _error(*ERRORS[fault])
            try:
                return 200, self.list_objects(kind, params, context)
            except BadRequestError as exc:
                return 400, _error("invalid_request_error", exc.code, str(exc), exc.param)
        retrieve = path.startswith("/v1/events/") and path.count("/") == 3 and not path.endswith("/")
        accounts = path.rstrip("/") == "/v1/accounts"
        balance = path.rstrip("/") == "/v1/balance_transactions"
        payouts = path.rstrip("/") == "/v1/payouts"
        if path.rstrip("/") != "/v1/events" and not retrieve and not accounts and not balance and not payouts:
            return 404, _error("invalid_request_error", None, f"Unrecognized request URL (GET: {path}).")
        params = _decode(parse_qsl(query, keep_blank_values=True))
        if retrieve:
            params = {"id": path.rsplit("/", 1)[1], "account": context}
        fault = self._arrive(params, "event" if retrieve else _LIST_ENDPOINTS[path.rstrip("/")])
        if fault is not None:
            return fault, _error(*ERRORS[fault])
        if retrieve:
            return self.retrieve_event(params["id"], context)
        if not accounts and self._refuses(context):
            return 403, _error("invalid_request_error", "account_invalid",
                               f"The provided key does not have access to account '{context}' (or that account "
                               "does not exist). Application access may have been revoked.")
        try:
            if accounts:
                return 200, self.list_accounts(params)
            if balance:
                return 200, self.list_balance_transactions(params, context)
            if payouts:
                return 200, self.list_payouts(params, context)
            return 200, (self.list_events(params, context) if self.hostile is None else
                         self.hostile_answer(params, context))
        except BadRequestError as exc:
            return 400, _error("invalid_request_error", exc.code, str(exc), exc.param)

    def _refuses(self, account: str | None) -> bool:
        """Whether List Events as account (its Stripe-Account) is refused: not connected, or disconnected."""
        with self._lock:
            return account is not None and (account in self._disconnected or
                                            account not in {known["id"] for known in self._accounts})

    def _arrive(self, request: dict[str, Any], endpoint: str | None = None) -> int | None:
        """Count request (its on_request hook, its delay) as endpoint's (the limiter's name of its operation; None:
        the object it retrieves) and return the fault injected for it, if any."""
        with self._lock:
            self.requests.append(request)
            self.arrivals.append(time.monotonic())
            number = len(self.requests)
            fault = self._faults.popleft() if self._faults else None
            if fault is None and self.limiter:
                fault = self._limit(endpoint or request.get("object", "event"))
        if self.on_request is not None:
            self.on_request(number)
        if self.delay:
            time.sleep(self.delay)
        return fault

    def _limit(self, endpoint: str) -> int | None:
        """429 when endpoint's or the account's requests over the last second reach Stripe's limit; else count it.
        Under self._lock."""
        now = time.monotonic()
        while self._window and self._window[0][0] <= now - 1.0:
            self._window.popleft()
        same = sum(1 for _, seen in self._window if seen == endpoint)
        if same >= self.endpoint_limit or len(self._window) >= self.global_limit:
            self.limited += 1
            return 429
        self._window.append((now, endpoint))
        self.peaks[endpoint] = max(self.peaks.get(endpoint, 0), same + 1)
        self.peak_total = max(self.peak_total, len(self._window))
        return None

    def retrieve_object(self, kind: str, object_id: str, context: str | None) -> tuple[int, dict[str, Any]]:
        """The answer to retrieving one object in context: it, or 404 resource_missing; counted as a request."""
        fault = self._arrive({"object": kind, "id": object_id, "context": context})
        with self._lock:
            found = self._objects.get((context, kind, object_id))
        if fault is not None:
            return fault, _error(*ERRORS[fault])
        if found is None:
            return 404, _error("invalid_request_error", "resource_missing", f"No such {kind}: '{object_id}'", "id")
        return 200, found


# Each retrievable object's path, and its `object` value.
_OBJECTS = {"v1/payment_intents": "payment_intent", "v1/charges": "charge", "v1/refunds": "refund",
            "v1/disputes": "dispute", "v1/checkout/sessions": "checkout.session", "v2/core/events": "v2.core.event"}
_OBJECT_PATH = re.compile(r"/(" + "|".join(_OBJECTS) + r")/([^/]+)")
# The lists of those objects (a thin event's is retrieved only).
_LISTS = {kind: path for path, kind in _OBJECTS.items() if not path.startswith("v2/")}
_LIST_PATH = re.compile(r"/(" + "|".join(_LISTS.values()) + r")/?")
_LIST_ENDPOINTS = {"/v1/events": "event_list", "/v1/accounts": "account_list",
                   "/v1/balance_transactions": "balance_transaction_list", "/v1/payouts": "payout_list"}


def _handler(stand_in: StripeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Stripe's API
        # Headers and body are two writes: without this, Nagle's algorithm holds the body
        # until the client's delayed ACK, 40 ms a request.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parts = urlsplit(self.path)
            status, document = stand_in.answer(parts.path, parts.query, self.headers.get("Authorization"),
                                               self.headers.get("Stripe-Context") or self.headers.get("Stripe-Account"))
            body = document if isinstance(document, bytes) else json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Request-Id", f"req_standin{len(stand_in.requests)}")
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a client killed mid-answer (a test's SIGKILL)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            pass  # quiet: the tests read stand_in.requests

    return Handler


def _error(kind: str, code: str | None, message: str, param: str | None = None) -> dict[str, Any]:
    error = {"type": kind, "message": message}
    error.update({name: value for name, value in (("code", code), ("param", param)) if value is not None})
    return {"error": error}


_KEY = re.compile(r"([^\[]+)((?:\[[^\]]*\])*)")


def _decode(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Stripe's form encoding, as stripe-python writes a GET's query: `created[gte]=1`, `types[0]=a`."""
    params: dict[str, Any] = {}
    for raw_key, value in pairs:
        match = _KEY.fullmatch(raw_key)
        name, subscripts = (match[1], re.findall(r"\[([^\]]*)\]", match[2])) if match else (raw_key, [])
        if not subscripts:
            params[name] = value
        elif name == "types":
            params.setdefault("types", []).append(value)
        else:
            params.setdefault(name, {})
            if isinstance(params[name], dict):
                params[name][subscripts[0]] = value
    return params


def _integer(param: str, raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        raise BadRequestError(param, f"Invalid integer: {raw}") from None


def _limit(raw: object) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    limit = _integer("limit", raw)
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequestError("limit", f"This value must be between 1 and {MAX_LIMIT} (it currently is {limit}).")
    return limit


def _types(params: Mapping[str, Any]) -> Callable[[str], bool]:
    if "type" in params:
        pattern = str(params["type"])
        return lambda event_type: fnmatch.fnmatchcase(event_type, pattern)
    if "types" in params:
        names = set(params["types"])
        if len(names) > MAX_TYPES:
            raise BadRequestError("types", f"You may pass at most {MAX_TYPES} types.")
        return lambda event_type: event_type in names
    return lambda event_type: True


def _created_range(raw: object) -> tuple[tuple[int, int], tuple[int, int]]:
    """`created` as [low, high) in the list's keys (created, order added)."""
    low, high = (-(2**62), -1), (2**62, -1)
    if raw is None:
        return low, high
    if not isinstance(raw, dict):
        exact = _integer("created", raw)
        return (exact, -1), (exact + 1, -1)
    unknown = set(raw) - set(CREATED_OPERATORS)
    if unknown:
        raise BadRequestError(f"created[{sorted(unknown)[0]}]", "Received unknown parameter.", "parameter_unknown")
    bounds = {op: _integer(f"created[{op}]", value) for op, value in raw.items()}
    starts = [(bounds["gt"] + 1, -1)] if "gt" in bounds else []
    starts += [(bounds["gte"], -1)] if "gte" in bounds else []
    ends = [(bounds["lt"], -1)] if "lt" in bounds else []
    ends += [(bounds["lte"] + 1, -1)] if "lte" in bounds else []
    return max([low, *starts]), min([high, *ends])


def _cursor(keys: Mapping[str, tuple[int, int]], event_id: str, param: str) -> tuple[int, int]:
    if event_id not in keys:
        raise BadRequestError(param, f"No such event: '{event_id}'", "resource_missing")
    return keys[event_id]


def _page(newest_first: list[dict[str, Any]], limit: int, after: str | None, before: str | None, what: str,
          url: str) -> dict[str, Any]:
    """A Stripe list object of newest_first's page after the cursor starting_after (or before ending_before);
    raise BadRequestError for a cursor not in the list (https://docs.stripe.com/api/pagination)."""
    ids = [obj["id"] for obj in newest_first]
    for param, cursor in (("starting_after", after), ("ending_before", before)):
        if cursor is not None and cursor not in ids:
            raise BadRequestError(param, f"No such {what}: '{cursor}'", "resource_missing")
    if before is not None:
        newer = newest_first[:ids.index(before)]
        page, has_more = newer[-limit:], len(newer) > limit
    else:
        rest = newest_first[ids.index(after) + 1:] if after is not None else newest_first
        page, has_more = rest[:limit], len(rest) > limit
    return {"object": "list", "url": url, "has_more": has_more, "data": page}
