"""Parsing and validating an event body: pure functions, no I/O.

Every body is a JSON object with `type` (string) and `data` (object). The
event id is taken from what the scheme signs:
- hmac-sha256, stripe: the body's own `id`.
- standard-webhooks: the `webhook-id` header, signed with the body (the
  specification's payload has no id); an `id` in the body is ignored.
- github: a body with a `type` is in the seed's shape and uses its own `id`,
  so a replay under a new delivery id is still a duplicate. A body without
  one is GitHub's own: id from X-GitHub-Delivery, type from X-GitHub-Event,
  data the whole body. Those headers are not signed, so they never name a
  payment.
"""

import functools
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

MAX_ID_CHARS = 128
MAX_TYPE_CHARS = 64
PAYMENT_SUCCEEDED = "payment.succeeded"
PAYMENT_INTENT_SUCCEEDED = "payment_intent.succeeded"
# user_balances.balance_cents is a BIGINT.
MAX_CENTS = 2**63 - 1


class InvalidJSON(ValueError):
    """The body is not a UTF-8 JSON object."""


class InvalidEvent(ValueError):
    """The body is JSON, but id/type/data are missing or of the wrong type."""


class Unprocessable(ValueError):
    """Authentic and well-formed, but the business effect cannot apply."""


class StoredBodyError(ValueError):
    """A stored event's bytes are missing, do not match their hash, or no longer parse."""


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    data: dict
    document: dict  # the whole body, parsed
    body: bytes  # the bytes received: the event of record
    source: str = "default"  # with id, what identifies the event

    @functools.cached_property
    def effect(self) -> bytes:
        """effect_of(self), computed once."""
        return effect_of(self)


@dataclass(frozen=True)
class Credit:
    user_id: uuid.UUID
    amount_cents: int


@dataclass(frozen=True)
class Policy:
    """What the ledger accepts beyond the event's shape (LEDGER_CURRENCY, STRIPE_ACCEPT_TEST_EVENTS)."""

    currency: str = "usd"
    accept_test_events: bool = False


DEFAULT_POLICY = Policy()


def _reject_constant(name):
    raise InvalidJSON(f"{name} is not valid JSON")


def load(body: bytes) -> dict:
    """Return the JSON object in body, or raise InvalidJSON: the live path's and replay's one decoder."""
    try:
        document = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidJSON("body is not valid UTF-8") from None
    except RecursionError:
        raise InvalidJSON("body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, over-long integers, NaN
        raise InvalidJSON("body is not valid JSON") from exc
    if not isinstance(document, dict):
        raise InvalidJSON("body must be a JSON object")
    return document


def parse(body: bytes, scheme: str = "hmac-sha256", headers=None, source: str = "default") -> Event:
    """Return the event in body (and, per scheme, headers), or raise InvalidJSON / InvalidEvent."""
    document = load(body)
    headers = {} if headers is None else headers
    if scheme == "github" and "type" not in document:
        return _github_event(document, body, headers, source)
    if scheme == "standard-webhooks":
        event_id = _text(headers.get("webhook-id"), "the webhook-id header", MAX_ID_CHARS)
    else:
        event_id = _text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = _text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    return Event(event_id, event_type, _data_field(document), document, body, source)


def stored_event(source: str, event_id: str, event_type: str, body: bytes | None, sha256: bytes | None) -> Event:
    """Rebuild the Event of a stored row from its bytes (for replay and verify): parse's inverse.

    The bytes are checked against their SHA-256 and decoded by the live
    path's own function, so that both decide alike; StoredBodyError says why
    they cannot be. The id and type are the row's, as first parsed: a
    signature scheme may take them from headers rather than the body (and a
    GitHub event's data is its whole body).
    """
    if body is None:
        raise StoredBodyError("its bytes were not kept (stored before the upgrade that keeps them)")
    if sha256 is not None and hashlib.sha256(body).digest() != bytes(sha256):
        raise StoredBodyError("its stored bytes do not match their SHA-256")
    try:
        document = load(body)
    except InvalidJSON as exc:
        raise StoredBodyError(f"its stored bytes do not parse: {exc}") from None
    data = document["data"] if isinstance(document.get("data"), dict) else document
    return Event(id=event_id, type=event_type, data=data, document=document, body=body, source=source)


def _github_event(document, body, headers, source):
    event_type = _text(headers.get("X-GitHub-Event"), "the X-GitHub-Event header", MAX_TYPE_CHARS)
    if event_type in PAYMENTS:
        raise InvalidEvent("a payment must name its type in the signed body, not in the X-GitHub-Event header")
    event_id = _text(headers.get("X-GitHub-Delivery"), "the X-GitHub-Delivery header", MAX_ID_CHARS)
    return Event(event_id, event_type, document, document, body, source)


def _text(value, label, max_chars):
    if value is None:
        raise InvalidEvent(f"{label} is missing")
    if not isinstance(value, str):
        raise InvalidEvent(f"{label} must be a string")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEvent(f"{label} must be 1 to {max_chars} characters")
    # PostgreSQL text cannot hold NUL; a lone surrogate is not encodable.
    if "\x00" in value or not _encodable(value):
        raise InvalidEvent(f"{label} contains characters that cannot be stored")
    return value


def _encodable(value):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _data_field(document):
    data = document.get("data")
    if not isinstance(data, dict):
        raise InvalidEvent("'data' must be an object")
    return data


def credit_of(event: Event, policy: Policy = DEFAULT_POLICY) -> Credit | None:
    """Return the balance effect of event, None if it has none, or raise Unprocessable."""
    rule = PAYMENTS.get(event.type)
    return None if rule is None else rule.credit(event, rule.fields(event), policy)


def effect_of(event: Event) -> bytes:
    """The SHA-256 of what applying event does: its type and, for a payment, the fields its credit reads.

    Two deliveries of one id with the same effect in other bytes (a provider
    re-serialising, Stripe's pending_webhooks changing) are the same event;
    a different effect is a payload mismatch. The raw values are hashed, so
    that 100 and 1e2 (which do not credit alike) are different effects.
    """
    rule = PAYMENTS.get(event.type)
    fields = [event.type] if rule is None else [event.type, *rule.fields(event)]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).digest()


def _payment_fields(event):
    """Seed 000's payment.succeeded: user, amount and currency, as sent."""
    data = event.data
    return [data.get("userId"), data.get("amountCents"), data.get("currency")]


def _payment(event, fields, policy):
    """A `currency`, when given, must be the ledger's."""
    user_id, amount, currency = fields
    if "currency" in event.data:
        _check_currency(currency, "data.currency", policy)
    return _credit(user_id, "data.userId", amount, "data.amountCents")


def _payment_intent_fields(event):
    """Stripe's payment_intent.succeeded: user, amount, currency and livemode, as sent."""
    intent = _object(event.data.get("object"))
    user_id = _object(intent.get("metadata")).get("user_id")
    return [user_id, intent.get("amount_received"), intent.get("currency"), event.document.get("livemode")]


def _payment_intent(event, fields, policy):
    """The amount is in the currency's smallest unit."""
    user_id, amount, currency, livemode = fields
    if livemode is not True and not policy.accept_test_events:
        raise Unprocessable("a test-mode event (livemode is not true); set STRIPE_ACCEPT_TEST_EVENTS=true to accept")
    _check_currency(currency, "data.object.currency", policy)
    return _credit(user_id, "data.object.metadata.user_id", amount, "data.object.amount_received")


def _object(value):
    return value if isinstance(value, dict) else {}


def _check_currency(currency, label, policy):
    if not isinstance(currency, str) or currency.lower() != policy.currency:
        raise Unprocessable(f"{label} must be the ledger's currency, {policy.currency!r}")


def _credit(user_id, user_label, amount, amount_label):
    try:
        user = uuid.UUID(user_id) if isinstance(user_id, str) else None
    except ValueError:
        user = None
    if user is None:
        raise Unprocessable(f"{user_label} must be a user's UUID")
    # bool is an int in Python; True is not one cent.
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= MAX_CENTS:
        raise Unprocessable(f"{amount_label} must be a positive integer")
    return Credit(user, amount)


class PaymentRule(NamedTuple):
    fields: Callable  # event -> the values its credit reads, as sent: what effect_of hashes
    credit: Callable  # (event, those values, policy) -> Credit, or raise Unprocessable


# Keyed by type, not by scheme: the names do not collide, so a Stripe event
# relayed by another sender still credits.
PAYMENTS = {
    PAYMENT_SUCCEEDED: PaymentRule(_payment_fields, _payment),
    PAYMENT_INTENT_SUCCEEDED: PaymentRule(_payment_intent_fields, _payment_intent),
}
