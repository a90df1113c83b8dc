"""The vocabulary every part shares, and no provider's: the event, its effect, a movement's kind and state,
the settings a decision reads (Policy), the fields a rule reads, and the checks of a field's value (an id,
a UUID, cents, a currency, a decimal amount in minor units). Pure: no I/O, nothing of any provider."""

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, NoReturn, Protocol, TypeGuard

# The source of POST /api/webhooks; named sources are served on /api/webhooks/<name>.
DEFAULT_SOURCE = "default"
# A provider's id (an event's, a payment's, a refund's, a dispute's, a customer's, a Stripe account's): Stripe's
# bound, the longest any provider documents ("Stripe-generated object IDs, which can contain up to 255
# characters": https://docs.stripe.com/upgrades).
MAX_ID_CHARS = 255
# An application's own key of a user (user_keys.app_key: an integer's digits, or its text key), as its payments'
# metadata names the user instead of the user's UUID.
MAX_APP_KEY_CHARS = 255
# A key in a Stripe connected account (acct_X/pi_Y, acct_X/re_Y, acct_X/cus_Y): two ids and the "/" between.
MAX_KEY_CHARS = MAX_ID_CHARS + 1 + MAX_ID_CHARS


MAX_TYPE_CHARS = 64


# user_balances.balance_cents is a BIGINT.
MAX_CENTS = 2**63 - 1
# How deep a body may nest, on every path alike: far below what Python's
# decoder manages on any stack (the live path's, replay's, verify's, about
# 900 levels), far above any provider's events (Stripe's nest under 10).
MAX_DEPTH = 64
# What an event of this service's own shape that names no currency reads as:
# the ledger's, LEDGERCURRENCY, put in by effect_of.
LEDGERS_CURRENCY = "(the ledger's)"


class InvalidJSONError(ValueError):
    """The body is not a UTF-8 JSON object."""


class InvalidEventError(ValueError):
    """The body is JSON, but id/type/data are missing or of the wrong type."""


class UnprocessableError(ValueError):
    """Authentic and well-formed, but the business effect cannot apply."""


class StoredBodyError(ValueError):
    """A stored event's bytes are missing, do not match their hash, or do not parse."""


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
    """What an event moves (ledger_delivery's kind); REFUND and DISPUTE are also movements.kind, LINK moves no money."""

    CREDIT = "credit"  # credits a payment to its user, once per payment
    REFUNDED_TOTAL = "refunded_total"  # a running total of the payment's refunds: the highest one counts
    REFUND = "refund"  # a refund object: taken once when counted, given back once when it failed
    DISPUTE = "dispute"  # a dispute: its funds withdrawn once, reinstated once
    LINK = "link"  # links a customer to a user (a subscription's Checkout Session), as `flask users link`: no money


class State(StrEnum):
    """What an event says of a refund or a dispute (movements.state): states only move forward."""

    APPLIED = "applied"  # a refund counted (pending, requires_action, succeeded), a dispute's funds withdrawn
    REVERSED = "reversed"  # a refund failed or canceled, a dispute's funds reinstated


@dataclass(frozen=True)
class Effect:
    """What applying an event does to the ledger, read from its fields (effect_of); two deliveries of one event id are
    compared by its sha256."""

    kind: Kind | None  # None for an event with no balance effect, and for one whose effect cannot apply (problem: 422)
    payment_id: str | None = None
    user_id: uuid.UUID | None = None  # a credit's or a link's; every other movement's user is its payment's
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
    # names its user, and what it gets if none does (money.sql decides); a link's: the customer it links.
    customer_id: str | None = None
    users: "Users | None" = None
    # A Stripe Connect event's connected account (acct_...), whose link names the user when neither the
    # metadata nor the customer's link does; its keys (payment_id, movement_id, customer_id) are in it.
    account: str | None = None
    # A credit's or a link's user named by the application's own key (user_keys) instead of its UUID: money.sql
    # reads the user it names (user_id is then None).
    app_key: str | None = None

    @property
    def names_user(self) -> bool:
        """Whether the event names its user itself, by UUID or by the application's key (else a link, an
        assignment or the payment's own row may)."""
        return self.user_id is not None or self.app_key is not None


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
    """What the ledger accepts beyond the event's shape (LEDGERCURRENCY, STRIPE_ACCEPT_TEST_EVENTS, and per
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


def text(value: object, label: str, max_chars: int) -> str:
    if value is None:
        raise InvalidEventError(f"{label} is missing")
    if not isinstance(value, str):
        raise InvalidEventError(f"{label} must be a string")
    if not 1 <= len(value) <= max_chars:
        raise InvalidEventError(f"{label} must be 1 to {max_chars} characters")
    if not storable(value):
        raise InvalidEventError(f"{label} contains characters that cannot be stored")
    return value


def storable(value: str) -> bool:
    """PostgreSQL text cannot hold NUL; a lone surrogate is not encodable."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


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
    # The Stripe connected account the keys above are in (acct_...; None: the platform's own), hashed through them.
    account: object = None


class Metadata(dict[str, Any]):
    """A PaymentIntent's metadata, whole, in its Fields: which key names the user is a per-source setting
    (Users.metadata_key), so the effect is hashed by all of it, and the key is read after."""

    def label(self, key: str) -> str:
        """Where get(key) read the user from, for a 422's message."""
        return f"data.object.metadata.{key}"


class Rule(NamedTuple):
    kind: Kind
    # Fields; None when this event moves no money (an authorisation released,
    # never captured); a str when it cannot apply for a reason the fields
    # alone do not say (the 422's message).
    read: Callable[[Event], Fields | str | None]
    labels: Fields  # where each field is read from, for the 422's message
    # A refund rule's statuses as its provider spells them, and what each says: the 422 of a status the provider
    # does not send lists these. None where the state is not read from a status.
    statuses: Mapping[str, State] | None = None
    # The rule that reads this event, when more than its type decides (a Checkout Session's mode).
    refine: "Callable[[Event], Rule] | None" = None
    # A thin event's: its money is read from its object when fetched, so its copies compare by what the signed
    # body names (this digest, None for a body that is not thin), not by that money.
    compared_by: Callable[[Event], bytes | None] | None = None


def uuid_text(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return value


def lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


# -- decimal amounts (PayPal's {"currency_code": "USD", "value": "21.00"}) ---------

# ISO 4217 minor-unit exponents other than 2 (https://www.six-group.com/en/products-services/financial-information/
# data-standards.html, list one). Upper case, as the standard and PayPal write the codes.
CURRENCY_EXPONENTS = {
    **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
                     "VUV", "XAF", "XOF", "XPF"), 0),
    **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
    **dict.fromkeys(("CLF", "UYW"), 4),
}
# What a balance's unit is called in the commands' words: the minor unit of the currencies the providers here settle
# in most (ISO 4217 names them only by exponent). One not listed is "minor units of XXX".
MINOR_UNIT_NAMES = {
    **dict.fromkeys(("usd", "eur", "cad", "aud", "nzd", "sgd", "hkd", "mxn", "myr"), "cents"),
    "gbp": "pence", "inr": "paise", "jpy": "yen", "krw": "won", "chf": "rappen", "brl": "centavos",
}


def minor_unit_name(currency: str) -> str:
    """The name of currency's minor unit, as a balance in it is printed: "cents" for usd, "paise" for inr."""
    return MINOR_UNIT_NAMES.get(currency.lower(), f"minor units of {currency.upper()}")


# PayPal's Money.value pattern (digits, or digits around one point, up to 32 characters), less its sign:
# an amount paid or refunded is never negative.
_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?|()\.([0-9]+)")


def minor_units(value: object, currency: object) -> int | None:
    """A decimal string in currency's minor units by its ISO 4217 exponent, exactly, or None (refused)."""
    # Text arithmetic, never a float: "21.00" USD is 2100, "500" JPY is 500, "1.234" KWD is 1234. A value with more
    # significant decimals than the currency has ("0.001" USD, "1.5" JPY), not a plain decimal string, or beyond
    # a BIGINT is None.
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


def an_object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_cents(value: object, zero: bool = False) -> TypeGuard[int]:
    """Whether value is a number of cents a BIGINT holds (bool is an int in Python; True is not one cent)."""
    return isinstance(value, int) and not isinstance(value, bool) and (0 if zero else 1) <= value <= MAX_CENTS


CURRENCY = re.compile(r"[a-z]{3}")


def is_id(value: object, max_chars: int = MAX_ID_CHARS) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= max_chars and storable(value)


def app_key_of(value: object) -> str | None:
    """The application's key of a user that value names instead of the user's UUID (an integer, or text of 1 to
    MAX_APP_KEY_CHARS characters), or None: a UUID, or no key."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and is_id(value, MAX_APP_KEY_CHARS) and not is_uuid(uuid_text(value)):
        return value
    return None


def is_uuid(value: object) -> TypeGuard[str]:
    """Whether value is a UUID in its canonical spelling (as uuid_text leaves every UUID)."""
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


# What an error or a refusal quotes of what a provider or a user sent: enough to recognise it by, not a page of
# customer data in a log line.
EXCERPT_CHARS = 200


def excerpt(received: str, limit: int = EXCERPT_CHARS) -> str:
    """At most limit characters of received, on one printable line (others escaped), and how many more there were."""
    shown = "".join(char if char.isprintable() and char != "\\" else ascii(char)[1:-1] for char in received[:limit])
    return shown + (f"... ({len(received) - limit} more characters)" if len(received) > limit else "")
