"""Stripe's API, one client for every caller: the service retrieves an event or a thin event's object and reads a
backlog's pages; `flask reconcile` and `flask audit` list events, accounts and balance transactions through
stripe-python (docs/providers/stripe.md, "Reconcile and audit")."""

import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ...core.errors import OverBudgetError, ProviderError, ProviderRefusedError, ProviderUnavailableError
from ...core.records import ListedEvent
from ...core.vocabulary import Event, excerpt, is_id
from ..outbound import MAX_ANSWER_BYTES, Outbound, Reply, record
from .accounts import account_of, is_account
from .scheme import NAME, SCHEME
from .thin import THIN_FETCH_VERSION, THIN_OBJECTS, Related

if TYPE_CHECKING:
    from ..budget import Budget, Spend

API_BASE = "https://api.stripe.com"  # STRIPE_API_BASE's default
# The lists the service reads a backlog from (pages.py): List Events (https://docs.stripe.com/api/events/list) and
# each thin event's object type's list (https://docs.stripe.com/api/payment_intents/list, /api/charges/list,
# /api/refunds/list, /api/disputes/list, /api/checkout/sessions/list), 100 a page at most, newest first,
# `created[gte|lte]` and `starting_after` in each.
LISTS = {"event": "/v1/events", **{kind: path.rstrip("/") for kind, path in THIN_OBJECTS.items()}}
# An answer's bound for a page: 100 records, each an event or object of some kilobytes (one answer's bound is
# outbound.MAX_ANSWER_BYTES); a larger page is refused as unavailable, and its records are read one by one.
MAX_PAGE_BYTES = 8 * 1024 * 1024

HORIZON_DAYS = 30  # "List events, going back up to 30 days"
PAGE_LIMIT = 100  # the most a command's list gives per page
# stripe-python's retries of connection errors and 5xx (0.5 s, 1 s, 2 s, ... up to 5 s between them).
NETWORK_RETRIES = 5
# A 429, retried here: 1 s, 2 s, 4 s, ... up to 16 s, about a minute in all, then the run fails.
RATE_LIMIT_RETRIES, RATE_LIMIT_FIRST_DELAY, RATE_LIMIT_MAX_DELAY = 6, 1.0, 16.0
# A key in a message Stripe wrote (it shows a key's first characters): never repeated.
_KEY = re.compile(r"\b(sk|rk|pk)_(live|test)_\S*")
# Stripe counts each named operation as an endpoint: List Events is one (https://docs.stripe.com/rate-limits).
LIST_ENDPOINT = "list"


class StripeAPI:
    """Stripe's API at api_base with api_key (never in a repr, a log line or an answer), spending the account's
    budget: the service's calls go through outbound, a command's through stripe-python."""

    name = NAME
    endpoint = LIST_ENDPOINT  # what a command's requests spend of the account's budget

    def __init__(self, api_key: str, api_base: str, key_setting: str = "", budget: "Budget | None" = None,
                 outbound: Outbound | None = None) -> None:
        self.base = api_base.rstrip("/")  # the one address rule: base, then the documented path ("/v1/events")
        self._api_key = api_key
        self._key_setting = key_setting  # named in a refusal, never the key itself
        self.budget = budget  # the account's, shared by every host and command (budget.py); None: unmetered
        self.outbound = outbound  # the service's calls; None: a command's client, which lists through stripe-python
        self._client: Any = None  # stripe-python's, made by a command's first request
        self._context: dict[str, str] = {}  # a command's connected account: {"stripe_account": "acct_..."}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"

    # -- the service's calls: one request each, in a slot, within the call's deadline ----------------------------

    def event(self, event: Event) -> bytes | None:
        """The event's bytes as Stripe's API returns them, in the connected account it names (Stripe-Account) or the
        platform's own, or None when Stripe has no such event there (404)."""
        headers = {"Authorization": f"Bearer {self._api_key}"}
        account = account_of(event)
        if is_account(account):  # parse checked a delivery's; a stored one's, replayed, is checked here
            headers["Stripe-Account"] = account
        return record(self._get(f"/v1/events/{quote(event.id, safe='')}", headers, "events"), NAME, "its event")

    def related(self, related: Related) -> bytes | None:
        """A thin event's related object as Stripe's API returns it now, in the event's account context
        (Stripe-Context), or None when Stripe has no such object there (404)."""
        headers = {"Authorization": f"Bearer {self._api_key}", "Stripe-Version": THIN_FETCH_VERSION}
        if related.context is not None:
            headers["Stripe-Context"] = related.context
        reply = self._get(f"{THIN_OBJECTS[related.type]}{quote(related.id, safe='')}", headers, related.type)
        return record(reply, NAME, f"its {related.type}")

    def page(self, listed: str, params: Sequence[tuple[str, str]], account: str | None = None,
             context: str | None = None) -> bytes:
        """One page of a LISTS list (`listed` its key) as account (Stripe-Account, List Events) or in context
        (Stripe-Context, a thin event's objects, in THIN_FETCH_VERSION); ProviderUnavailableError unless 200."""
        headers = {"Authorization": f"Bearer {self._api_key}"}
        if listed != "event":
            headers["Stripe-Version"] = THIN_FETCH_VERSION
        if context is not None:
            headers["Stripe-Context"] = context
        elif account is not None:
            headers["Stripe-Account"] = account
        reply = self._get(f"{LISTS[listed]}?{urlencode(params)}", headers, f"{listed}_list", MAX_PAGE_BYTES)
        body = record(reply, NAME, f"a page of {LISTS[listed]}")
        if body is None:
            raise ProviderUnavailableError(f"{NAME} answered 404 for {LISTS[listed]}")
        return body

    def _get(self, path: str, headers: dict[str, str], endpoint: str, max_bytes: int = MAX_ANSWER_BYTES) -> Reply:
        """One GET, spending endpoint's share of the budget: Stripe counts each named operation as an endpoint (GET
        /v1/payment_intents/{id} for any id is one)."""
        if self.outbound is None:
            raise AssertionError("a command's StripeAPI makes no service calls")
        spend: Spend | None = None if self.budget is None else self.budget.on(endpoint)
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            return self.outbound.request(SCHEME, "GET", f"{self.base}{path}", deadline, headers=headers,
                                         max_bytes=max_bytes, spend=spend)

    # -- a command's calls: stripe-python's requests, retried, waiting for the budget ---------------------------

    def _list_page(self, path: str, what: str, params: dict[str, Any]) -> tuple[list[Any], bool]:
        """One page of a list (StripeClient.raw_request: the client's requests, retries): its data and has_more."""
        client = self._stripe_client()
        answer = self._call(lambda: client.raw_request("get", path, **params), what)
        page = answer.data
        if not (isinstance(page, dict) and isinstance(page.get("data"), list) and
                isinstance(page.get("has_more"), bool)):
            raise ProviderError(f"{NAME} answered a page that is not a list of {what}: {_quoted(answer.body)}")
        if page["has_more"] and not page["data"]:
            raise ProviderError(f"{NAME} answered an empty page that says it has more (has_more: true): the run "
                                "cannot go on from it")
        return page["data"], page["has_more"]

    def _stripe_client(self) -> Any:
        if self._client is None:
            import stripe  # stripe-python: imported by a command's first request, never by the service

            self._client = stripe.StripeClient(self._api_key, base_addresses={"api": self.base},
                                               max_network_retries=NETWORK_RETRIES)
            # stripe-python logs each request at INFO: one line per page would drown the run's summary.
            logging.getLogger("stripe").setLevel(logging.WARNING)
        return self._client

    def _wait_for_budget(self) -> None:
        """Spend one request of the account's budget, waiting as long as it says (a command may wait)."""
        while self.budget is not None:
            try:
                self.budget.take(self.endpoint)
                return
            except OverBudgetError as exc:
                time.sleep(exc.wait_seconds)

    def _call(self, request: Any, what: str) -> Any:
        import stripe

        delay = RATE_LIMIT_FIRST_DELAY
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            self._wait_for_budget()
            try:
                return request()
            except stripe.RateLimitError as exc:
                if self.budget is not None:  # every host of the service slows down with this command
                    self.budget.slow_down(exc.headers or {})
                if attempt == RATE_LIMIT_RETRIES:
                    raise ProviderError(f"{NAME} kept answering 429 (rate limited) after {attempt} retries") from None
                time.sleep(delay)
                delay = min(delay * 2, RATE_LIMIT_MAX_DELAY)
            except (stripe.AuthenticationError, stripe.PermissionError) as exc:
                account = self._context.get("stripe_account")
                where, whose = (f" in account {account}", ", of a platform connected to it") if account else ("", "")
                raise ProviderRefusedError(
                    f"{NAME} refused the key in {self._key_setting} ({exc.http_status}){where}: it must be a "
                    f"restricted key with read access to {what.capitalize()}{whose}") from None
            except stripe.StripeError as exc:
                if exc.http_status is not None and 200 <= exc.http_status < 300:  # its body did not parse
                    raise ProviderError(f"{NAME} answered a page that is not JSON ({exc.http_status}): "
                                        f"{_quoted(exc.http_body or '')}") from None
                status = f"{exc.http_status}: " if exc.http_status else ""
                message = _quoted(exc.user_message or type(exc).__name__)
                raise ProviderError(f"{NAME} failed after its retries ({status}{message})") from None
        raise AssertionError("unreachable")


class StripeAccounts(StripeAPI):
    """A Connect platform's connected accounts (https://docs.stripe.com/api/accounts/list)."""

    def ids(self) -> list[str]:
        """The id of every account listed, all pages, once each, as listed ("?" for one that is not a string);
        ProviderError as StripeEvents.pages when a page cannot be followed."""
        ids: dict[str, None] = {}  # in the list's order, an account listed twice once
        cursors: set[str] = set()
        params: dict[str, Any] = {"limit": PAGE_LIMIT}
        while True:
            data, has_more = self._list_page("/v1/accounts", "accounts", params)
            for account in data:
                account_id = account.get("id") if isinstance(account, dict) else None
                ids[account_id if isinstance(account_id, str) else "?"] = None
            if not has_more:
                return list(ids)
            params = {"limit": PAGE_LIMIT, "starting_after": _cursor(data[-1], cursors, "an account")}


class StripeEvents(StripeAPI):
    """One Stripe account's events, listed with a restricted key that may read Events: the platform's own, or,
    with account, a connected account's (its `Stripe-Account` header: https://docs.stripe.com/connect/authentication)."""

    horizon_days = HORIZON_DAYS

    def __init__(self, api_key: str, api_base: str, key_setting: str, account: str | None = None,
                 budget: "Budget | None" = None) -> None:
        super().__init__(api_key, api_base, key_setting, budget)
        self.account = account
        if account:
            self._context = {"stripe_account": account}

    def pages(self, since: int, until: int) -> Iterator[list[ListedEvent]]:
        """The events created in [since, until) (Unix seconds), oldest first, a page at a time; ProviderError when a
        page cannot be followed (not a page, empty but saying it has more, or a cursor that cannot be or repeats)."""
        window = {"created": {"gte": since, "lt": until}, "limit": PAGE_LIMIT}
        oldest = self._oldest(window)
        if oldest is None:
            return
        cursors: set[str] = set()  # the pass's cursors: one id a page
        newer_than = _cursor(oldest, cursors, "an event")
        first = [_listed(oldest)]  # the oldest comes first, with the page of those just after it
        while True:
            # ListObject.previous_page's request: the page just newer than the cursor, newest first.
            data, has_more = self._page({**window, "ending_before": newer_than})
            if has_more:
                newer_than = _cursor(data[0], cursors, "an event")
            yield first + [_listed(document) for document in reversed(data)]
            first = []
            if not has_more:
                return

    def _oldest(self, window: dict[str, Any]) -> Any:
        """The window's oldest event, as listed: the first pass, newest first (ListObject.next_page's requests)."""
        oldest: Any = None
        older_than: str | None = None
        cursors: set[str] = set()
        while True:
            data, has_more = self._page({**window, "starting_after": older_than} if older_than else window)
            if data:  # only the last page's last event is kept
                oldest = data[-1]
            if not has_more:
                return oldest
            older_than = _cursor(data[-1], cursors, "an event")

    def _page(self, params: dict[str, Any]) -> tuple[list[Any], bool]:
        """One page of List Events, in the account's context."""
        return self._list_page("/v1/events", "events", {**params, **self._context})


def _listed(document: Any) -> ListedEvent:
    """An event as a page's JSON carried it (raw_request's answer keeps it parsed, in order); a lone surrogate,
    which UTF-8 cannot hold, is kept as the JSON escape it came as."""
    event_id = document.get("id") if isinstance(document, dict) else None
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")
    return ListedEvent(event_id if isinstance(event_id, str) else "?", body)


def _cursor(document: Any, cursors: set[str], what: str) -> str:
    """The id of document (what: "an event"), the next request's cursor, added to the pass's cursors; ProviderError
    if it cannot be."""
    object_id = document.get("id") if isinstance(document, dict) else None
    if not (isinstance(object_id, str) and is_id(object_id)):
        raise ProviderError(f"{NAME} listed {what} whose id cannot be a cursor, so the run cannot page past it: "
                            f"{_quoted(json.dumps(document))}")
    if object_id in cursors:
        raise ProviderError(f"{NAME} answered a page it answered before (its cursor {excerpt(object_id)} again): "
                            "the list does not follow its cursor; the run stops")
    cursors.add(object_id)
    return object_id


def _quoted(received: str | bytes) -> str:
    """An excerpt of what Stripe sent, a key in it hidden."""
    return excerpt(_KEY.sub("<key>", received.decode("utf-8", "replace") if isinstance(received, bytes) else received))
