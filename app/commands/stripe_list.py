"""Stripe's List Events, oldest first, a page at a time, through stripe-python's `raw_request`: the provider part
of `flask reconcile` (docs/design.md, "Reconciliation")."""

import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import stripe

from .reconcile import ListedEvent, ProviderError, ProviderRefusedError

NAME = "Stripe"
HORIZON_DAYS = 30  # "List events, going back up to 30 days"
PAGE_LIMIT = 100  # the most List Events gives per page
# stripe-python's retries of connection errors and 5xx (0.5 s, 1 s, 2 s, ... up to 5 s between them).
NETWORK_RETRIES = 5
# A 429, retried here: 1 s, 2 s, 4 s, ... up to 16 s, about a minute in all, then the run fails.
RATE_LIMIT_RETRIES, RATE_LIMIT_FIRST_DELAY, RATE_LIMIT_MAX_DELAY = 6, 1.0, 16.0
# A key in a message Stripe wrote (it shows a key's first characters): never repeated.
_KEY = re.compile(r"\b(sk|rk|pk)_(live|test)_\S*")


class StripeEvents:
    """One Stripe account's events, listed with a restricted key that may read Events."""

    name = NAME
    horizon_days = HORIZON_DAYS

    def __init__(self, api_key: str, api_base: str, key_setting: str) -> None:
        self._client = stripe.StripeClient(api_key, base_addresses={"api": api_base},
                                           max_network_retries=NETWORK_RETRIES)
        self._key_setting = key_setting  # named in a refusal, never the key itself
        # stripe-python logs each request at INFO: one line per page would drown the run's summary.
        logging.getLogger("stripe").setLevel(logging.WARNING)

    def pages(self, since: int, until: int) -> Iterator[list[ListedEvent]]:
        """The events created in [since, until) (Unix seconds), oldest first, a page at a time."""
        window = {"created": {"gte": since, "lt": until}, "limit": PAGE_LIMIT}
        oldest = self._oldest(window)
        if oldest is None:
            return
        first = [oldest]  # the oldest comes first, with the page of those just after it
        newer_than = oldest.id
        while True:
            # ListObject.previous_page's request: the page just newer than the cursor, newest first.
            answer = self._page({**window, "ending_before": newer_than})
            yield first + _listed(answer["data"])[::-1]
            first = []
            if not answer["has_more"] or not answer["data"]:
                return
            newer_than = answer["data"][0]["id"]

    def _oldest(self, window: dict[str, Any]) -> ListedEvent | None:
        """The window's oldest event: the first pass, newest first (ListObject.next_page's requests)."""
        oldest: ListedEvent | None = None
        while True:
            answer = self._page({**window, "starting_after": oldest.id} if oldest else window)
            if answer["data"]:  # only the last page's last event is kept
                oldest = _listed(answer["data"][-1:])[0]
            if not answer["has_more"]:
                return oldest

    def _page(self, params: dict[str, Any]) -> dict[str, Any]:
        """One page of List Events as its JSON, parsed (StripeClient.raw_request: the client's requests, retries)."""
        page: dict[str, Any] = self._call(lambda: self._client.raw_request("get", "/v1/events", **params)).data
        return page

    def _call(self, request: Any) -> Any:
        delay = RATE_LIMIT_FIRST_DELAY
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                return request()
            except stripe.RateLimitError:
                if attempt == RATE_LIMIT_RETRIES:
                    raise ProviderError(f"{NAME} kept answering 429 (rate limited) after {attempt} retries") from None
                time.sleep(delay)
                delay = min(delay * 2, RATE_LIMIT_MAX_DELAY)
            except (stripe.AuthenticationError, stripe.PermissionError) as exc:
                raise ProviderRefusedError(
                    f"{NAME} refused the key in {self._key_setting} ({exc.http_status}): it must be a restricted "
                    "key with read access to Events") from None
            except stripe.StripeError as exc:
                status = f"{exc.http_status}: " if exc.http_status else ""
                message = _KEY.sub("<key>", exc.user_message or type(exc).__name__)
                raise ProviderError(f"{NAME} failed after its retries ({status}{message})") from None
        raise AssertionError("unreachable")


def _listed(documents: list[dict[str, Any]]) -> list[ListedEvent]:
    """Events as a page's JSON carried them (raw_request's answer keeps it parsed, in order)."""
    return [ListedEvent(document["id"], int(document["created"]),
                        json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode())
            for document in documents]
