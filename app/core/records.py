"""What a provider's API lists, for `flask reconcile` (its events) and `flask audit` (its money records): the records
and the adapters' protocols, shared by app/providers/ and app/commands/."""

from collections.abc import Iterator
from enum import StrEnum
from typing import NamedTuple, Protocol


class ListedEvent(NamedTuple):
    """One event as the provider's list gave it: its id as listed ("?" if none), to name it, and its bytes of record,
    which are read as a delivery's body is."""

    id: str
    body: bytes


class EventList(Protocol):
    """What a provider's adapter implements (docs/design.md, "Reconciliation")."""

    name: str  # for the summary: "Stripe"
    horizon_days: int  # how far back the provider lists
    account: str | None  # whose events: a connected account's id, or None for the key's own account

    def pages(self, since: int, until: int) -> Iterator[list[ListedEvent]]:
        """The events created in [since, until) (Unix seconds), oldest first, a page at a time."""
        ...


class Kind(StrEnum):
    PAYMENT = "payment"
    REFUND = "refund"
    DISPUTE = "dispute"


class BreakClass(StrEnum):
    MISSING_IN_LEDGER = "missing_in_ledger"
    MISSING_AT_PROVIDER = "missing_at_provider"
    AMOUNT_MISMATCH = "amount_mismatch"
    CURRENCY_MISMATCH = "currency_mismatch"
    STATE_MISMATCH = "state_mismatch"
    USER_MISMATCH = "user_mismatch"
    MATCHED_BY_AMOUNT_ONLY = "matched_by_amount_only"
    UNKNOWN_PROVIDER_TYPE = "unknown_provider_type"


class ProviderRecord(NamedTuple):
    """What one provider record says of one of the ledger's objects: a payment, refund or dispute by its key."""

    kind: Kind
    key: str  # the ledger's key: a payment's (pi_..., acct_X/pi_...), a movement's (re_..., du_...)
    payment: str  # its payment's key
    amount: int  # the object's own amount, minor units, positive
    currency: str
    user: str | None  # the user the provider's metadata names, when it names one
    reversal: bool  # a refund's failure, a dispute's funds reinstated


class Record(NamedTuple):
    """One provider money record (a Stripe balance transaction): its own figures, and what it is to the ledger."""

    txn: str
    created: int  # Unix seconds
    currency: str
    amount: int  # gross, signed as the provider signs it
    fee: int
    category: str  # what non-user money is summed under (Stripe's reporting_category)
    type: str
    money: ProviderRecord | str | None = None  # a user's money; a str: why it cannot be read (stops the object)
    unknown: str | None = None  # a type the adapter does not know
    pending: bool = False  # the provider has not settled it yet (a Razorpay payment captured, not settled)


class PayoutRecord(NamedTuple):
    """A payout the provider made to the merchant's bank: its amount against what its transactions add up to."""

    id: str
    amount: int
    currency: str
    automatic: bool  # a manual payout names no transactions: it cannot be checked
    created: int


class MoneyRecords(Protocol):
    """What a provider's audit adapter implements (app/providers/stripe/)."""

    name: str  # "Stripe"
    what: str  # what its records are called: "balance transactions"
    account: str | None  # a connected account's id, or None for the key's own account

    def pages(self, since: int, until: int) -> Iterator[list[Record]]:
        """The records created in [since, until) (Unix seconds), a page at a time; ProviderError if unreadable."""
        ...

    def payouts(self, since: int, until: int) -> Iterator[PayoutRecord]:
        """The paid payouts created in [since, until)."""
        ...

    def paid_out(self, payout: str) -> Iterator[list[Record]]:
        """The records a payout paid out, a page at a time."""
        ...
