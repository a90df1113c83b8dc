"""What a provider is to the rest of the service: one value per signature scheme, registered in
app/providers/__init__.py, that intake, the receiver, the settings and the commands ask instead of naming it."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import ConfigError, ProviderUnavailableError
from .records import EventList, MoneyRecords
from .signing import Certificates
from .vocabulary import (
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Headers,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Rule,
    State,
    load,
    text,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey


# (body, lowered headers, secrets, tolerance, now, certificates) -> the index of the secret that signed body.
Verifier = Callable[[bytes, Mapping[str, str], Sequence[bytes], int, float, "Certificates | None"], int]
# (body, secrets, timestamp, msg_id) -> the headers a sender of the scheme sends (the tests', docs' and bench's).
Signer = Callable[[bytes, list[bytes], int, "str | None"], dict[str, str]]
# (body, webhook id, timestamp, transmission id, private key, its certificate's URL) -> the headers, for a scheme
# whose sender signs with a private key.
KeySigner = Callable[[bytes, bytes, int, str, "RSAPrivateKey", str], dict[str, str]]
# (document, body, headers, source) -> the Event, or InvalidEventError.
EnvelopeReader = Callable[[dict[str, Any], bytes, Headers, str], Event]
# (event id, type, the document of its kept bytes, whether they are the fetched ones, the delivered body, source) ->
# the stored Event, or None when the row's bytes are not this provider's to read.
StoredReader = Callable[[str, str, dict[str, Any], bool, bytes, str], "Event | None"]


class Fetcher(Protocol):
    """A source's API, as the fetch step and the drain ask it for the record an event's money is read from."""

    name: str  # the provider's, in messages

    def names(self, event: Event) -> str | None: ...  # the record, in messages ("event evt_1"); None: none to ask

    def get(self, event: Event) -> bytes | None: ...  # its bytes; None: the provider has no such record

    def read(self, event: Event, body: bytes) -> Event: ...  # event, its money as the record says


@runtime_checkable
class PagedFetcher(Fetcher, Protocol):
    """A Fetcher whose provider lists its records, so that a drain that is behind reads many of them a page at a time
    (app/receiver/pages.py)."""

    def pageable(self, event: Event) -> bool: ...  # whether a page of its lists could carry event's record

    def listed(self, events: Sequence[Event]) -> dict[str, bytes]: ...  # the records its pages carried, by event id


class EventAPI(Protocol):
    """A provider's API that answers an event by its id."""

    name: str

    def event(self, event: Event) -> bytes | None: ...


class EventById:
    """A Fetcher over an API that answers an event by its id (Stripe's, PayPal's): the record is the event."""

    def __init__(self, api: EventAPI, parse: EnvelopeReader) -> None:
        self.api, self.parse, self.name = api, parse, api.name

    def names(self, event: Event) -> str | None:
        return f"event {event.id}"

    def get(self, event: Event) -> bytes | None:
        return self.api.event(event)

    def read(self, event: Event, body: bytes) -> Event:
        return as_fetched(event, body, self.parse, self.name)


def as_fetched(event: Event, body: bytes, parse: EnvelopeReader, provider: str) -> Event:
    """event with the document its provider's API returned (body): its id, source and delivered bytes kept."""
    try:
        record = parse(load(body), body, {}, event.source)
    except (InvalidJSONError, InvalidEventError) as exc:
        raise ProviderUnavailableError(f"{provider}'s API answered with an event that does not parse: {exc}") from None
    if record.id != event.id:
        raise ProviderUnavailableError(f"{provider}'s API answered with another event than the one asked for")
    return Event(event.id, record.type, record.data, record.document, event.body, event.source)


def recorded(event_id: str, event_type: str, document: dict[str, Any], body: bytes, source: str) -> Event:
    """A stored row's event in the common shape: its data the document's `data`, or the whole document."""
    data = document["data"] if isinstance(document.get("data"), dict) else document
    return Event(event_id, event_type, data, document, body, source)


# The process's outbound calls (app/providers/outbound.py's Outbound) and a provider account's budget (budget.py's
# Budget, or None): Any here, as core imports nothing above it; each provider's hooks name their types.
Outbound = Any
Budget = Any
# (API address, API key, the outbound calls, the account's budget, whether every event is fetched) -> its Fetcher, or
# None when such a source asks nothing.
FetcherMaker = Callable[[str, str, Outbound, Budget, bool], "Fetcher | None"]


def envelope(document: dict[str, Any], body: bytes, headers: Headers, source: str,
             event_id: str | None = None) -> Event:
    """The event in the shape every scheme may carry: `id` (unless the scheme signs it elsewhere), `type` and the
    object `data`."""
    event_id = text(document.get("id"), "'id'", MAX_ID_CHARS) if event_id is None else event_id
    event_type = text(document.get("type"), "'type'", MAX_TYPE_CHARS)
    data = document.get("data")
    if not isinstance(data, dict):
        raise InvalidEventError("'data' must be an object")
    return Event(event_id, event_type, data, document, body, source)


# (API key, API address, the key's setting, a connected account or None: the key's own, the account's budget) -> its
# events, listed for `flask reconcile`.
EventListMaker = Callable[[str, str, str, "str | None", Budget], EventList]
# (API key, API address, the key's setting, a connected account or None, the users' metadata key, the budget) -> its
# money records, for `flask audit`.
MoneyRecordsMaker = Callable[[str, str, str, "str | None", str, Budget], MoneyRecords]
# (API key, API address, the key's setting, the budget) -> the id of each connected account a platform lists, as listed;
# ProviderError if the list cannot be read.
AccountLister = Callable[[str, str, str, Budget], list[str]]


def _never(event: Event) -> bool:
    return False


# The shortest HMAC key accepted (under standard-webhooks, once decoded).
# A captured delivery lets anyone search for the key offline (its signature
# is an HMAC of bytes they have); 16 bytes can carry 128 bits, out of reach
# of such a search. Providers issue longer ones: Stripe whsec_ + 32
# characters, Standard Webhooks keys of 24 to 64 bytes, GitHub any string.
MIN_SECRET_BYTES = 16


def long_enough(name: str, keys: tuple[bytes, ...], unit: str = "bytes") -> tuple[bytes, ...]:
    """keys, or ConfigError for one shorter than MIN_SECRET_BYTES (named by index, never by value)."""
    for index, key in enumerate(keys):
        if len(key) < MIN_SECRET_BYTES:
            split = " (a comma always separates two secrets)" if len(keys) > 1 else ""
            raise ConfigError(
                f"{name} entry {index} (counted from 0) is shorter than {MIN_SECRET_BYTES} {unit}{split}")
    return keys


@dataclass(frozen=True)
class Provider:
    """A signature scheme and what its provider sends, moves and answers; the hooks a provider without them lacks
    keep their defaults."""

    scheme: str  # WEBHOOK_SIGNATURE_SCHEME's value; also what its calls are counted under
    name: str  # in messages: "Stripe"
    signature_header: str  # the header that tells its deliveries apart, named to a source of another scheme
    verify: Verifier
    sign: Signer | None  # None: it signs with a private key (sign_with_key)
    parse: EnvelopeReader = envelope
    rules: Mapping[str, Rule] = field(default_factory=dict)  # by event type, each refund rule with its statuses
    # For an event type another provider sends too: whether a document is in this provider's shape. None: this
    # provider's rule is the one read when no other's shape matches.
    owns: Callable[[dict[str, Any]], bool] | None = None
    stored: StoredReader | None = None  # a stored row whose kept bytes need this provider to be read
    type_header: str | None = None  # a header that may name the type, and so never a type that moves money
    sign_with_key: KeySigner | None = None
    api: FetcherMaker | None = None  # its API, for a source with an API key
    api_base: str | None = None  # its API's address, where a source names none
    needs_api: Callable[[Event], bool] = _never  # an event whose money is read from the API whatever FETCH says
    # -- what a scheme's verify needs beyond the secrets --
    # (the process's Settings, Any here: core imports no settings; its outbound calls) -> what its verify is passed
    # as `certificates`, made once per process by the fetch step (app/receiver/fetch.py). None: it needs nothing more.
    certificates: Callable[[Any, Outbound], Certificates] | None = None
    # -- what the commands ask: `flask reconcile`, `flask audit`, a connected account --
    event_list: EventListMaker | None = None  # its event list, for reconcile; None: its events cannot be listed
    money_records: MoneyRecordsMaker | None = None  # its money records, for the audit; None: not audited
    accounts: AccountLister | None = None  # a platform's connected accounts (--all-accounts); None: it has none
    is_account: Callable[[object], bool] | None = None  # a connected account's id; None: it has no connected accounts
    account_prefix: str = ""  # how a connected account's id begins ("acct_"): a text that does is meant as one
    account_words: str = ""  # a connected account's id, in a refusal's words: "acct_ then letters and digits"
    events_key: str = "the provider's API key"  # the key reconcile needs, in words ("a Stripe restricted key ...")
    money_key: str = "the provider's API key"  # the key the audit needs, in words
    payouts: bool = False  # its audit checks each payout against its records (--payouts)

    # -- what the settings ask of a source of the scheme --
    # (its secrets' setting, their entries) -> the secrets as its verify uses them, or ConfigError naming an entry
    # by index: HMAC keys of MIN_SECRET_BYTES unless it says otherwise.
    keys: Callable[[str, tuple[bytes, ...]], tuple[bytes, ...]] = long_enough
    # Why a source of the scheme fetches every event (its FETCH cannot be false); None: it chooses. Whether it can
    # fetch at all is whether it has an `api`.
    must_fetch: str | None = None
    # A source's API key, to fetch events: in a message's words ("Razorpay's API key"), written as ("<key id>:<key
    # secret>"; "": any form), and that form as a regular expression matched in full ("": not checked).
    api_key_words: str = "the provider's API key"
    api_key_written: str = ""
    api_key_pattern: str = ""
    # The global setting that gives its API's address where a source names none ("STRIPE_API_BASE"); None: api_base.
    api_base_setting: str | None = None

    def has_account(self, text: object) -> bool:
        """Whether text is the id of one of its connected accounts (never, for a provider that has none)."""
        return self.is_account is not None and self.is_account(text)


def with_statuses(rules: Mapping[str, Rule], statuses: Mapping[str, State]) -> dict[str, Rule]:
    """rules, each refund rule naming the statuses its provider spells (the 422 of one it does not send lists them)."""
    return {name: rule._replace(statuses=statuses) if rule.kind == Kind.REFUND else rule
            for name, rule in rules.items()}
