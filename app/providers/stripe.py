"""Stripe: its signature scheme, its snapshot and thin events' money rules (keyed in a Connect event's account),
and its API: an event by id, a thin event's related object (docs/providers/stripe.md, "Thin events",
"Connect")."""

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard
from urllib.parse import quote, urlencode

from ..core.errors import ProviderUnavailableError
from ..core.provider import EventById, Provider, envelope, with_statuses
from ..core.signing import Certificates, SignatureError, check_timestamp, hex_digest, mac, match, required
from ..core.vocabulary import (
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    Headers,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Metadata,
    Rule,
    State,
    an_object,
    is_cents,
    is_id,
    load,
    lower,
    text,
)
from .outbound import Outbound, record

if TYPE_CHECKING:
    from .budget import Budget, Spend

SCHEME = "stripe"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "Stripe"
# The header that tells its deliveries apart, named to a delivery sent to a source of another scheme.
SIGNATURE_HEADER = "Stripe-Signature"
PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
CHARGE_REFUNDED = "charge.refunded"
# Stripe's Refund object, in each event that carries it (docs/providers/stripe.md).
REFUND_EVENTS = ("refund.created", "refund.updated", "refund.failed", "charge.refund.updated")
DISPUTE_FUNDS_WITHDRAWN = "charge.dispute.funds_withdrawn"
DISPUTE_FUNDS_REINSTATED = "charge.dispute.funds_reinstated"
# Checkout Sessions whose payment_status may say paid (docs/providers/stripe.md, "Checkout").
CHECKOUT_SESSION_EVENTS = ("checkout.session.completed", "checkout.session.async_payment_succeeded")
# The first Stripe API version whose charge.refunded no longer counts an
# authorisation released by a partial capture or a cancellation.
STRIPE_BASIL = "2025-03-31"


# -- the scheme ---------------------------------------------------------------------------------

def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    name = SIGNATURE_HEADER
    stamps, signatures = [], []
    for item in required(headers, name).split(","):
        key, equals, value = item.strip().partition("=")
        if not equals:
            raise SignatureError(f"malformed {name} header: expected comma-separated key=value pairs")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            signatures.append(hex_digest(value, name))
        # v0 (Stripe's test scheme) and keys added later are ignored, as Stripe's own verifier does.
    if len(stamps) != 1:
        raise SignatureError(f"malformed {name} header: expected exactly one t=<timestamp>")
    if not signatures:
        raise SignatureError(f"{name} header has no v1 signature")
    check_timestamp(stamps[0], name, tolerance, now)
    return match(secrets, [stamps[0].encode(), b".", body], signatures)


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """The header Stripe sends with body: one v1 per secret, as while a secret rolls."""
    t = str(timestamp)
    v1 = ",".join(f"v1={mac(s, t.encode(), b'.', body).hex()}" for s in secrets)
    return {SIGNATURE_HEADER: f"t={t},{v1}"}


# -- Connect: a connected account's events (docs/providers/stripe.md, "Connect") ------------------------

# A connected account's id: a Connect event's top-level `account` (https://docs.stripe.com/api/events/object).
ACCOUNT = re.compile(r"acct_[A-Za-z0-9]+")


def is_account(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS and ACCOUNT.fullmatch(value) is not None


def check_account(document: Mapping[str, Any]) -> None:
    """InvalidEventError unless a snapshot event's `account`, when it has one, is a connected account's id."""
    account = document.get("account")
    if account is not None and not is_account(account):
        raise InvalidEventError(f"'account' must be a connected account's id (acct_ and letters or digits), "
                                f"1 to {MAX_ID_CHARS} characters")


def account_of(event: Event) -> object:
    """The connected account an event's object is in: a snapshot event's `account`, a thin event's context (the
    last account of its path, the one that owns the object); None: the platform's own."""
    if is_thin(event.document):
        context = event.document.get("context")
        return context.rsplit("/", 1)[-1] if isinstance(context, str) else None
    return event.document.get("account")


def _in_account(read: Callable[[Event], Fields | str | None]) -> Callable[[Event], Fields | str | None]:
    """read, with the keys it reads in the event's connected account: acct_X/pi_Y, acct_X/re_Y, acct_X/du_Y and
    the customer acct_X/cus_Y (a connected account's objects are its own); a platform event's keys as they are."""
    def scoped(event: Event) -> Fields | str | None:
        fields = read(event)
        account = account_of(event)
        if account is None or not isinstance(fields, Fields):
            return fields
        if not is_account(account):  # a relayed event's, unchecked by the stripe scheme's parse
            return "account must be a connected account's id (acct_ and letters or digits)"
        ids = (fields.payment_id, fields.movement_id, fields.customer)
        longer = [key for key in ids if isinstance(key, str) and len(key) > MAX_ID_CHARS]
        if longer:
            return f"the id {longer[0]!r} in account {account} is over {MAX_ID_CHARS} characters"
        keys = [f"{account}/{key}" if isinstance(key, str) and key else key for key in ids]  # MAX_KEY_CHARS at most
        return fields._replace(payment_id=keys[0], movement_id=keys[1], customer=keys[2], account=account)
    return scoped


# -- the rules ----------------------------------------------------------------------------------

def _read_payment_intent(event: Event) -> Fields:
    """Its user is named by its metadata (Checkout: payment_intent_data.metadata), else by its customer's link
    (Billing's invoice PaymentIntents carry no subscription metadata, but name the customer)."""
    intent = an_object(event.data.get("object"))
    metadata = Metadata(an_object(intent.get("metadata")))
    return Fields(intent.get("id"), metadata, intent.get("amount_received"), lower(intent.get("currency")),
                  _livemode(event), customer=intent.get("customer"))


def _read_charge_refunded(event: Event) -> Fields | str | None:
    """The Charge's total refunded, of what was captured.

    Before API version 2025-03-31.basil, a partial capture or a cancellation
    counts the authorisation it releases in amount_refunded (and sends
    charge.refunded); since, it does not. A charge never captured moved no
    money. A charge without amount_captured (older API versions) is read
    as captured whole unless `captured` is false.
    """
    charge = an_object(event.data.get("object"))
    total, amount, captured = charge.get("amount_refunded"), charge.get("amount"), charge.get("amount_captured")
    if captured is None and charge.get("captured") is False or captured == 0 and is_cents(captured, zero=True):
        return None
    if is_cents(total) and is_cents(amount) and is_cents(captured) and captured < amount:
        before_basil = _stripe_before(event.document.get("api_version"), STRIPE_BASIL)
        if before_basil is None:
            return "api_version must name a Stripe API version to read the refunds of a partially captured charge"
        if before_basil:
            total -= amount - captured
            if total <= 0:
                return None  # only the released authorisation
    return Fields(charge.get("payment_intent"), None, total, lower(charge.get("currency")), _livemode(event))


# A Refund's status -> what it says of the refund (Stripe's Refund object).
REFUND_STATES = {"pending": State.APPLIED, "requires_action": State.APPLIED, "succeeded": State.APPLIED,
                 "failed": State.REVERSED, "canceled": State.REVERSED}


def _read_refund(event: Event) -> Fields | None:
    """A Refund object, in any event that carries it."""
    refund = an_object(event.data.get("object"))
    if refund.get("reason") == "expired_uncaptured_charge":
        return None  # Stripe's own, for an authorisation that expired uncaptured: no money moved
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_intent"), None, refund.get("amount"), lower(refund.get("currency")),
                  _livemode(event), refund.get("id"), state)


read_refund = _in_account(_read_refund)  # app/intake/events.py's refund.created and refund.failed read it too


def _read_dispute(state: State) -> Callable[[Event], Fields]:
    def read(event: Event) -> Fields:
        dispute = an_object(event.data.get("object"))
        return Fields(dispute.get("payment_intent"), None, dispute.get("amount"), lower(dispute.get("currency")),
                      _livemode(event), dispute.get("id"), state)
    return read


def _livemode(event: Event) -> bool:
    return event.document.get("livemode") is True


def _stripe_before(api_version: object, version: str) -> bool | None:
    """Whether a Stripe API version ("2024-06-20", "2025-03-31.basil") is older than version; None if unreadable."""
    if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
        return None
    return api_version[:10] < version


_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(\.[a-z]+)?")


# -- Checkout ---------------------------------------------------------------------------------

class SessionMetadata(Metadata):
    """A Checkout Session's metadata and client_reference_id, both hashed: the user is the metadata's value of the
    source's key, else the client_reference_id."""

    def __init__(self, metadata: dict[str, object], client_reference_id: object) -> None:
        super().__init__(metadata=metadata, client_reference_id=client_reference_id)

    def get(self, key: str, default: object = None) -> object:
        value = an_object(self["metadata"]).get(key)
        return self["client_reference_id"] if value is None else value

    def label(self, key: str) -> str:
        """Where get(key) read the user from, for a 422's message."""
        return "data.object.client_reference_id" if an_object(self["metadata"]).get(key) is None \
            else f"data.object.metadata.{key}"


def _read_checkout_session(event: Event) -> Fields | None:
    """A paid Session in payment mode credits its PaymentIntent (the key payment_intent.succeeded credits too)
    with its amount_total; unpaid (a delayed payment method), no_payment_required and setup Sessions move nothing,
    and subscription Sessions are SUBSCRIPTION_SESSION's (a subscription's money is its invoices' PaymentIntents)."""
    session = an_object(event.data.get("object"))
    if session.get("mode") != "payment" or session.get("payment_status") != "paid":
        return None
    metadata = SessionMetadata(an_object(session.get("metadata")), session.get("client_reference_id"))
    return Fields(session.get("payment_intent"), metadata, session.get("amount_total"), lower(session.get("currency")),
                  _livemode(event), customer=session.get("customer"))


# A subscription Session's payment_status that says its subscription started: paid, or nothing to pay (a trial, a
# 100% discount). unpaid (a delayed payment method) waits for async_payment_succeeded.
SUBSCRIPTION_STARTED = ("paid", "no_payment_required")


def is_subscription_session(event: Event) -> bool:
    """A subscription Session's event, snapshot or thin (its Session fetched: a thin one's data is empty before)."""
    return event.type.removeprefix("v1.") in CHECKOUT_SESSION_EVENTS \
        and an_object(event.data.get("object")).get("mode") == "subscription"


def subscription_session_rule(event: Event) -> Rule:
    """SUBSCRIPTION_SESSION, with a thin event's labels (related_object.*) for a thin one."""
    return THIN_SUBSCRIPTION_SESSION if is_thin(event.document) else SUBSCRIPTION_SESSION


def _read_subscription_session(event: Event) -> Fields | None:
    """A completed subscription Session links its customer to its user (the metadata's key, else the
    client_reference_id, as a payment Session's credit): no money, and nothing when it names no customer."""
    session = an_object(event.data.get("object"))
    if session.get("status") != "complete" or session.get("payment_status") not in SUBSCRIPTION_STARTED \
            or session.get("customer") is None:
        return None
    metadata = SessionMetadata(an_object(session.get("metadata")), session.get("client_reference_id"))
    return Fields(None, metadata, None, None, _livemode(event), customer=session.get("customer"))


CHECKOUT_SESSION_LABELS = Fields("data.object.payment_intent", "data.object.metadata or client_reference_id",
                                 "data.object.amount_total", "data.object.currency", "livemode",
                                 customer="data.object.customer")
# The rule of a subscription Session (app/intake/events.py's _rule_of picks it by the Session's mode).
SUBSCRIPTION_SESSION = Rule(Kind.LINK, _in_account(_read_subscription_session),
                            CHECKOUT_SESSION_LABELS._replace(payment_id=None, amount=None, currency=None))


# Where a Refund's fields are read, for a 422's message (app/intake/events.py's refund.created reads either shape).
REFUND_LABELS = Fields("data.object.payment_intent", None, "data.object.amount", "data.object.currency",
                       "livemode", "data.object.id", "data.object.status")
RULES = {
    PAYMENT_INTENT_SUCCEEDED: Rule(Kind.CREDIT, _in_account(_read_payment_intent), Fields(
        "data.object.id", "data.object.metadata", "data.object.amount_received", "data.object.currency",
        "livemode", customer="data.object.customer")),
    CHARGE_REFUNDED: Rule(Kind.REFUNDED_TOTAL, _in_account(_read_charge_refunded), Fields(
        "data.object.payment_intent", None, "data.object.amount_refunded", "data.object.currency", "livemode")),
    **{refund_event: Rule(Kind.REFUND, read_refund, REFUND_LABELS) for refund_event in REFUND_EVENTS},
    DISPUTE_FUNDS_WITHDRAWN: Rule(Kind.DISPUTE, _in_account(_read_dispute(State.APPLIED)),
                                  REFUND_LABELS._replace(state=None)),
    DISPUTE_FUNDS_REINSTATED: Rule(Kind.DISPUTE, _in_account(_read_dispute(State.REVERSED)),
                                   REFUND_LABELS._replace(state=None)),
    **{session_event: Rule(Kind.CREDIT, _in_account(_read_checkout_session), CHECKOUT_SESSION_LABELS)
       for session_event in CHECKOUT_SESSION_EVENTS},
}


# -- thin events (docs/providers/stripe.md, "Thin events") --------------------------------------

THIN_OBJECT = "v2.core.event"
# The API version a thin event's related object is fetched in (Stripe-Version): the one the rules above read.
THIN_FETCH_VERSION = "2025-03-31.basil"
# Where Stripe's API retrieves each object a thin event's money is read from, by related_object.type.
THIN_OBJECTS = {"payment_intent": "/v1/payment_intents/", "charge": "/v1/charges/", "refund": "/v1/refunds/",
                "dispute": "/v1/disputes/", "checkout.session": "/v1/checkout/sessions/"}
# The lists a drain that is behind reads in pages (app/receiver/pages.py): List Events
# (https://docs.stripe.com/api/events/list) and each thin event's object type's list
# (https://docs.stripe.com/api/payment_intents/list, /api/charges/list, /api/refunds/list, /api/disputes/list,
# /api/checkout/sessions/list), 100 a page at most, newest first, `created[gte|lte]` and `starting_after` in each.
LISTS = {"event": "/v1/events", **{kind: path.rstrip("/") for kind, path in THIN_OBJECTS.items()}}
# An answer's bound for a page: 100 records, each an event or object of some kilobytes (one answer's bound is
# outbound.MAX_ANSWER_BYTES); a larger page is refused as unavailable, and its records are read one by one.
MAX_PAGE_BYTES = 8 * 1024 * 1024
# Stripe-Context's value: account ids, a path of them for an account below a connected one (docs.stripe.com/context).
# Each an account id, as ACCOUNT (Stripe-generated: MAX_ID_CHARS at most): the last is the account the keys are in
# (account_of).
_CONTEXT = re.compile(rf"acct_[A-Za-z0-9]{{1,{MAX_ID_CHARS - 5}}}(/acct_[A-Za-z0-9]{{1,{MAX_ID_CHARS - 5}}}){{0,3}}")


class Related(NamedTuple):
    """The object a thin event's money is read from: its type (a THIN_OBJECTS key), id and account context."""

    type: str
    id: str
    context: str | None


def is_thin(document: Mapping[str, Any]) -> bool:
    return document.get("object") == THIN_OBJECT


def parse_thin(document: dict[str, Any], body: bytes, source: str) -> Event:
    """A thin event (object v2.core.event): no data until its related object is fetched (with_related)."""
    event_id = text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    context = document.get("context")
    if context is not None and not (isinstance(context, str) and _CONTEXT.fullmatch(context)):
        raise InvalidEventError("'context' must be an account context (acct_..., or acct_.../acct_...)")
    if event_type in THIN_RULES:
        related = an_object(document.get("related_object"))
        if related.get("type") != THIN_RELATED[event_type]:
            raise InvalidEventError(f"'related_object.type' must be {THIN_RELATED[event_type]!r} in {event_type}")
        if not is_id(related.get("id")):
            raise InvalidEventError(f"'related_object.id' must be an id of 1 to {MAX_ID_CHARS} characters")
    return Event(event_id, event_type, {}, document, body, source)


def related_object(event: Event) -> Related | None:
    """What a thin event parse_thin returned moves money by; None for a type that moves none (meters, accounts)."""
    if event.type not in THIN_RULES:
        return None
    related = event.document["related_object"]
    return Related(related["type"], related["id"], event.document.get("context"))


def with_related(event: Event, obj: dict[str, Any]) -> Event:
    """The thin event with its related object's current state as data.object, as the snapshot rules read it."""
    document = {**event.document, "api_version": THIN_FETCH_VERSION}
    return Event(event.id, event.type, {"object": obj}, document, event.body, event.source)


def thin_sha256(event: Event) -> bytes:
    """What a thin event's copies compare by: its type and the object it names, in its account."""
    related = an_object(event.document.get("related_object"))
    names = ["thin", event.type, related.get("type"), related.get("id"), event.document.get("context")]
    return hashlib.sha256(json.dumps(names, separators=(",", ":")).encode()).digest()


def _read_thin_charge(event: Event) -> Fields | str | None:
    """The Charge's current total refunded; none left (its refunds failed since) moves nothing: their events say so."""
    if an_object(event.data.get("object")).get("amount_refunded") == 0:
        return None
    return _read_charge_refunded(event)


def _read_thin_dispute(floor: State | None) -> Callable[[Event], Fields | None]:
    """A Dispute's current state: its balance transactions show the funds withdrawn (negative) and reinstated
    (positive); floor is what the event's type itself says happened (funds_withdrawn, funds_reinstated)."""
    def read(event: Event) -> Fields | None:
        dispute = an_object(event.data.get("object"))
        moved = dispute.get("balance_transactions")
        amounts = [an_object(t).get("amount") for t in moved] if isinstance(moved, list) else []
        reinstated = floor == State.REVERSED or any(is_cents(a) for a in amounts)
        withdrawn = floor == State.APPLIED or any(isinstance(a, int) and a < 0 for a in amounts)
        if not (reinstated or withdrawn):
            return None  # no funds moved yet (an inquiry, a prevented dispute)
        return _read_dispute(State.REVERSED if reinstated else State.APPLIED)(event)
    return read


def _thin_labels(labels: Fields) -> Fields:
    return Fields(*(label.replace("data.object.", "related_object.") if isinstance(label, str) else label
                    for label in labels))


# Each thin type that moves money (its snapshot twin's name with "v1."): the related object's type, and the rule
# that reads the object's current state. A thin dispute type takes whichever step the dispute has reached.
_THIN = {
    "v1." + PAYMENT_INTENT_SUCCEEDED: ("payment_intent", RULES[PAYMENT_INTENT_SUCCEEDED]),
    "v1." + CHARGE_REFUNDED: ("charge", RULES[CHARGE_REFUNDED]._replace(read=_in_account(_read_thin_charge))),
    **{"v1." + refund_event: ("refund", Rule(Kind.REFUND, read_refund, REFUND_LABELS))
       for refund_event in REFUND_EVENTS},
    **{"v1.charge.dispute." + name: ("dispute", Rule(Kind.DISPUTE, _in_account(_read_thin_dispute(floor)),
                                                     REFUND_LABELS._replace(state=None)))
       for name, floor in (("created", None), ("updated", None), ("closed", None),
                           ("funds_withdrawn", State.APPLIED), ("funds_reinstated", State.REVERSED))},
    # A Session, fetched, is read as its snapshot is: a paid payment Session credits its PaymentIntent, the key its
    # v1.payment_intent.succeeded credits too (a subscription Session links: subscription_session_rule).
    **{"v1." + session_event: ("checkout.session", RULES[session_event]) for session_event in CHECKOUT_SESSION_EVENTS},
}
THIN_RELATED = {thin_type: related for thin_type, (related, _) in _THIN.items()}
THIN_RULES = {thin_type: rule._replace(labels=_thin_labels(rule.labels)) for thin_type, (_, rule) in _THIN.items()}
THIN_SUBSCRIPTION_SESSION = SUBSCRIPTION_SESSION._replace(labels=_thin_labels(SUBSCRIPTION_SESSION.labels))


# -- the API ------------------------------------------------------------------------------------

class API:
    """Stripe's API for one source: its base address and key (never in a repr, a log line or an answer)."""

    name = NAME

    def __init__(self, base: str, key: str, outbound: Outbound, budget: "Budget | None" = None) -> None:
        self.base = base
        self._authorization = f"Bearer {key}"
        self.outbound = outbound
        self.budget = budget  # the account's shared budget (app/providers/budget.py); None: unmetered

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event: Event) -> bytes | None:
        """The event's bytes as Stripe's API returns them, in the connected account it names (Stripe-Account) or the
        platform's own, or None when Stripe has no such event there (404)."""
        headers = {"Authorization": self._authorization}
        account = account_of(event)
        if is_account(account):  # parse checked a delivery's; a stored one's, replayed, is checked here
            headers["Stripe-Account"] = account
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            reply = self.outbound.request(SCHEME, "GET", f"{self.base}/v1/events/{quote(event.id, safe='')}",
                                          deadline, headers=headers, spend=self._spend("events"))
        return record(reply, NAME, "its event")

    def related(self, related: Related) -> bytes | None:
        """A thin event's related object as Stripe's API returns it now, in the event's account context
        (Stripe-Context), or None when Stripe has no such object there (404)."""
        headers = {"Authorization": self._authorization, "Stripe-Version": THIN_FETCH_VERSION}
        if related.context is not None:
            headers["Stripe-Context"] = related.context
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            reply = self.outbound.request(SCHEME, "GET", f"{self.base}{THIN_OBJECTS[related.type]}"
                                          f"{quote(related.id, safe='')}", deadline, headers=headers,
                                          spend=self._spend(related.type))
        return record(reply, NAME, f"its {related.type}")

    def page(self, listed: str, params: Sequence[tuple[str, str]], account: str | None = None,
             context: str | None = None) -> bytes:
        """One page of a Stripe list (LISTS' key: "event" for List Events, else a THIN_OBJECTS type) as Stripe's API
        returns it, as account (Stripe-Account, List Events) or in context (Stripe-Context, a thin event's objects,
        read in THIN_FETCH_VERSION as related() reads one); ProviderUnavailableError unless 200."""
        headers = {"Authorization": self._authorization}
        if listed != "event":
            headers["Stripe-Version"] = THIN_FETCH_VERSION
        if context is not None:
            headers["Stripe-Context"] = context
        elif account is not None:
            headers["Stripe-Account"] = account
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            reply = self.outbound.request(SCHEME, "GET", f"{self.base}{LISTS[listed]}?{urlencode(params)}", deadline,
                                          headers=headers, max_bytes=MAX_PAGE_BYTES,
                                          spend=self._spend(f"{listed}_list"))
        body = record(reply, NAME, f"a page of {LISTS[listed]}")
        if body is None:
            raise ProviderUnavailableError(f"{NAME} answered 404 for {LISTS[listed]}")
        return body

    def _spend(self, endpoint: str) -> "Spend | None":
        """Stripe counts each named operation as an endpoint: GET /v1/payment_intents/{id} for any id is one."""
        return None if self.budget is None else self.budget.on(endpoint)


# -- the provider -------------------------------------------------------------------------------

def parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """A thin event, or a snapshot event (its `account` checked)."""
    if is_thin(document):
        return parse_thin(document, body, source)
    check_account(document)
    return envelope(document, body, headers, source)


def _stored(event_id: str, event_type: str, document: dict[str, Any], fetched: bool, body: bytes,
            source: str) -> Event | None:
    """A stored thin event, with its related object when the row kept it (fetched)."""
    if event_type not in THIN_RULES:
        return None
    delivered = load(body) if fetched else document
    if not is_thin(delivered):
        return None
    thin = Event(event_id, event_type, {}, delivered, body, source)
    return with_related(thin, document) if fetched else thin


def _compared_by(event: Event) -> bytes | None:
    return thin_sha256(event) if is_thin(event.document) else None


def _subscription_or(rule: Rule) -> Rule:
    """rule, refined to SUBSCRIPTION_SESSION (THIN_SUBSCRIPTION_SESSION) for a subscription Session's event."""
    return rule._replace(refine=lambda event: subscription_session_rule(event) if is_subscription_session(event)
                         else rule)


def _needs_api(event: Event) -> bool:
    return is_thin(event.document) and related_object(event) is not None


class Records:
    """Stripe's API as the fetch step asks it: a thin event's related object, and with FETCH every event by id."""

    name = NAME

    def __init__(self, api: API, every_event: bool) -> None:
        self.api, self.every_event = api, every_event
        self._events = EventById(api, parse)

    def names(self, event: Event) -> str | None:
        if not is_thin(event.document):
            return self._events.names(event) if self.every_event else None
        related = related_object(event)
        if related is None:  # a type that moves no money (meters, accounts)
            return None
        where = f" in {related.context}" if related.context else ""
        return f"{related.type} {related.id}{where} (thin event {event.id})"

    def get(self, event: Event) -> bytes | None:
        related = related_object(event) if is_thin(event.document) else None
        return self._events.get(event) if related is None else self.api.related(related)

    def read(self, event: Event, body: bytes) -> Event:
        related = related_object(event) if is_thin(event.document) else None
        return self._events.read(event, body) if related is None else \
            with_related(event, related_document(body, related))


def related_document(body: bytes, related: Related) -> dict[str, Any]:
    """The object Stripe's API answered for related, or ProviderUnavailableError when it is not that object."""
    try:
        document = load(body)
    except InvalidJSONError as exc:
        raise ProviderUnavailableError(f"Stripe's API answered with a {related.type} that does not parse: {exc}") \
            from None
    if (document.get("object"), document.get("id")) != (related.type, related.id):
        raise ProviderUnavailableError(f"Stripe's API answered with another object than {related.type} {related.id}")
    return document


def _api(base: str, key: str, outbound: Outbound, budget: "Budget | None", every_event: bool) -> Records:
    return Records(API(base, key, outbound, budget), every_event)


def _event_list(api_key: str, base: str, key_setting: str, account: str | None, budget: "Budget | None") -> Any:
    from ..commands.stripe_list import StripeEvents  # stripe-python: imported by the commands that list alone
    return StripeEvents(api_key, base, key_setting, account, budget)


def _accounts(api_key: str, base: str, key_setting: str, budget: "Budget | None") -> list[str]:
    from ..commands.stripe_list import StripeAccounts
    return StripeAccounts(api_key, base, key_setting, budget).ids()


def _money_records(api_key: str, base: str, key_setting: str, account: str | None, metadata_key: str,
                   budget: "Budget | None") -> Any:
    from .stripe_audit import StripeBalance
    return StripeBalance(api_key, base, key_setting, account, metadata_key, budget)


_RULES = {name: _subscription_or(rule) if name in CHECKOUT_SESSION_EVENTS else rule for name, rule in RULES.items()}
_THIN_RULES = {name: (_subscription_or(rule) if name.removeprefix("v1.") in CHECKOUT_SESSION_EVENTS else rule)
               ._replace(compared_by=_compared_by) for name, rule in THIN_RULES.items()}
PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, sign, parse=parse,
                    rules=with_statuses({**_RULES, **_THIN_RULES}, REFUND_STATES), stored=_stored, api=_api,
                    api_base="https://api.stripe.com", needs_api=_needs_api,
                    event_list=_event_list, money_records=_money_records, accounts=_accounts, is_account=is_account,
                    account_prefix="acct_", account_words="acct_ then letters and digits",
                    events_key="a Stripe restricted key that may read Events",
                    money_key="a Stripe restricted key that may read Balance", payouts=True,
                    api_key_words="a key that may read Events", api_base_setting="STRIPE_API_BASE")
