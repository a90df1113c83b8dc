"""Stripe's API, asked for an event by id: `GET /v1/events/{id}` ("Retrieve an event",
https://docs.stripe.com/api/events/retrieve), with the source's secret or restricted key.

Optional for snapshot events (WEBHOOK_<NAME>_FETCH=true): the event's
signature covers its whole body, so Stripe's copy adds no authenticity, but a
source that wants the money read from Stripe's own record has it.
"""

from urllib.parse import quote

from .outbound import Outbound, ProviderRefusedError, ProviderUnavailableError

PROVIDER = "stripe"


class API:
    """Stripe's API for one source: its base address and key (never in a repr, a log line or an answer)."""

    def __init__(self, base: str, key: str, outbound: Outbound) -> None:
        self.base = base
        self._authorization = f"Bearer {key}"
        self.outbound = outbound

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event_id: str) -> bytes | None:
        """The event's bytes as Stripe's API returns them, or None when Stripe has no such event (404)."""
        deadline = self.outbound.deadline()
        with self.outbound.slot(PROVIDER):
            reply = self.outbound.request(PROVIDER, "GET", f"{self.base}/v1/events/{quote(event_id, safe='')}",
                                          deadline, headers={"Authorization": self._authorization})
        if reply.status == 404:
            return None
        if reply.status in (401, 403):
            raise ProviderRefusedError(f"Stripe refused our key for its event (HTTP {reply.status}): "
                                       f"check the source's API key")
        if reply.status != 200:
            raise ProviderUnavailableError(f"Stripe answered {reply.status} for its event")
        return reply.body
