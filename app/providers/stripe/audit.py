"""Stripe's money records for `flask audit`: its balance transactions by `created` window, each with its `source`
expanded, in the platform's account or a connected one's, turned into the ledger's keys (docs/providers/stripe.md,
"Reconcile and audit")."""

# What Stripe documents and this follows:
# - https://docs.stripe.com/api/balance_transactions/list: newest first, `created[gte|lt]`, `limit` up to 100,
#   `starting_after`; https://docs.stripe.com/expand: `expand[]=data.source` gives each transaction's source object;
# - https://docs.stripe.com/api/balance_transactions/object: `type`, `reporting_category`, `amount` (gross, minor
#   units, negative for money sent), `fee`, `net`, `currency`;
# - https://docs.stripe.com/reports/balance-transaction-types and https://docs.stripe.com/reports/reporting-categories:
#   a charge or payment is a Charge's money (its `payment_intent` the ledger's payment key), a refund a Refund's, a
#   failed refund (`refund_failure`, `payment_failure_refund`, or an adjustment of category `refund_failure`) that
#   Refund given back, and adjustments of category `dispute` and `dispute_reversal` a Dispute's funds withdrawn and
#   reinstated; the other types are not a user's money (fees, payouts, transfers, top-ups, reserves, ...).
# - Connect: a connected account's transactions are listed with `Stripe-Account`
#   (https://docs.stripe.com/connect/authentication), and its objects keyed acct_X/pi_Y as its events are.

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...core.errors import ProviderError
from ...core.records import Kind, PayoutRecord, ProviderRecord, Record
from .api import PAGE_LIMIT, StripeAPI, _cursor
from .scheme import NAME

if TYPE_CHECKING:
    from ..budget import Budget

BALANCE = "/v1/balance_transactions"
# Types whose source is a Charge: the payment's captured money (https://docs.stripe.com/reports/balance-transaction-types).
CHARGE_TYPES = ("charge", "payment")
REFUND_TYPES = ("refund", "payment_refund")
REFUND_FAILURE_TYPES = ("refund_failure", "payment_failure_refund")
# Adjustments that are a Dispute's funds, by reporting category, and whether they give the funds back.
DISPUTE_CATEGORIES = {"dispute": False, "dispute_reversal": True}
# Types that are no user's money, each summed under its reporting_category. A type not named here nor above stops
# its transaction as unknown_provider_type rather than being guessed.
NON_USER_TYPES = frozenset({
    "adjustment", "advance", "advance_funding", "anticipation_repayment", "application_fee", "application_fee_refund",
    "climate_order_purchase", "climate_order_refund", "connect_collection_transfer", "contribution",
    "fee_credit_funding", "inbound_transfer", "inbound_transfer_reversal", "issuing_authorization_hold",
    "issuing_authorization_release", "issuing_dispute", "issuing_transaction", "obligation_outbound",
    "obligation_reversal_inbound", "payment_network_reserve_hold", "payment_network_reserve_release",
    "payment_reversal", "payment_unreconciled", "payout", "payout_cancel", "payout_failure",
    "payout_minimum_balance_hold", "payout_minimum_balance_release", "reserve_hold", "reserve_release",
    "reserve_transaction", "reserved_funds", "stripe_balance_payment_debit", "stripe_balance_payment_debit_reversal",
    "stripe_fee", "stripe_fx_fee", "tax_fee", "tax_fund", "topup", "topup_reversal", "transfer", "transfer_cancel",
    "transfer_failure", "transfer_refund",
})


class StripeBalance(StripeAPI):
    """One Stripe account's balance transactions (the platform's own, or with account a connected account's), read
    with a restricted key that may read Balance."""

    name = NAME
    what = "balance transactions"
    # Stripe counts each named operation as an endpoint (https://docs.stripe.com/rate-limits): the audit's lists
    # (balance transactions, and payouts with --payouts) spend one of their own, beside reconcile's List Events.
    endpoint = "balance_transactions"

    def __init__(self, api_key: str, api_base: str, key_setting: str, account: str | None = None,
                 user_key: str = "user_id", budget: "Budget | None" = None) -> None:
        super().__init__(api_key, api_base, key_setting, budget)
        self.account = account
        self.user_key = user_key  # the metadata key that names a user (WEBHOOK_<NAME>_USER_METADATA_KEY)
        if account:
            self._context = {"stripe_account": account}

    def pages(self, since: int, until: int) -> Iterator[list[Record]]:
        """The transactions created in [since, until) (Unix seconds), newest first, a page at a time, as Records;
        ProviderError when Stripe cannot be read (after its retries) or answers a page that cannot be followed."""
        params: dict[str, Any] = {"created": {"gte": since, "lt": until}, "limit": PAGE_LIMIT,
                                  "expand": ["data.source"]}
        for data in self._pages(BALANCE, "balance transactions", params):
            yield [self.record(document) for document in data]

    def payouts(self, since: int, until: int) -> Iterator[PayoutRecord]:
        """The paid payouts created in [since, until) (https://docs.stripe.com/api/payouts/list)."""
        params: dict[str, Any] = {"created": {"gte": since, "lt": until}, "status": "paid", "limit": PAGE_LIMIT}
        for data in self._pages("/v1/payouts", "payouts", params):
            for document in data:
                if not isinstance(document, dict):
                    raise ProviderError(f"{NAME} listed a payout that is not an object")
                yield PayoutRecord(_text(document.get("id")) or "?", _int(document.get("amount")),
                                   _text(document.get("currency")) or "?", document.get("automatic") is True,
                                   _int(document.get("created")))

    def paid_out(self, payout: str) -> Iterator[list[Record]]:
        """The transactions a payout paid out, its own among them (https://docs.stripe.com/payouts/reconciliation)."""
        params: dict[str, Any] = {"payout": payout, "limit": PAGE_LIMIT}
        for data in self._pages(BALANCE, "balance transactions", params):
            yield [self.record(document) for document in data]

    def _pages(self, path: str, what: str, params: dict[str, Any]) -> Iterator[list[Any]]:
        """A list's pages, newest first, by starting_after."""
        cursors: set[str] = set()
        while True:
            data, has_more = self._page(path, what, params)
            yield data
            if not has_more:
                return
            params = {**params, "starting_after": _cursor(data[-1], cursors, f"one of the {what}")}

    def _page(self, path: str, what: str, params: dict[str, Any]) -> tuple[list[Any], bool]:
        """One request: one page, in the account's context. Every call to Stripe the audit makes is this one: it
        spends the account's budget, shared with every host (StripeAPI._call: the budget waited for, a 429 pausing
        the fleet and asked again)."""
        return self._list_page(path, what, {**params, **self._context})

    def record(self, document: Any) -> Record:
        """A balance transaction as the ledger's keys see it."""
        if not isinstance(document, dict):
            raise ProviderError(f"{NAME} listed a balance transaction that is not an object")
        txn = _text(document.get("id")) or "?"
        kind, category = _text(document.get("type")), _text(document.get("reporting_category")) or "?"
        amount, fee = _int(document.get("amount")), _int(document.get("fee"))
        currency, created = _text(document.get("currency")) or "?", _int(document.get("created"))
        base = Record(txn, created, currency, amount, fee, category, kind or "?")
        if kind in CHARGE_TYPES:
            return base._replace(money=self._charge(document.get("source")))
        failed_refund = kind in REFUND_FAILURE_TYPES or (kind == "adjustment" and category == "refund_failure")
        if kind in REFUND_TYPES or failed_refund:
            return base._replace(money=self._refund(document.get("source"), reversed_=kind not in REFUND_TYPES))
        if kind == "adjustment" and category in DISPUTE_CATEGORIES:
            return base._replace(money=self._dispute(document.get("source"), DISPUTE_CATEGORIES[category]))
        if kind in NON_USER_TYPES:
            return base
        return base._replace(unknown=f"type {kind or '?'!r} (reporting_category {category!r}) is not one the Stripe "
                                     "adapter knows")

    def _key(self, object_id: object) -> str | None:
        if not isinstance(object_id, str) or not object_id:
            return None
        return f"{self.account}/{object_id}" if self.account else object_id

    def _charge(self, charge: Any) -> ProviderRecord | str:
        if not isinstance(charge, dict) or charge.get("object") != "charge":
            return "a charge whose source is not a Charge (was data.source expanded?)"
        payment = self._key(charge.get("payment_intent"))
        if payment is None:
            return "a Charge with no payment_intent (the ledger keys payments by their PaymentIntent)"
        captured = charge.get("amount_captured")
        amount = captured if isinstance(captured, int) else _int(charge.get("amount"))
        metadata = charge.get("metadata")
        user = metadata.get(self.user_key) if isinstance(metadata, dict) else None
        return ProviderRecord(Kind.PAYMENT, payment, payment, amount, _text(charge.get("currency")) or "?",
                              user if isinstance(user, str) else None, False)

    def _refund(self, refund: Any, reversed_: bool) -> ProviderRecord | str:
        return self._source(refund, Kind.REFUND, "refund", "a refund", reversed_)

    def _dispute(self, dispute: Any, reinstated: bool) -> ProviderRecord | str:
        return self._source(dispute, Kind.DISPUTE, "dispute", "a dispute adjustment", reinstated)

    def _source(self, source: Any, kind: Kind, name: str, entry: str, reversed_: bool) -> ProviderRecord | str:
        """The record of an entry's source (a Refund or a Dispute, named name), or why it cannot be read."""
        if not isinstance(source, dict) or source.get("object") != name:
            return f"{entry} whose source is not a {name.capitalize()}"
        key, payment = self._key(source.get("id")), self._key(source.get("payment_intent"))
        if key is None or payment is None:
            return f"a {name.capitalize()} with no id or no payment_intent"
        return ProviderRecord(kind, key, payment, _int(source.get("amount")), _text(source.get("currency")) or "?",
                              None, reversed_)

def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
