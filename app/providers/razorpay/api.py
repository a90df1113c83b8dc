"""Razorpay's API for the fetch step: the entity an event names, asked through Razorpay's own client, which is
imported on the first call (app/providers/razorpay/client.py)."""

from typing import TYPE_CHECKING
from urllib.parse import quote

from ...core.errors import ProviderUnavailableError
from ...core.vocabulary import Event, load
from ..outbound import Outbound
from .rules import ENTITIES, entity, is_razorpay, with_entity
from .scheme import NAME, SCHEME

if TYPE_CHECKING:
    from ..budget import Budget

API_BASE = "https://api.razorpay.com"  # razorpay.Client's own


class API:
    """Razorpay's API for one source, asked through its official client (razorpay.Client) over the process's
    outbound calls; credentials are `<key id>:<key secret>` (never in a repr, a log line or an answer)."""

    name = NAME

    def __init__(self, base: str, credentials: str, outbound: Outbound, budget: "Budget | None" = None) -> None:
        self.base = base
        key_id, _, secret = credentials.partition(":")
        self._auth = (key_id, secret)
        self.outbound = outbound
        self.budget = budget  # the account's shared budget (app/providers/budget.py); None: unmetered

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def names(self, event: Event) -> str | None:
        """The entity event's money is read from, as `payment pay_...`; None when it names none (nothing to ask)."""
        named = _named(event)
        return None if named is None else " ".join(named)

    def get(self, event: Event) -> bytes | None:
        """The bytes of the entity event names (names() is not None), as Razorpay's API returns them; None when
        Razorpay has no such entity. ProviderUnavailableError, or ProviderRefusedError, as outbound.record says."""
        from .client import NoRecordError, calling  # razorpay and requests, on the first call

        kind, entity_id = _named(event) or ("", "")
        client, transport = calling(self.outbound, self.outbound.deadline(), f"its {kind}",
                                    None if self.budget is None else self.budget.on(kind), self._auth, self.base)
        with self.outbound.slot(SCHEME):
            try:
                getattr(client, kind).fetch(quote(entity_id, safe=""))  # GET /v1/{kind}s/{id}
            except NoRecordError:
                return None
        return transport.body

    def read(self, event: Event, body: bytes) -> Event:
        """event with the entity Razorpay's API returned (body) in place of the delivered one."""
        fetched = load(body)  # parsed once already, by client.Transport
        kind, entity_id = _named(event) or ("", "")
        if fetched.get("entity") != kind or fetched.get("id") != entity_id:
            raise ProviderUnavailableError(f"Razorpay's API answered with another entity than the {kind} asked for")
        document = with_entity(event.document, fetched)
        return Event(event.id, event.type, document["payload"], document, event.body, event.source)


def _named(event: Event) -> tuple[str, str] | None:
    """(entity, id) of what event's money is read from: ("payment", "pay_..."); None when it names none."""
    kind = ENTITIES.get(event.type)
    entity_id = entity(event, kind).get("id") if kind and is_razorpay(event.document) else None
    return (kind, entity_id) if kind and isinstance(entity_id, str) and entity_id else None

