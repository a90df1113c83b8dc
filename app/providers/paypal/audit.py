"""PayPal's money records for `flask audit`: Transaction Search, at most 31 days a query and up to 3 hours behind
(docs/providers/paypal.md, "Reconcile and audit")."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from ...core.errors import ProviderError, ProviderRefusedError, ProviderUnavailableError, RateLimitedError
from ...core.records import Kind, PayoutRecord, ProviderRecord, Record
from ...core.vocabulary import InvalidJSONError, load
from ..budget import Budget, patiently
from ..outbound import Outbound
from .api import API, API_BASE
from .rules import money_of
from .scheme import NAME

# Sources:
# - https://developer.paypal.com/docs/api/transaction-search/v1/: `GET /v1/reporting/transactions` with
#   `start_date`, `end_date` (31 days at most), `fields=all`, `page_size` (up to 500) and `page`; "it takes a maximum
#   of three hours for executed transactions to appear in the list transactions call";
# - https://developer.paypal.com/docs/transaction-search/transaction-event-codes/: `T00xx` are payments received
#   (the capture `transaction_id`, the ledger's payment key), `T1107` a refund (its own id; `paypal_reference_id` the
#   capture), `T1106` a reversal and `T1201` a chargeback: a dispute's money, which names no dispute id, so it is
#   matched to the ledger's dispute of that capture by amount (`matched_by_amount_only`); fees, transfers, bank
#   deposits and withdrawals, reserves and conversions (`T01`..`T09`, `T15`, `T16`, `T21`, `T22`) are not a user's.

SEARCH_DAYS = 31  # the most one query may span
PAGE_SIZE = 500  # the most one page gives
DELAY = timedelta(hours=3)  # "a maximum of three hours" before a transaction is listed
TIMEOUT = 30  # seconds per request
MAX_PAGE_BYTES = 16 * 1024 * 1024  # a page of PAGE_SIZE transactions with fields=all, a few KiB each
DISPUTE_CODES = ("T1106", "T1201")
NON_USER = ("T01", "T02", "T03", "T04", "T05", "T06", "T07", "T08", "T09", "T15", "T16", "T21", "T22")


class PayPalTransactions:
    """One PayPal account's transactions, read with its REST app's client id and secret."""

    name = NAME
    what = "transactions"
    account: str | None = None
    delay = DELAY

    def __init__(self, api_key: str, api_base: str | None, key_setting: str, budget: Budget | None = None) -> None:
        # One call at a time, each within TIMEOUT: a command's, not a worker's share of PROVIDER_SLOTS; each spends
        # the account's budget, shared with every host's fetches (app/providers/budget.py).
        self._api = API((api_base or API_BASE).rstrip("/"), api_key, Outbound(1, TIMEOUT), budget)
        self._key_setting = key_setting

    def pages(self, since: int, until: int) -> Iterator[list[Record]]:
        """The transactions initiated in [since, until), 31 days a query, a page at a time."""
        start = since
        while start < until:
            end = min(until, start + SEARCH_DAYS * 86400) - 1
            page, pages = 1, 1
            while page <= pages:
                answer = self._call("/v1/reporting/transactions", {
                    "start_date": _iso(start), "end_date": _iso(end), "fields": "all", "page_size": PAGE_SIZE,
                    "page": page})
                details = answer.get("transaction_details")
                if not isinstance(details, list) or not isinstance(answer.get("total_pages"), int):
                    raise ProviderError(f"{NAME} answered a page that is not a list of transactions")
                yield [self.record(detail) for detail in details]
                pages, page = answer["total_pages"], page + 1
            start = end + 1

    def payouts(self, since: int, until: int) -> Iterator[PayoutRecord]:
        raise ProviderError(f"{NAME}: --payouts is Stripe's")

    def paid_out(self, payout: str) -> Iterator[list[Record]]:
        raise ProviderError(f"{NAME}: --payouts is Stripe's")

    def record(self, detail: Any) -> Record:
        info = detail.get("transaction_info") if isinstance(detail, dict) else None
        if not isinstance(info, dict):
            raise ProviderError(f"{NAME} listed a transaction without transaction_info")
        code = str(info.get("transaction_event_code") or "?")
        cents, currency, problem = _signed(info.get("transaction_amount"), "transaction_amount")
        fee, _, _ = _signed(info.get("fee_amount"), "fee_amount")
        try:
            created = int(datetime.fromisoformat(str(info.get("transaction_initiation_date"))).timestamp())
        except ValueError:
            raise ProviderError(f"{NAME} listed a transaction whose transaction_initiation_date is not a time") \
                from None
        txn, reference = str(info.get("transaction_id") or "?"), info.get("paypal_reference_id")
        base = Record(txn, created, str(currency or "?"), cents, -fee, code[:3], code)
        if problem:
            return base._replace(unknown=problem)
        if code.startswith("T00"):
            return base._replace(money=ProviderRecord(Kind.PAYMENT, txn, txn, cents, base.currency, None, False))
        if code == "T1107" and isinstance(reference, str):
            return base._replace(money=ProviderRecord(Kind.REFUND, txn, reference, -cents, base.currency, None, False))
        if code in DISPUTE_CODES and isinstance(reference, str):  # no dispute id: matched by amount
            return base._replace(money=ProviderRecord(Kind.DISPUTE, "", reference, abs(cents), base.currency, None,
                                                      cents > 0))
        if code.startswith(NON_USER):
            return base
        return base._replace(unknown=f"event code {code!r} is not one the PayPal adapter knows")

    def _call(self, path: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request (every call the audit makes to PayPal is this one), through the API the service fetches
        events with (its token, and its renewal); its JSON object, or ProviderError."""
        try:
            body = patiently(lambda: self._api.get(f"{path}?{urlencode(params)}", "its transactions",
                                                   "reporting-transactions", max_bytes=MAX_PAGE_BYTES))
            if body is None:
                raise ProviderError(f"{NAME} answered 404 for {path}")
            return load(body)
        except ProviderRefusedError as exc:
            raise ProviderError(f"{exc} ({self._key_setting})") from None
        except RateLimitedError:
            raise ProviderError(f"{NAME} kept answering 429 (rate limited) for about a minute") from None
        except (ProviderUnavailableError, InvalidJSONError) as exc:
            raise ProviderError(f"{NAME} failed: {exc}") from None


def _signed(money: Any, label: str) -> tuple[int, object, str | None]:
    """A Money object's signed amount in minor units (Transaction Search signs what left the account), its currency,
    and why it is not exact, if it is not; an absent one is 0."""
    if not isinstance(money, dict):
        return 0, None, None
    value = money.get("value")
    negative = isinstance(value, str) and value.startswith("-")
    if isinstance(value, str) and negative:
        value = value[1:]
    amount, currency, problem = money_of({**money, "value": value}, label)
    if problem or not isinstance(amount, int):
        return 0, currency, problem or f"{label}.value is not an amount"
    return (-amount if negative else amount), currency, None


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
