"""Razorpay: its signature scheme, its events' shape and money rules, and its API, the entity an event names.
An event's id is its unsigned header bound to the body's digest (docs/providers.md, "razorpay")."""

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import requests
from razorpay import Client  # type: ignore[import-untyped]  # no hints
from requests.adapters import BaseAdapter

from ..core.errors import ProviderUnavailableError
from ..core.provider import Provider, envelope, recorded, with_statuses
from ..core.signing import Certificates, hex_digest, mac, match, required
from ..core.vocabulary import (
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    Headers,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Rule,
    State,
    an_object,
    load,
    lower,
    text,
    uuid_text,
)
from .outbound import MAX_ANSWER_BYTES, Deadline, Outbound, record

if TYPE_CHECKING:
    from .budget import Budget, Spend

SCHEME = "razorpay"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "Razorpay"
SIGNATURE_HEADER = "X-Razorpay-Signature"
EVENT_ID_HEADER = "x-razorpay-event-id"
# A Razorpay event id ends in this many hex digits of its body's SHA-256: 128
# bits, so no one can make a body that takes the id of one they have not seen.
RAZORPAY_DIGEST_HEX = 32
# The longest x-razorpay-event-id whose event id (header, dot, digest) fits MAX_ID_CHARS.
MAX_RAZORPAY_HEADER_CHARS = MAX_ID_CHARS - 1 - RAZORPAY_DIGEST_HEX
PAYMENT_EVENTS = ("payment.captured", "order.paid")
REFUND_EVENTS = ("refund.processed",)
DISPUTE_LOST = "payment.dispute.lost"
DISPUTE_WON = "payment.dispute.won"


# -- the scheme ---------------------------------------------------------------------------------

def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    return match(secrets, [body], [hex_digest(required(headers, SIGNATURE_HEADER).strip(), SIGNATURE_HEADER)])


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """What Razorpay sends with body: its signature, and the event id beside it, unsigned (msg_id, when given)."""
    return {SIGNATURE_HEADER: mac(secrets[0], body).hex(), **({EVENT_ID_HEADER: msg_id} if msg_id else {})}


# -- the shape ----------------------------------------------------------------------------------

def is_razorpay(document: dict[str, Any]) -> bool:
    """Whether a body is in Razorpay's own shape (refund.created and refund.failed are Stripe's names too)."""
    return "type" not in document and isinstance(document.get("payload"), dict)


def parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """The event in Razorpay's own shape: type its `event`, data its `payload`, id the header and the digest."""
    event_type = text(document.get("event"), "'event'", MAX_TYPE_CHARS)
    payload = document.get("payload")
    if not isinstance(payload, dict):
        raise InvalidEventError("'payload' must be an object")
    header_id = text(headers.get(EVENT_ID_HEADER), f"the {EVENT_ID_HEADER} header", MAX_RAZORPAY_HEADER_CHARS)
    # The header is not signed: the body's digest binds the id to the signed bytes.
    event_id = f"{header_id}.{hashlib.sha256(body).hexdigest()[:RAZORPAY_DIGEST_HEX]}"
    return Event(event_id, event_type, payload, document, body, source)


# -- the rules ----------------------------------------------------------------------------------

def _entity(event: Event, name: str) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return an_object(an_object(an_object(event.document.get("payload")).get(name)).get("entity"))


def _read_payment(event: Event) -> Fields:
    """payment.captured and order.paid: the same payment, credited once by its id."""
    payment = _entity(event, "payment")
    user_id = uuid_text(an_object(payment.get("notes")).get("user_id"))  # notes is [] when empty
    return Fields(payment.get("id"), user_id, payment.get("amount"), lower(payment.get("currency")), None)


# A Razorpay Refund's status -> what it says of the refund (Razorpay's Refund entity).
REFUND_STATES = {"pending": State.APPLIED, "processed": State.APPLIED, "failed": State.REVERSED}


def read_refund(event: Event) -> Fields:
    """A Refund entity, in any event that carries it."""
    refund = _entity(event, "refund")
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_id"), None, refund.get("amount"), lower(refund.get("currency")), None,
                  refund.get("id"), state)


# A Dispute's status (Razorpay's Disputes entity, in its order) -> what it says of the dispute: lost takes what Razorpay
# deducted, won gives it back; open, under_review and closed have no outcome, and move nothing.
DISPUTE_STATUSES = ("open", "under_review", "won", "lost", "closed")
DISPUTE_STATES = {"won": State.REVERSED, "lost": State.APPLIED}


def _read_dispute(said: State) -> Callable[[Event], Fields | str | None]:
    """A Dispute entity moves what Razorpay deducted from the merchant (amount_deducted), not what was disputed
    (amount): lost, it takes that; won, it gives that back, and nothing when nothing was deducted (0, as for any
    dispute not lost: a win then gives nothing back, and leaves a later loss, in pre-arbitration, to take).
    Delivered, its state is the event's (said); fetched, its record's status now, as a refund's."""
    def read(event: Event) -> Fields | str | None:
        dispute = _entity(event, "dispute")
        state = said
        if is_fetched(event.document):
            status = dispute.get("status")
            if not (isinstance(status, str) and status in DISPUTE_STATUSES):
                return (f"payload.dispute.entity.status must be one of {', '.join(DISPUTE_STATUSES)} (Razorpay's "
                        "record of the dispute)")
            if status not in DISPUTE_STATES:  # no outcome now: the outcome's own event moves the money
                return None
            state = DISPUTE_STATES[status]
        deducted = dispute.get("amount_deducted")
        if state == State.REVERSED and type(deducted) is int and deducted == 0:  # not False, not 0.0
            return None
        return Fields(dispute.get("payment_id"), None, deducted, lower(dispute.get("currency")), None,
                      dispute.get("id"), state)
    return read


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("payload.refund.entity.payment_id", None, "payload.refund.entity.amount",
                       "payload.refund.entity.currency", None, "payload.refund.entity.id",
                       "payload.refund.entity.status")
_DISPUTE_LABELS = Fields("payload.dispute.entity.payment_id", None, "payload.dispute.entity.amount_deducted",
                         "payload.dispute.entity.currency", None, "payload.dispute.entity.id", None)
RULES = {
    **{paid: Rule(Kind.CREDIT, _read_payment, Fields(
        "payload.payment.entity.id", "payload.payment.entity.notes.user_id", "payload.payment.entity.amount",
        "payload.payment.entity.currency", None)) for paid in PAYMENT_EVENTS},
    **{refund: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund in REFUND_EVENTS},
    DISPUTE_LOST: Rule(Kind.DISPUTE, _read_dispute(State.APPLIED), _DISPUTE_LABELS),
    DISPUTE_WON: Rule(Kind.DISPUTE, _read_dispute(State.REVERSED), _DISPUTE_LABELS),
}


# -- the API ------------------------------------------------------------------------------------

API_BASE = "https://api.razorpay.com"  # razorpay.Client's own
# Where with_entity marks a document fetched: a key of ours, in no body Razorpay sends.
_FETCHED = "_webhook_ledger_fetched"
# The entity each event's money is read from (payload.<entity>.entity): the one fetched. Razorpay's API has no
# event by id; its Fetch a Payment, Fetch Refund and Fetch a Dispute With ID return these (docs/providers.md).
ENTITIES = {**{paid: "payment" for paid in PAYMENT_EVENTS},
            **{refund: "refund" for refund in ("refund.created", *REFUND_EVENTS, "refund.failed")},
            DISPUTE_LOST: "dispute", DISPUTE_WON: "dispute"}


def is_entity(document: dict[str, Any]) -> bool:
    """Whether a document is one of the entities ENTITIES names, as Razorpay's API returns it."""
    return document.get("entity") in ENTITIES.values() and isinstance(document.get("id"), str)


def with_entity(document: dict[str, Any], entity: dict[str, Any]) -> dict[str, Any]:
    """The delivered event's document with the entity Razorpay's API returned in its place, marked fetched: what the
    money is read from, on receipt and from the stored bytes alike."""
    return {**document, "payload": {**an_object(document.get("payload")), entity["entity"]: {"entity": entity}},
            _FETCHED: True}


def is_fetched(document: dict[str, Any]) -> bool:
    """Whether a document's entity is Razorpay's record now (with_entity), not the one delivered."""
    return document.get(_FETCHED) is True


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
        kind, entity_id = _named(event) or ("", "")
        transport = _Transport(self.outbound, self.outbound.deadline(), f"its {kind}",
                               None if self.budget is None else self.budget.on(kind))
        session = requests.Session()
        session.trust_env = False  # no proxy or .netrc from the environment: the call is the outbound's alone
        session.mount("https://", transport)
        session.mount("http://", transport)
        client = Client(session=session, auth=self._auth, base_url=self.base)
        with self.outbound.slot(SCHEME):
            try:
                getattr(client, kind).fetch(quote(entity_id, safe=""))  # GET /v1/{kind}s/{id}
            except _NoRecordError:
                return None
        return transport.body

    def read(self, event: Event, body: bytes) -> Event:
        """event with the entity Razorpay's API returned (body) in place of the delivered one."""
        entity = load(body)  # parsed once already, by _Transport
        kind, entity_id = _named(event) or ("", "")
        if entity.get("entity") != kind or entity.get("id") != entity_id:
            raise ProviderUnavailableError(f"Razorpay's API answered with another entity than the {kind} asked for")
        document = with_entity(event.document, entity)
        return Event(event.id, event.type, document["payload"], document, event.body, event.source)


def _named(event: Event) -> tuple[str, str] | None:
    """(entity, id) of what event's money is read from: ("payment", "pay_..."); None when it names none."""
    kind = ENTITIES.get(event.type)
    entity_id = _entity(event, kind).get("id") if kind and is_razorpay(event.document) else None
    return (kind, entity_id) if kind and isinstance(entity_id, str) and entity_id else None


class _NoRecordError(Exception):
    """Razorpay has no such entity."""


class _Transport(BaseAdapter):
    """razorpay.Client's HTTP through the process's outbound calls (one deadline, the status read as every
    provider's): the client sees only a 200, whose bytes are kept."""

    def __init__(self, outbound: Outbound, deadline: Deadline, what: str, spend: "Spend | None",
                 max_bytes: int = MAX_ANSWER_BYTES) -> None:
        super().__init__()
        self.outbound, self.deadline, self.what, self.spend = outbound, deadline, what, spend
        self.max_bytes = max_bytes  # an entity's by default; a page of the audit's lists more
        self.body: bytes | None = None

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        headers = {name: value.decode() if isinstance(value, bytes) else value
                   for name, value in request.headers.items()}
        # The client's fetches are GETs, without a body; an answer in its bytes, not compressed.
        reply = self.outbound.request(SCHEME, "GET", request.url or "", self.deadline,
                                      headers={**headers, "Accept-Encoding": "identity"}, spend=self.spend,
                                      max_bytes=self.max_bytes)
        # Razorpay answers an id it does not know (or another account's) 400 BAD_REQUEST_ERROR.
        found = record(reply._replace(status=404) if reply.status == 400 else reply, NAME, self.what)
        if found is None:
            raise _NoRecordError
        try:
            load(found)  # the client's own parse of a body that is not JSON prints to stdout
        except InvalidJSONError as exc:
            raise ProviderUnavailableError(f"Razorpay's API answered with an entity that does not parse: {exc}") \
                from None
        self.body = found
        response = requests.Response()
        response.status_code, response._content, response.url, response.request = 200, found, request.url or "", \
            request
        response.headers["Content-Type"] = "application/json"
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        pass  # each call its own connection, closed by outbound


# -- the provider -------------------------------------------------------------------------------

def _parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """Razorpay's own shape, or the common one when the body names its type."""
    return envelope(document, body, headers, source) if "type" in document else parse(document, body, headers, source)


def _stored(event_id: str, event_type: str, document: dict[str, Any], fetched: bool, body: bytes,
            source: str) -> Event | None:
    """A stored event whose kept bytes are the entity Razorpay's API returned, read in its delivered event."""
    if not (fetched and is_entity(document)):
        return None
    return recorded(event_id, event_type, with_entity(load(body), document), body, source)


def _api(base: str, key: str, outbound: Outbound, budget: "Budget | None", every_event: bool) -> API | None:
    return API(base, key, outbound, budget) if every_event else None


PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, sign, parse=_parse,
                    rules=with_statuses({**RULES, **{refund: Rule(Kind.REFUND, read_refund, REFUND_LABELS)
                                                     for refund in ("refund.created", "refund.failed")}},
                                        REFUND_STATES),
                    owns=is_razorpay, stored=_stored, api=_api, api_base=API_BASE,
                    # HTTP Basic's: the key id (rzp_live_..., rzp_test_...), a colon, the key secret.
                    api_key_words="Razorpay's API key", api_key_written="<key id>:<key secret>",
                    api_key_pattern="[^:]+:.+")
