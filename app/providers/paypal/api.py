"""PayPal's REST API: an OAuth 2.0 token from the REST app's credentials, then the event by its id."""

import base64
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from ...core.errors import ProviderUnavailableError
from ...core.vocabulary import Event, InvalidJSONError, load
from ..outbound import MAX_ANSWER_BYTES, Deadline, Outbound, Reply, record
from .scheme import NAME, SCHEME

if TYPE_CHECKING:
    from .. import budget as shared

# PayPal's live REST API; a sandbox source sets WEBHOOK_<NAME>_API_BASE=https://api-m.sandbox.paypal.com.
API_BASE = "https://api-m.paypal.com"
# The result a 401 to a token is counted as when one more token is asked for: no alert unless that one is refused.
STALE_TOKEN = "stale_token"


class API:
    """PayPal's REST API for one source: its credentials, its OAuth 2.0 token (kept until it expires), its events.
    credentials: the REST app's `<client id>:<secret>` (WEBHOOK_<NAME>_API_KEY), never in a repr, a log or an answer."""

    name = NAME

    def __init__(self, base: str, credentials: str, outbound: Outbound, budget: "shared.Budget | None" = None) -> None:
        self.base = base
        self._basic = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.outbound = outbound
        self.budget = budget  # the account's shared budget (app/providers/budget.py); None: unmetered
        self._token: tuple[str, float] | None = None  # the access token and when to stop using it
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event: Event) -> bytes | None:
        """The event's bytes as PayPal's API returns them, or None when PayPal has no such event (404). Within the
        deadline and one slot; ProviderUnavailableError when PayPal cannot answer now, ProviderRefusedError when it
        refuses our credentials."""
        return self.get(f"/v1/notifications/webhooks-events/{quote(event.id, safe='')}", "its event",
                        endpoint="webhooks-events")

    def get(self, path: str, what: str, endpoint: str, max_bytes: int = MAX_ANSWER_BYTES) -> bytes | None:
        """The body PayPal's API answers GET path with (a query included), or None for a 404; what names it in
        an error, endpoint in the account's budget. Raises as event does, within the deadline and one slot."""
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            # A token PayPal revoked before its time: one more, once. Only the second 401 refuses our credentials.
            reply = self._get(path, deadline, max_bytes, endpoint, unauthorized_as=STALE_TOKEN)
            if reply.status == 401:
                self._token = None
                reply = self._get(path, deadline, max_bytes, endpoint)
        return record(reply, NAME, what)

    def _get(self, path: str, deadline: Deadline, max_bytes: int, endpoint: str,
             unauthorized_as: str | None = None) -> Reply:
        return self.outbound.request(SCHEME, "GET", self.base + path, deadline, headers={
            "Authorization": f"Bearer {self._access_token(deadline)}", "Accept": "application/json"},
            max_bytes=max_bytes, unauthorized_as=unauthorized_as,
            spend=None if self.budget is None else self.budget.on(endpoint))

    def _access_token(self, deadline: Deadline) -> str:
        with self._lock:
            if self._token is not None and self._token[1] > time.monotonic():
                return self._token[0]
        reply = self.outbound.request(SCHEME, "POST", self.base + "/v1/oauth2/token", deadline, headers={
            "Authorization": self._basic, "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded"}, body=b"grant_type=client_credentials",
            spend=None if self.budget is None else self.budget.on("oauth2-token"))
        try:
            answer = load(record(reply, NAME, "an access token") or b"")
            token, lifetime = answer["access_token"], answer["expires_in"]
            if not isinstance(token, str) or not isinstance(lifetime, int):
                raise TypeError
        except (InvalidJSONError, KeyError, TypeError):
            raise ProviderUnavailableError("PayPal's token endpoint answered without a token") from None
        with self._lock:
            # A minute early: a token must not expire between this check and PayPal's.
            self._token = (token, time.monotonic() + max(lifetime - 60, 0))
        return token

