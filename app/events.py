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

import json
import uuid
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    data: dict
    text: str  # the body as received, stored as the event's payload


@dataclass(frozen=True)
class Credit:
    user_id: uuid.UUID
    amount_cents: int


def _reject_constant(name):
    raise InvalidJSON(f"{name} is not valid JSON")


def parse(body: bytes, scheme: str = "hmac-sha256", headers=None) -> Event:
    """Return the event in body (and, per scheme, headers), or raise InvalidJSON / InvalidEvent."""
    try:
        text = body.decode("utf-8")
        document = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidJSON("body is not valid UTF-8") from None
    except RecursionError:
        raise InvalidJSON("body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, over-long integers, NaN
        raise InvalidJSON("body is not valid JSON") from exc
    if not isinstance(document, dict):
        raise InvalidJSON("body must be a JSON object")
    headers = {} if headers is None else headers
    if scheme == "github" and "type" not in document:
        return _github_event(document, text, headers)
    if scheme == "standard-webhooks":
        event_id = _text(headers.get("webhook-id"), "the webhook-id header", MAX_ID_CHARS)
    else:
        event_id = _text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = _text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    return Event(event_id, event_type, _data_field(document), text)


def stored_event(event_id: str, event_type: str, payload: str) -> Event:
    """Rebuild the Event of a stored row (for replay and verify): parse's inverse.

    The id and type are the row's, as first parsed: a signature scheme may
    take them from headers rather than the body (and a GitHub event's data
    is its whole body).
    """
    document = json.loads(payload)
    data = document["data"] if isinstance(document.get("data"), dict) else document
    return Event(id=event_id, type=event_type, data=data, text=payload)


def _github_event(document, text, headers):
    event_type = _text(headers.get("X-GitHub-Event"), "the X-GitHub-Event header", MAX_TYPE_CHARS)
    if event_type in CREDITS:
        raise InvalidEvent("a payment must name its type in the signed body, not in the X-GitHub-Event header")
    event_id = _text(headers.get("X-GitHub-Delivery"), "the X-GitHub-Delivery header", MAX_ID_CHARS)
    return Event(event_id, event_type, document, text)


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


def credit_of(event: Event) -> Credit | None:
    """Return the balance effect of event, None if it has none, or raise Unprocessable."""
    rule = CREDITS.get(event.type)
    return None if rule is None else rule(event.data)


def _payment(data):
    """Seed 000's payment.succeeded."""
    return _credit(data.get("userId"), "data.userId", data.get("amountCents"), "data.amountCents")


def _payment_intent(data):
    """Stripe's payment_intent.succeeded; the amount is in the currency's smallest unit."""
    intent = _object(data.get("object"))
    user_id = _object(intent.get("metadata")).get("user_id")
    amount = intent.get("amount_received")
    return _credit(user_id, "data.object.metadata.user_id", amount, "data.object.amount_received")


def _object(value):
    return value if isinstance(value, dict) else {}


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


# Keyed by type, not by scheme: the names do not collide, so a Stripe event
# relayed by another sender still credits.
CREDITS = {PAYMENT_SUCCEEDED: _payment, PAYMENT_INTENT_SUCCEEDED: _payment_intent}
