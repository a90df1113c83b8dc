"""Parsing and validating an event body: pure functions, no I/O."""

import json
import uuid
from dataclasses import dataclass

MAX_ID_CHARS = 128
MAX_TYPE_CHARS = 64
PAYMENT_SUCCEEDED = "payment.succeeded"
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


def parse(body: bytes) -> Event:
    """Return the event in body, or raise InvalidJSON / InvalidEvent."""
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
    return Event(
        id=_text_field(document, "id", MAX_ID_CHARS),
        type=_text_field(document, "type", MAX_TYPE_CHARS),
        data=_data_field(document),
        text=text,
    )


def _text_field(document, name, max_chars):
    value = document.get(name)
    if not isinstance(value, str):
        raise InvalidEvent(f"'{name}' must be a string")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEvent(f"'{name}' must be 1 to {max_chars} characters")
    # PostgreSQL text cannot hold NUL; a lone surrogate is not encodable.
    if "\x00" in value or not _encodable(value):
        raise InvalidEvent(f"'{name}' contains characters that cannot be stored")
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
    if event.type != PAYMENT_SUCCEEDED:
        return None
    user_id = event.data.get("userId")
    amount = event.data.get("amountCents")
    try:
        user = uuid.UUID(user_id) if isinstance(user_id, str) else None
    except ValueError:
        user = None
    if user is None:
        raise Unprocessable("data.userId must be a user's UUID")
    # bool is an int in Python; True is not one cent.
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= MAX_CENTS:
        raise Unprocessable("data.amountCents must be a positive integer")
    return Credit(user, amount)
