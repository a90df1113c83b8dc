"""Razorpay's money records for `flask audit`: what each day settled (the settlement recon API) and the payments
captured but not settled yet (docs/providers/razorpay.md, "Reconcile and audit")."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from ...core.errors import ProviderError, ProviderRefusedError, ProviderUnavailableError, RateLimitedError
from ...core.records import Kind, PayoutRecord, ProviderRecord, Record
from ...core.vocabulary import InvalidJSONError, load
from ..budget import Budget, patiently
from ..outbound import Outbound
from .api import API_BASE
from .scheme import NAME, SCHEME

# Sources:
# - https://razorpay.com/docs/api/settlements/fetch-recon: `GET /v1/settlements/recon/combined?year=&month=&day=`,
#   `count` up to 1000 and `skip`: each transaction settled that day, its `type` (payment, refund, adjustment,
#   transfer), `entity_id`, `amount`, `fee`, `tax`, `currency`, `settled_at`, `payment_id`, `dispute_id`;
# - https://razorpay.com/docs/api/payments/fetch-all-payments: `GET /v1/payments?from=&to=`, `count` up to 100 and
#   `skip`: a captured payment that no recon of the window lists is pending, not broken (Razorpay settles on its
#   cycle, days after the capture: https://razorpay.com/docs/payments/settlements).

# The ledger's keys are Razorpay's own ids (app/providers/razorpay/rules.py): a payment's `pay_...`, a refund's
# `rfnd_...`, a dispute's `disp_...` (what it deducted).

RECON_COUNT = 1000  # the most one recon request gives
PAYMENTS_COUNT = 100  # the most Fetch Multiple Payments gives
TIMEOUT = 30  # seconds per request, connection to last byte: a command's, not a delivery's PROVIDER_DEADLINE_MS
MAX_PAGE_BYTES = 16 * 1024 * 1024  # a recon page of RECON_COUNT items, under a KiB each
# Recon types that are not a user's money, summed under their type (https://razorpay.com/docs/api/settlements).
NON_USER = frozenset({"transfer", "adjustment", "settlement", "fee"})


class RazorpaySettlements:
    """One Razorpay account's settled transactions and captured payments, read with its API key."""

    name = NAME
    what = "settlements"
    account: str | None = None  # Razorpay has no connected accounts here

    def __init__(self, api_key: str, api_base: str | None, key_setting: str, budget: Budget | None = None) -> None:
        key_id, _, secret = api_key.partition(":")
        self._auth, self._base = (key_id, secret), api_base or API_BASE
        # One call at a time, each within TIMEOUT, through the outbound calls the service's fetches make; each spends
        # the account's budget, shared with every host's fetches (app/providers/budget.py).
        self._outbound, self._budget = Outbound(1, TIMEOUT), budget
        self._key_setting = key_setting

    def pages(self, since: int, until: int) -> Iterator[list[Record]]:
        """What each day of [since, until) settled (as Records created when settled), then the payments captured in
        the window that none of those settled (pending)."""
        settled: set[str] = set()
        day = datetime.fromtimestamp(since, UTC).replace(hour=0, minute=0, second=0)
        while int(day.timestamp()) < until:
            skip = 0
            while True:
                items = self._call("settlement", "report", {"year": day.year, "month": day.month, "day": day.day,
                                                            "count": RECON_COUNT, "skip": skip})
                page = [self.record(item) for item in items if since <= _int(item.get("settled_at")) < until]
                settled |= {str(item.get("entity_id")) for item in items if item.get("type") == "payment"}
                yield page
                if len(items) < RECON_COUNT:
                    break
                skip += RECON_COUNT
            day += timedelta(days=1)
        skip = 0
        while True:
            items = self._call("payment", "all",
                               {"from": since, "to": until - 1, "count": PAYMENTS_COUNT, "skip": skip})
            yield [self._captured(item) for item in items
                   if item.get("status") == "captured" and item.get("id") not in settled]
            if len(items) < PAYMENTS_COUNT:
                return
            skip += PAYMENTS_COUNT

    def payouts(self, since: int, until: int) -> Iterator[PayoutRecord]:
        raise ProviderError(f"{NAME}: --payouts is Stripe's (a settlement is checked by its recon items)")

    def paid_out(self, payout: str) -> Iterator[list[Record]]:
        raise ProviderError(f"{NAME}: --payouts is Stripe's")

    def _call(self, resource: str, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One request (every call the audit makes to Razorpay is this one): razorpay.Client's resource.method(params)
        over the outbound calls, within the budget (a 429 asked again); its items, or ProviderError."""
        from .client import NoRecordError, calling  # razorpay and requests, on the first call

        def once() -> bytes | None:
            client, transport = calling(self._outbound, self._outbound.deadline(), f"its {resource}s",
                                        None if self._budget is None else self._budget.on(f"{resource}-{method}"),
                                        self._auth, self._base, MAX_PAGE_BYTES)
            with self._outbound.slot(SCHEME):
                getattr(getattr(client, resource), method)(params)
            return transport.body

        try:
            answer = load(patiently(once) or b"")
        except (NoRecordError, ProviderRefusedError):
            raise ProviderError(f"{NAME} refused the request: is {self._key_setting} right?") from None
        except RateLimitedError:
            raise ProviderError(f"{NAME} kept answering 429 (rate limited) for about a minute") from None
        except (ProviderUnavailableError, InvalidJSONError) as exc:
            raise ProviderError(f"{NAME} failed: {exc}") from None
        items = answer.get("items") if isinstance(answer, dict) else None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise ProviderError(f"{NAME} answered a page that is not a collection")
        return items

    def record(self, item: dict[str, Any]) -> Record:
        """A recon item as the ledger's keys see it: credit positive, debit negative."""
        kind = item.get("type") if isinstance(item.get("type"), str) else "?"
        # Gross, as a Stripe balance transaction's amount: a payment's or refund's own amount (credit and debit are
        # what reached the merchant, fees taken), an adjustment's credit less its debit.
        amount = {"payment": 1, "refund": -1}.get(str(kind), 0) * _int(item.get("amount")) or \
            _int(item.get("credit")) - _int(item.get("debit"))
        currency = (item.get("currency") or "?").lower()
        base = Record(str(item.get("entity_id") or "?"), _int(item.get("settled_at")), currency, amount,
                      _int(item.get("fee")) + _int(item.get("tax")), str(kind), str(kind))
        payment, entity = item.get("payment_id"), item.get("entity_id")
        if kind == "payment" and isinstance(entity, str):
            return base._replace(money=ProviderRecord(Kind.PAYMENT, entity, entity, _int(item.get("amount")),
                                                      currency, None, False))
        if kind == "refund" and isinstance(entity, str) and isinstance(payment, str):
            return base._replace(money=ProviderRecord(Kind.REFUND, entity, payment, _int(item.get("amount")),
                                                      currency, None, False))
        if kind == "adjustment" and isinstance(item.get("dispute_id"), str) and isinstance(payment, str):
            return base._replace(money=ProviderRecord(Kind.DISPUTE, item["dispute_id"], payment, -amount, currency,
                                                      None, amount > 0))
        if kind in NON_USER:
            return base
        return base._replace(unknown=f"recon type {kind!r} is not one the Razorpay adapter knows")

    def _captured(self, payment: dict[str, Any]) -> Record:
        """A captured payment no recon of the window settled: pending."""
        currency = (payment.get("currency") or "?").lower()
        cents = _int(payment.get("amount"))
        return Record(str(payment.get("id")), _int(payment.get("created_at")), currency, cents, 0, "captured",
                      "payment", ProviderRecord(Kind.PAYMENT, str(payment.get("id")), str(payment.get("id")), cents,
                                                currency, None, False), pending=True)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
