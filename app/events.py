"""Parsing and validating an event body: pure functions, no I/O.

Every body is a JSON object with `type` (string) and `data` (object). The
event id is taken from what the scheme signs:
- hmac-sha256, stripe: the body's own `id`.
- standard-webhooks: the `webhook-id` header, signed with the body (the
  specification's payload has no id); an `id` in the body is ignored.
- github: a body with a `type` is in this service's own shape and uses its own `id`,
  so a replay under a new delivery id is still a duplicate. A body without
  one is GitHub's own: id from X-GitHub-Delivery, type from X-GitHub-Event,
  data the whole body. Those headers are not signed, so they never name a
  payment.
- razorpay: a body with a `type` is in this service's own shape, as under
  github. A body without one is Razorpay's own: type from its `event`, data
  its `payload`, id the x-razorpay-event-id header, a dot, and the first 32
  hex digits of the body's SHA-256. That header is not signed, so it is only
  a hint: alone it would let an old signed body, sent first under the id of
  an event yet to come, take that id and refuse the real event (409). Each
  movement is keyed by what the signed body names (the payment's, the
  refund's, the dispute's id), so a captured delivery replayed under another
  header is stored and moves nothing.
- paypal: a body with a `type` is in this service's own shape. A body without
  one is PayPal's own: id its `id` (WH-...), type its `event_type`, data its
  `resource`. Only its CRC32 is signed (app/signature.py), which anyone can
  match: the event is fetched from PayPal by its id (app/providers/) and its
  money read from PayPal's answer, parsed here the same way.

What each type does to the ledger is read by effect_of, from the fields
that RULES names per type (docs/providers.md has the table).
"""

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, NoReturn, Protocol, TypeGuard, cast

# The source of POST /api/webhooks; named sources are served on /api/webhooks/<name>.
DEFAULT_SOURCE = "default"
MAX_ID_CHARS = 128
# A Razorpay event id ends in this many hex digits of its body's SHA-256: 128
# bits, so no one can make a body that takes the id of one they have not seen.
RAZORPAY_DIGEST_HEX = 32
# The longest x-razorpay-event-id whose event id (header, dot, digest) fits MAX_ID_CHARS.
MAX_RAZORPAY_HEADER_CHARS = MAX_ID_CHARS - 1 - RAZORPAY_DIGEST_HEX
MAX_TYPE_CHARS = 64
PAYMENT_SUCCEEDED = "payment.succeeded"
PAYMENT_REFUNDED = "payment.refunded"
PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
CHARGE_REFUNDED = "charge.refunded"
# Stripe's Refund object, in each event that carries it (docs/providers.md).
REFUND_EVENTS = ("refund.created", "refund.updated", "refund.failed", "charge.refund.updated")
DISPUTE_FUNDS_WITHDRAWN = "charge.dispute.funds_withdrawn"
DISPUTE_FUNDS_REINSTATED = "charge.dispute.funds_reinstated"
# The first Stripe API version whose charge.refunded no longer counts an
# authorisation released by a partial capture or a cancellation.
STRIPE_BASIL = "2025-03-31"
# The rule effect_of hashes effects by; webhook_events.effect_version's default. Change
# both when the rule changes (the default in schema.sql and in a new migration):
# `flask init-db` then recomputes the stored effects (ledger.recompute_effects).
EFFECT_VERSION = 5
# user_balances.balance_cents is a BIGINT.
MAX_CENTS = 2**63 - 1
# How deep a body may nest, on every path alike: far below what Python's
# decoder manages on any stack (the live path's, replay's, verify's, about
# 900 levels), far above any provider's events (Stripe's nest under 10).
MAX_DEPTH = 64
# What an event of this service's own shape that names no currency reads as:
# the ledger's, LEDGER_CURRENCY, put in by effect_of.
LEDGERS_CURRENCY = "(the ledger's)"


class InvalidJSONError(ValueError):
    """The body is not a UTF-8 JSON object."""


class InvalidEventError(ValueError):
    """The body is JSON, but id/type/data are missing or of the wrong type."""


class UnprocessableError(ValueError):
    """Authentic and well-formed, but the business effect cannot apply."""


class StoredBodyError(ValueError):
    """A stored event's bytes are missing, do not match their hash, or no longer parse."""


class Headers(Protocol):
    """What parse reads of a request's headers: a dict's or Werkzeug's Headers' get()."""

    def get(self, key: str, /) -> str | None: ...


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    data: dict[str, Any]
    document: dict[str, Any]  # the whole body, parsed
    body: bytes  # the bytes received: the event of record
    source: str = DEFAULT_SOURCE  # with id, what identifies the event


class Kind(StrEnum):
    """What an event moves (apply_event's p_kind); REFUND and DISPUTE are also movements.kind."""

    CREDIT = "credit"  # credits a payment to its user, once per payment
    REFUNDED_TOTAL = "refunded_total"  # a running total of the payment's refunds: the highest one counts
    REFUND = "refund"  # a refund object: taken once when counted, given back once when it failed
    DISPUTE = "dispute"  # a dispute: its funds withdrawn once, reinstated once


class State(StrEnum):
    """What an event says of a refund or a dispute (movements.state): states only move forward."""

    APPLIED = "applied"  # a refund counted (pending, requires_action, succeeded), a dispute's funds withdrawn
    REVERSED = "reversed"  # a refund failed or canceled, a dispute's funds reinstated


@dataclass(frozen=True)
class Effect:
    """What applying an event does to the ledger, read from its fields (effect_of).

    kind is None for an event with no balance effect, and for one whose
    effect cannot apply (problem says why: answered 422). sha256 is what two
    deliveries of one event id are compared by.
    """

    kind: Kind | None
    payment_id: str | None = None
    user_id: uuid.UUID | None = None  # a credit's; every other movement's user is its payment's
    amount_cents: int | None = None  # a credit's amount, a running total, or a refund's or dispute's amount
    currency: str | None = None
    problem: str | None = None
    sha256: bytes = b""
    movement_id: str | None = None  # a refund's or a dispute's id
    state: State | None = None  # what the event says of that refund or dispute
    # The setting that refuses it (its problem) under the policy it was read
    # with: the bytes would apply under another value. Its sha256 is that of
    # the effect that applies, so a retry or a replay applies it once the
    # setting allows.
    setting: str | None = None
    # A credit whose user_id is None: the customer whose link (customer_links)
    # names its user, and what it gets if none does (money.sql decides).
    customer_id: str | None = None
    users: "Users | None" = None


class NoUser(StrEnum):
    """What a payment that names no user (no metadata, no linked customer) gets: WEBHOOK_<NAME>_NO_USER."""

    REFUSE = "refuse"  # 422, recorded failed: a retry or a replay applies it once a link names its user
    IGNORE = "ignore"  # 2xx, recorded ignored (not ours): its refunds and disputes are ignored too


@dataclass(frozen=True)
class Users:
    """How one source's payments name their user: the metadata key read, and what a payment naming none gets."""

    metadata_key: str = "user_id"
    no_user: NoUser = NoUser.REFUSE
    setting: str = "WEBHOOK_USER_METADATA_KEY"  # the setting of metadata_key, named in a refusal


DEFAULT_USERS = Users()


@dataclass(frozen=True)
class Policy:
    """What the ledger accepts beyond the event's shape (LEDGER_CURRENCY, STRIPE_ACCEPT_TEST_EVENTS, and per
    source how a payment names its user)."""

    currency: str = "usd"
    accept_test_events: bool = False
    users: Mapping[str, Users] = field(default_factory=dict)  # by event source; DEFAULT_USERS for any other

    def users_of(self, source: str) -> Users:
        return self.users.get(source, DEFAULT_USERS)


DEFAULT_POLICY = Policy()


def _reject_constant(name: str) -> NoReturn:
    raise InvalidJSONError(f"{name} is not valid JSON")


def load(body: bytes) -> dict[str, Any]:
    """Return the JSON object in body, or raise InvalidJSONError: the live path's and replay's one decoder."""
    try:
        document = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidJSONError("body is not valid UTF-8") from None
    except RecursionError:
        raise InvalidJSONError(f"body is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, over-long integers, NaN
        raise InvalidJSONError("body is not valid JSON") from exc
    if not isinstance(document, dict):
        raise InvalidJSONError("body must be a JSON object")
    # A body with fewer brackets than the limit cannot nest deeper: most are
    # decided by two counts in C, without a walk.
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(document) > MAX_DEPTH:
        raise InvalidJSONError(f"body is nested more than {MAX_DEPTH} levels deep")
    return document


def _depth(document: object) -> int:
    """How many objects and arrays deep document nests (iterative: no stack of its own)."""
    deepest, todo = 0, [(document, 1)]
    while todo:
        value, depth = todo.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:  # past the limit, the answer is known
                todo.extend((child, depth + 1) for child in children)
    return deepest


def parse(body: bytes, scheme: str = "hmac-sha256", headers: Headers | None = None,
          source: str = DEFAULT_SOURCE) -> Event:
    """Return the event in body (and, per scheme, headers), or raise InvalidJSONError / InvalidEventError."""
    document = load(body)
    headers = {} if headers is None else headers
    if scheme == "github" and "type" not in document:
        return _github_event(document, body, headers, source)
    if scheme == "razorpay" and "type" not in document:
        return _razorpay_event(document, body, headers, source)
    if scheme == "paypal" and "type" not in document:
        return _paypal_event(document, body, source)
    if scheme == "standard-webhooks":
        event_id = _text(headers.get("webhook-id"), "the webhook-id header", MAX_ID_CHARS)
    else:
        event_id = _text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = _text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    return Event(event_id, event_type, _data_field(document), document, body, source)


def stored_event(source: str, event_id: str, event_type: str, body: bytes | None,
                 body_sha256: bytes | None, fetched: bytes | None = None) -> Event:
    """Rebuild the Event of a stored row from its bytes (for replay and verify): parse's inverse.

    The bytes are checked against their SHA-256 and decoded by the live
    path's own function, so that both decide alike; StoredBodyError says why
    they cannot be. The id and type are the row's, as first parsed: a
    signature scheme may take them from headers rather than the body (and a
    GitHub event's data is its whole body). fetched, the provider's bytes of
    the event (a fetching source, app/providers/), is what it is read from
    when kept; body stays its bytes of record.
    """
    if body is None:
        raise StoredBodyError("its bytes were not kept (stored by the release before sources)")
    if body_sha256 is not None and hashlib.sha256(body).digest() != bytes(body_sha256):
        raise StoredBodyError("its stored bytes do not match their SHA-256")
    try:
        document = load(body if fetched is None else bytes(fetched))
    except InvalidJSONError as exc:
        raise StoredBodyError(f"its stored bytes do not parse: {exc}") from None
    data = document["data"] if isinstance(document.get("data"), dict) else document
    return Event(id=event_id, type=event_type, data=data, document=document, body=body, source=source)


def _github_event(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    event_type = _text(headers.get("X-GitHub-Event"), "the X-GitHub-Event header", MAX_TYPE_CHARS)
    if event_type in RULES:
        raise InvalidEventError("a payment must name its type in the signed body, not in the X-GitHub-Event header")
    event_id = _text(headers.get("X-GitHub-Delivery"), "the X-GitHub-Delivery header", MAX_ID_CHARS)
    return Event(event_id, event_type, document, document, body, source)


def _razorpay_event(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    event_type = _text(document.get("event"), "'event'", MAX_TYPE_CHARS)
    payload = document.get("payload")
    if not isinstance(payload, dict):
        raise InvalidEventError("'payload' must be an object")
    header_id = _text(headers.get("x-razorpay-event-id"), "the x-razorpay-event-id header", MAX_RAZORPAY_HEADER_CHARS)
    # The header is not signed: the body's digest binds the id to the signed bytes.
    event_id = f"{header_id}.{hashlib.sha256(body).hexdigest()[:RAZORPAY_DIGEST_HEX]}"
    return Event(event_id, event_type, payload, document, body, source)


def _paypal_event(document: dict[str, Any], body: bytes, source: str) -> Event:
    event_id = _text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = _text(document.get("event_type"), "'event_type'", MAX_TYPE_CHARS)
    resource = document.get("resource")
    if not isinstance(resource, dict):
        raise InvalidEventError("'resource' must be an object")
    return Event(event_id, event_type, resource, document, body, source)


def _text(value: object, label: str, max_chars: int) -> str:
    if value is None:
        raise InvalidEventError(f"{label} is missing")
    if not isinstance(value, str):
        raise InvalidEventError(f"{label} must be a string")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEventError(f"{label} must be 1 to {max_chars} characters")
    if not _storable(value):
        raise InvalidEventError(f"{label} contains characters that cannot be stored")
    return value


def _storable(value: str) -> bool:
    """PostgreSQL text cannot hold NUL; a lone surrogate is not encodable."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def _data_field(document: dict[str, Any]) -> dict[str, Any]:
    data = document.get("data")
    if not isinstance(data, dict):
        raise InvalidEventError("'data' must be an object")
    return data


# Fields of the types _problem has just checked (for the type checker; built once, not per event).
_CheckedFields = tuple[str, "str | Metadata | None", int, str, object, str | None, State | None, str | None]


def effect_of(event: Event, policy: Policy = DEFAULT_POLICY) -> Effect:
    """What applying event does to the ledger under policy (never raises: a refusal is the Effect's problem).

    A refusal by a setting (Effect.setting) hashes as the effect that
    applies, so that the same bytes compare equal once the setting allows
    them. (A currency the event leaves implied is the policy's, as if named:
    the only value of the policy in a hash, and one no setting refuses.)
    """
    rule = RULES.get(event.type)
    fields = rule.read(event) if rule else None
    if rule is None or fields is None:  # a type, or an event, that moves no money
        return Effect(None, sha256=_sha256([event.type]))
    if not isinstance(fields, str) and fields.currency == LEDGERS_CURRENCY:
        # Compared as the ledger's currency named: the same credit as one that names it.
        fields = fields._replace(currency=policy.currency)
    problem = fields if isinstance(fields, str) else _problem(rule, fields)
    # A refused effect never compares equal to one that applies, however
    # close their values (a null currency is refused, a missing one implied).
    sha256 = _sha256([event.type, "refused" if problem else "applies",
                      *([fields] if isinstance(fields, str) else fields)])
    if problem:
        return Effect(None, problem=problem, sha256=sha256)
    payment_id, user_id, amount, currency, livemode, movement_id, state, customer = cast(_CheckedFields, fields)
    setting, problem = _refused_by(rule, livemode, currency, policy)
    users, user = None, cast(object, user_id)
    if isinstance(user_id, Metadata):  # which key names the user is a setting: read after the hash
        users = policy.users_of(event.source)
        user = _uuid(user_id.get(users.metadata_key))
        if user is not None and not _is_uuid(user) and not problem:
            setting, problem = users.setting, \
                f"data.object.metadata.{users.metadata_key} must be a user's UUID ({users.setting})"
    return Effect(rule.kind, payment_id, uuid.UUID(user) if _is_uuid(user) else None, amount, currency,
                  problem=problem, sha256=sha256, movement_id=movement_id, state=state, setting=setting,
                  customer_id=customer, users=users)


def _sha256(values: list[object]) -> bytes:
    return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).digest()


class Fields(NamedTuple):
    """What an event's effect reads, as sent but normalised: a UUID in its canonical spelling, a currency
    in lower case, the ledger's currency where the event's type implies it, a value that cannot be read
    (a float amount, a number id) left as it came, so that it is refused and differs from any that applies."""

    payment_id: object
    user_id: object  # a credit's; None for every other movement (its user is the payment's)
    amount: object  # a credit's amount, a running total, or a refund's or dispute's amount
    currency: object
    livemode: object  # Stripe's; None for this service's own shape, which has no test mode
    movement_id: object = None  # a refund's or a dispute's id; None for a credit or a running total
    state: object = None  # a State for a refund or a dispute, or what was sent when it names none
    customer: object = None  # a PaymentIntent's customer (Stripe's cus_...), whose link may name its user


class Metadata(dict[str, Any]):
    """A PaymentIntent's metadata, whole, in its Fields: which key names the user is a per-source setting
    (Users.metadata_key), so the effect is hashed by all of it, and the key is read after."""


class Rule(NamedTuple):
    kind: Kind
    # Fields; None when this event moves no money (an authorisation released,
    # never captured); a str when it cannot apply for a reason the fields
    # alone do not say (the 422's message).
    read: Callable[[Event], Fields | str | None]
    labels: Fields  # where each field is read from, for the 422's message


def _uuid(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _currency_or_ledgers(data: dict[str, Any]) -> object:
    """This service's own shape may omit the currency: it is then the ledger's."""
    return _lower(data["currency"]) if "currency" in data else LEDGERS_CURRENCY


def _read_payment(event: Event) -> Fields:
    data = event.data
    # Without a paymentId, each event is its own payment.
    payment_id = data["paymentId"] if "paymentId" in data else event.id
    currency = _currency_or_ledgers(data)
    return Fields(payment_id, _uuid(data.get("userId")), data.get("amountCents"), currency, None)


def _read_payment_refunded(event: Event) -> Fields:
    data = event.data
    currency = _currency_or_ledgers(data)
    return Fields(data.get("paymentId"), None, data.get("amountRefundedCents"), currency, None)


def _read_payment_intent(event: Event) -> Fields:
    """Its user is named by its metadata (Checkout: payment_intent_data.metadata), else by its customer's link
    (Billing's invoice PaymentIntents carry no subscription metadata, but name the customer)."""
    intent = _object(event.data.get("object"))
    metadata = Metadata(_object(intent.get("metadata")))
    return Fields(intent.get("id"), metadata, intent.get("amount_received"), _lower(intent.get("currency")),
                  _livemode(event), customer=intent.get("customer"))


def _read_charge_refunded(event: Event) -> Fields | str | None:
    """The Charge's total refunded, of what was captured.

    Before API version 2025-03-31.basil, a partial capture or a cancellation
    counts the authorisation it releases in amount_refunded (and sends
    charge.refunded); since, it does not. A charge never captured moved no
    money. A charge without amount_captured (older API versions) is read
    as captured whole unless `captured` is false.
    """
    charge = _object(event.data.get("object"))
    total, amount, captured = charge.get("amount_refunded"), charge.get("amount"), charge.get("amount_captured")
    if captured is None and charge.get("captured") is False or captured == 0 and _is_cents(captured, zero=True):
        return None
    if _is_cents(total) and _is_cents(amount) and _is_cents(captured) and captured < amount:
        before_basil = _stripe_before(event.document.get("api_version"), STRIPE_BASIL)
        if before_basil is None:
            return "api_version must name a Stripe API version to read the refunds of a partially captured charge"
        if before_basil:
            total -= amount - captured
            if total <= 0:
                return None  # only the released authorisation
    return Fields(charge.get("payment_intent"), None, total, _lower(charge.get("currency")), _livemode(event))


# A Refund's status -> what it says of the refund (Stripe's Refund object).
REFUND_STATES = {"pending": State.APPLIED, "requires_action": State.APPLIED, "succeeded": State.APPLIED,
                 "failed": State.REVERSED, "canceled": State.REVERSED}


def _read_refund(event: Event) -> Fields | None:
    refund = _object(event.data.get("object"))
    if refund.get("reason") == "expired_uncaptured_charge":
        return None  # Stripe's own, for an authorisation that expired uncaptured: no money moved
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_intent"), None, refund.get("amount"), _lower(refund.get("currency")),
                  _livemode(event), refund.get("id"), state)


def _read_dispute(state: State) -> Callable[[Event], Fields]:
    def read(event: Event) -> Fields:
        dispute = _object(event.data.get("object"))
        return Fields(dispute.get("payment_intent"), None, dispute.get("amount"), _lower(dispute.get("currency")),
                      _livemode(event), dispute.get("id"), state)
    return read


# -- Razorpay (docs/providers.md): entities under payload.<name>.entity, amounts
# in the currency's subunits, no test mode in the body (test and live keys differ).

def _razorpay_entity(event: Event, name: str) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return _object(_object(_object(event.document.get("payload")).get(name)).get("entity"))


def _read_razorpay_payment(event: Event) -> Fields:
    """payment.captured and order.paid: the same payment, credited once by its id."""
    payment = _razorpay_entity(event, "payment")
    user_id = _uuid(_object(payment.get("notes")).get("user_id"))  # notes is [] when empty
    return Fields(payment.get("id"), user_id, payment.get("amount"), _lower(payment.get("currency")), None)


# A Razorpay Refund's status -> what it says of the refund (Razorpay's Refund entity).
RAZORPAY_REFUND_STATES = {"pending": State.APPLIED, "processed": State.APPLIED, "failed": State.REVERSED}


def _read_razorpay_refund(event: Event) -> Fields:
    refund = _razorpay_entity(event, "refund")
    status = refund.get("status")
    state = RAZORPAY_REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(refund.get("payment_id"), None, refund.get("amount"), _lower(refund.get("currency")), None,
                  refund.get("id"), state)


def _read_either_refund(event: Event) -> Fields | None:
    """refund.created and refund.failed are Stripe's and Razorpay's names: read in the shape they came in."""
    return _read_razorpay_refund(event) if _is_razorpay(event.document) else _read_refund(event)


def _is_razorpay(document: dict[str, Any]) -> bool:
    return "type" not in document and isinstance(document.get("payload"), dict)


def _read_razorpay_dispute(state: State) -> Callable[[Event], Fields]:
    """Razorpay deducts a dispute's amount when it is lost (amount_deducted), and gives nothing back before."""
    def read(event: Event) -> Fields:
        dispute = _razorpay_entity(event, "dispute")
        return Fields(dispute.get("payment_id"), None, dispute.get("amount"), _lower(dispute.get("currency")), None,
                      dispute.get("id"), state)
    return read


# -- decimal amounts (PayPal's {"currency_code": "USD", "value": "21.00"}) ---------

# ISO 4217 minor-unit exponents other than 2 (https://www.six-group.com/en/products-services/financial-information/
# data-standards.html, list one). Upper case, as the standard and PayPal write the codes.
CURRENCY_EXPONENTS = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
                     "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
# PayPal's Money.value pattern (digits, or digits around one point, up to 32 characters), less its sign:
# an amount paid or refunded is never negative.
_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?|()\.([0-9]+)")


def minor_units(value: object, currency: object) -> int | None:
    """A decimal string in currency's minor units by its ISO 4217 exponent, exactly, or None.

    Text arithmetic, never a float: "21.00" USD is 2100, "500" JPY is 500,
    "1.234" KWD is 1234. A value with more significant decimals than the
    currency has ("0.001" USD, "1.5" JPY), not a plain decimal string, or
    beyond a BIGINT is None (refused).
    """
    if not isinstance(value, str) or not isinstance(currency, str) or len(value) > 32:
        return None
    match = _DECIMAL.fullmatch(value)
    if match is None:
        return None
    exponent = CURRENCY_EXPONENTS.get(currency.upper(), 2)
    whole = match.group(1) if match.group(1) is not None else "0"
    fraction = (match.group(2) or match.group(4) or "").rstrip("0")
    if len(fraction) > exponent:
        return None
    units = int(whole + fraction.ljust(exponent, "0"))
    return units if units <= MAX_CENTS else None


# -- PayPal (docs/providers.md): the resource of each event (a Capture, a Refund, a Dispute), amounts in
# PayPal's Money object; no test mode in the body (sandbox and live are separate webhooks, with their ids).

def _paypal_resource(event: Event) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return _object(event.document.get("resource"))


def _paypal_money(money: object, label: str) -> tuple[object, object, str | None]:
    """A Money object's amount in minor units and its currency (lower case), or why the amount is not exact.

    A value that is not a string, or a currency that is no code, is left as
    sent: _problem names it. A value that does not convert exactly is the 422.
    """
    value, code = _object(money).get("value"), _object(money).get("currency_code")
    units = minor_units(value, code)
    if units is None and isinstance(value, str) and isinstance(code, str) and _CURRENCY.fullmatch(code.lower()):
        exponent = CURRENCY_EXPONENTS.get(code.upper(), 2)
        return value, code.lower(), (f"{label}.value must be a decimal amount of {code.upper()} exact in its minor "
                                     f"units ({exponent} decimals), got {value[:40]!r}")
    return (value if units is None else units), _lower(code), None


def _read_paypal_capture(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.COMPLETED: the Capture, credited once by its id, to the user its custom_id names."""
    capture = _paypal_resource(event)
    amount, currency, problem = _paypal_money(capture.get("amount"), "resource.amount")
    return problem or Fields(capture.get("id"), _uuid(capture.get("custom_id")), amount, currency, None)


# A PayPal Refund's status -> what it says of the refund (Payments v2, the refund's `status`).
PAYPAL_REFUND_STATES = {"PENDING": State.APPLIED, "COMPLETED": State.APPLIED, "FAILED": State.REVERSED,
                        "CANCELLED": State.REVERSED}
# A Refund's capture: its `up` link, https://api.paypal.com/v2/payments/captures/<capture id>.
_CAPTURE_LINK = re.compile(r"https://[^/]+/v2/payments/captures/([^/?#]+)")


def _read_paypal_refund(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.REFUNDED and .REVERSED: a Refund of a capture, keyed by its own id, its amount debited."""
    refund = _paypal_resource(event)
    amount, currency, problem = _paypal_money(refund.get("amount"), "resource.amount")
    if problem:
        return problem
    links = refund.get("links")
    ups = [link.get("href") for link in links if isinstance(link, dict) and link.get("rel") == "up"] \
        if isinstance(links, list) else []
    capture = _CAPTURE_LINK.fullmatch(ups[0]) if len(ups) == 1 and isinstance(ups[0], str) else None
    status = refund.get("status")
    state = PAYPAL_REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(capture[1] if capture else None, None, amount, currency, None, refund.get("id"), state)


# A resolved Dispute's outcome -> what it does to its funds (Disputes v1, dispute_outcome.outcome_code): the
# buyer's win takes the disputed amount, the seller's (or none taken from the seller) gives back what was taken.
PAYPAL_DISPUTE_OUTCOMES = {"RESOLVED_BUYER_FAVOUR": State.APPLIED, "ACCEPTED": State.APPLIED,
                           "RESOLVED_SELLER_FAVOUR": State.REVERSED, "DENIED": State.REVERSED,
                           "CANCELED_BY_BUYER": State.REVERSED, "RESOLVED_WITH_PAYOUT": State.REVERSED}


def _read_paypal_dispute(event: Event) -> Fields | str:
    """CUSTOMER.DISPUTE.RESOLVED: lost, it takes dispute_amount from its transaction's payment once; won, nothing,
    or back what a loss took. Created and updated move nothing, as Razorpay's disputes before they are lost."""
    dispute = _paypal_resource(event)
    outcome = _object(dispute.get("dispute_outcome")).get("outcome_code")
    state = PAYPAL_DISPUTE_OUTCOMES.get(outcome) if isinstance(outcome, str) else None
    if state is None:
        return f"resource.dispute_outcome.outcome_code must be one of {', '.join(PAYPAL_DISPUTE_OUTCOMES)}"
    transactions = dispute.get("disputed_transactions")
    if not isinstance(transactions, list) or len(transactions) != 1:
        return "resource.disputed_transactions must name exactly one transaction"
    amount, currency, problem = _paypal_money(dispute.get("dispute_amount"), "resource.dispute_amount")
    return problem or Fields(_object(transactions[0]).get("seller_transaction_id"), None, amount, currency, None,
                             dispute.get("dispute_id"), state)


def _livemode(event: Event) -> bool:
    return event.document.get("livemode") is True


def _stripe_before(api_version: object, version: str) -> bool | None:
    """Whether a Stripe API version ("2024-06-20", "2025-03-31.basil") is older than version; None if unreadable."""
    if not isinstance(api_version, str) or not _API_VERSION.fullmatch(api_version):
        return None
    return api_version[:10] < version


_API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}(\.[a-z]+)?")


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_cents(value: object, zero: bool = False) -> TypeGuard[int]:
    """Whether value is a number of cents a BIGINT holds (bool is an int in Python; True is not one cent)."""
    return isinstance(value, int) and not isinstance(value, bool) and (0 if zero else 1) <= value <= MAX_CENTS


def _problem(rule: Rule, fields: Fields) -> str | None:
    """Why an effect with these fields cannot apply whatever the settings (a 422's message), or None."""
    labels = rule.labels
    if not (isinstance(fields.currency, str) and _CURRENCY.fullmatch(fields.currency)):
        return f"{labels.currency} must be a currency's three-letter code"
    if not _is_id(fields.payment_id):
        return f"{labels.payment_id} must be a payment id of 1 to {MAX_ID_CHARS} characters"
    if rule.kind == Kind.CREDIT and not (isinstance(fields.user_id, Metadata) or _is_uuid(fields.user_id)):
        return f"{labels.user_id} must be a user's UUID"
    if fields.customer is not None and not _is_id(fields.customer):
        return f"{labels.customer} must be a customer id of 1 to {MAX_ID_CHARS} characters"
    if not _is_cents(fields.amount):
        if isinstance(fields.amount, int) and not isinstance(fields.amount, bool) and fields.amount > MAX_CENTS:
            return f"{labels.amount} must be at most {MAX_CENTS} (a balance's BIGINT)"
        return f"{labels.amount} must be a positive integer"
    if rule.kind in (Kind.REFUND, Kind.DISPUTE):
        if not _is_id(fields.movement_id):
            return f"{labels.movement_id} must be an id of 1 to {MAX_ID_CHARS} characters"
        if not isinstance(fields.state, State):
            return f"{labels.state} must be one of {', '.join(REFUND_STATES)}"
    return None


def _refused_by(rule: Rule, livemode: object, currency: str, policy: Policy) -> tuple[str | None, str | None]:
    """The setting that refuses an effect under policy, and why (a 422's message); (None, None) if none does."""
    if livemode is False and not policy.accept_test_events:
        return "STRIPE_ACCEPT_TEST_EVENTS", \
            "a test-mode event (livemode is not true); set STRIPE_ACCEPT_TEST_EVENTS=true to accept"
    # A credit must be in the ledger's currency; every other movement in its
    # payment's (apply_event checks), which an earlier release may have
    # credited in another.
    if rule.kind == Kind.CREDIT and currency != policy.currency:
        return "LEDGER_CURRENCY", f"{rule.labels.currency} must be the ledger's currency, {policy.currency!r}"
    return None, None


_CURRENCY = re.compile(r"[a-z]{3}")


def _is_id(value: object) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= MAX_ID_CHARS and _storable(value)


def _is_uuid(value: object) -> TypeGuard[str]:
    """Whether value is a UUID in its canonical spelling (as _uuid leaves every UUID)."""
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


_STRIPE_REFUND = Fields("data.object.payment_intent", None, "data.object.amount", "data.object.currency",
                        "livemode", "data.object.id", "data.object.status")
_STRIPE_DISPUTE = _STRIPE_REFUND._replace(state=None)
_RAZORPAY_PAYMENT = Fields("payload.payment.entity.id", "payload.payment.entity.notes.user_id",
                           "payload.payment.entity.amount", "payload.payment.entity.currency", None)
_RAZORPAY_REFUND = Fields("payload.refund.entity.payment_id", None, "payload.refund.entity.amount",
                          "payload.refund.entity.currency", None, "payload.refund.entity.id",
                          "payload.refund.entity.status")
_RAZORPAY_DISPUTE = Fields("payload.dispute.entity.payment_id", None, "payload.dispute.entity.amount",
                           "payload.dispute.entity.currency", None, "payload.dispute.entity.id", None)
# refund.created and refund.failed are both Stripe's and Razorpay's: their 422 names the fields of each.
_EITHER_REFUND = Fields(*(f"{stripe} (Stripe) or {razorpay} (Razorpay)" if stripe and razorpay else stripe
                          for stripe, razorpay in zip(_STRIPE_REFUND, _RAZORPAY_REFUND, strict=True)))
RAZORPAY_PAYMENT_EVENTS = ("payment.captured", "order.paid")
RAZORPAY_REFUND_EVENTS = ("refund.processed",)
EITHER_REFUND_EVENTS = ("refund.created", "refund.failed")  # Stripe's names too
RAZORPAY_DISPUTE_LOST = "payment.dispute.lost"
RAZORPAY_DISPUTE_WON = "payment.dispute.won"
_PAYPAL_REFUND = Fields("resource.links[rel=up] (the capture's URL)", None, "resource.amount.value",
                        "resource.amount.currency_code", None, "resource.id", "resource.status")
PAYPAL_CAPTURE_COMPLETED = "PAYMENT.CAPTURE.COMPLETED"
PAYPAL_REFUND_EVENTS = ("PAYMENT.CAPTURE.REFUNDED", "PAYMENT.CAPTURE.REVERSED")
PAYPAL_DISPUTE_RESOLVED = "CUSTOMER.DISPUTE.RESOLVED"  # CUSTOMER.DISPUTE.CREATED and .UPDATED move nothing

# Keyed by type, not by scheme: the names do not collide, so a Stripe event
# relayed by another sender still applies.
RULES = {
    PAYMENT_SUCCEEDED: Rule(Kind.CREDIT, _read_payment, Fields(
        "data.paymentId", "data.userId", "data.amountCents", "data.currency", None)),
    PAYMENT_REFUNDED: Rule(Kind.REFUNDED_TOTAL, _read_payment_refunded, Fields(
        "data.paymentId", None, "data.amountRefundedCents", "data.currency", None)),
    PAYMENT_INTENT_SUCCEEDED: Rule(Kind.CREDIT, _read_payment_intent, Fields(
        "data.object.id", "data.object.metadata", "data.object.amount_received", "data.object.currency",
        "livemode", customer="data.object.customer")),
    CHARGE_REFUNDED: Rule(Kind.REFUNDED_TOTAL, _read_charge_refunded, Fields(
        "data.object.payment_intent", None, "data.object.amount_refunded", "data.object.currency", "livemode")),
    **{refund_event: Rule(Kind.REFUND, _read_refund, _STRIPE_REFUND) for refund_event in REFUND_EVENTS},
    **{refund_event: Rule(Kind.REFUND, _read_either_refund, _EITHER_REFUND) for refund_event in EITHER_REFUND_EVENTS},
    DISPUTE_FUNDS_WITHDRAWN: Rule(Kind.DISPUTE, _read_dispute(State.APPLIED), _STRIPE_DISPUTE),
    DISPUTE_FUNDS_REINSTATED: Rule(Kind.DISPUTE, _read_dispute(State.REVERSED), _STRIPE_DISPUTE),
    **{paid: Rule(Kind.CREDIT, _read_razorpay_payment, _RAZORPAY_PAYMENT) for paid in RAZORPAY_PAYMENT_EVENTS},
    **{refund: Rule(Kind.REFUND, _read_razorpay_refund, _RAZORPAY_REFUND) for refund in RAZORPAY_REFUND_EVENTS},
    RAZORPAY_DISPUTE_LOST: Rule(Kind.DISPUTE, _read_razorpay_dispute(State.APPLIED), _RAZORPAY_DISPUTE),
    RAZORPAY_DISPUTE_WON: Rule(Kind.DISPUTE, _read_razorpay_dispute(State.REVERSED), _RAZORPAY_DISPUTE),
    PAYPAL_CAPTURE_COMPLETED: Rule(Kind.CREDIT, _read_paypal_capture, Fields(
        "resource.id", "resource.custom_id", "resource.amount.value", "resource.amount.currency_code", None)),
    **{refund: Rule(Kind.REFUND, _read_paypal_refund, _PAYPAL_REFUND) for refund in PAYPAL_REFUND_EVENTS},
    PAYPAL_DISPUTE_RESOLVED: Rule(Kind.DISPUTE, _read_paypal_dispute, Fields(
        "resource.disputed_transactions[0].seller_transaction_id", None, "resource.dispute_amount.value",
        "resource.dispute_amount.currency_code", None, "resource.dispute_id", "resource.dispute_outcome")),
}
