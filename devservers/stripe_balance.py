"""Stripe's List all balance transactions (`GET /v1/balance_transactions`) for devservers/stripe_stand_in.py, as
https://docs.stripe.com/api/balance_transactions/list documents it, for `flask audit`'s tests and figures.

- newest first ("The transactions are returned in sorted order, with the most recent transactions appearing
  first"); those of one second keep the order they were added in, newest first, so cursors are exact;
- `created` as a Unix time or `created[gt|gte|lt|lte]`; `limit` 1 to 100 (default 10); `starting_after` and
  `ending_before` (https://docs.stripe.com/api/pagination); `type`; `payout` (the transactions a payout paid);
- `expand[]=data.source`: each transaction's `source` the object itself (a Charge, Refund, Dispute, ...), else its
  id (https://docs.stripe.com/expand);
- Connect: with `Stripe-Account: acct_...` the connected account's transactions alone, without it the
  platform's own (https://docs.stripe.com/connect/authentication);
- List all payouts (`GET /v1/payouts`: https://docs.stripe.com/api/payouts/list), newest first, by `created` and
  `status`, paginated the same way; a payout's transactions are those added with its id
  (https://docs.stripe.com/payouts/reconciliation).

A transaction is the Balance Transaction object (https://docs.stripe.com/api/balance_transactions/object): `id`,
`object`, `amount`, `available_on`, `created`, `currency`, `description`, `fee`, `fee_details`, `net`,
`reporting_category`, `source`, `status`, `type`.
"""

import bisect
import threading
from collections.abc import Mapping
from typing import Any


class BalanceTransactions:
    """The balance transactions of the platform and its connected accounts, each account's list kept sorted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str | None, tuple[list[tuple[int, int]], list[dict[str, Any]]]] = {}
        self._places: dict[tuple[str | None, str], tuple[int, int]] = {}  # (account, id) -> its key
        self._added = 0
        self._payouts: dict[str | None, list[dict[str, Any]]] = {}

    def add_payout(self, payout: Mapping[str, Any], account: str | None = None) -> None:
        """Add a Payout object (https://docs.stripe.com/api/payouts/object) to account's payouts."""
        with self._lock:
            self._payouts.setdefault(account, []).append(dict(payout))
            self._payouts[account].sort(key=lambda known: int(known["created"]))

    def list_payouts(self, params: Mapping[str, Any], account: str | None, limit: int,
                     created: tuple[tuple[int, int], tuple[int, int]]) -> dict[str, Any]:
        """GET /v1/payouts: newest first; KeyError(param, cursor) for an unknown cursor."""
        low, high = created[0][0], created[1][0]
        status, after = params.get("status"), params.get("starting_after")
        with self._lock:
            newest = [payout for payout in reversed(self._payouts.get(account, []))
                      if low <= int(payout["created"]) < high and (status is None or payout["status"] == status)]
        if after is not None:
            ids = [payout["id"] for payout in newest]
            if after not in ids:
                raise KeyError("starting_after", after)
            newest = newest[ids.index(after) + 1:]
        return {"object": "list", "url": "/v1/payouts", "has_more": len(newest) > limit, "data": newest[:limit]}

    def add(self, *transactions: Mapping[str, Any], account: str | None = None) -> None:
        """Add transactions (dicts, `source` the whole object) to account's list (None: the platform's own)."""
        with self._lock:
            keys, documents = self._lists.setdefault(account, ([], []))
            for transaction in transactions:
                self._added += 1
                key = (int(transaction["created"]), self._added)
                index = bisect.bisect(keys, key)
                keys.insert(index, key)
                documents.insert(index, dict(transaction))
                self._places[account, transaction["id"]] = key

    def count(self, account: str | None = None) -> int:
        with self._lock:
            return len(self._lists.get(account, ([], []))[0])

    def list(self, params: Mapping[str, Any], account: str | None, limit: int,
             created: tuple[tuple[int, int], tuple[int, int]]) -> dict[str, Any]:
        """The page params ask for, in account's list; KeyError(param, cursor) for an unknown cursor."""
        low, high = created
        expand = params.get("expand") or {}
        expanded = "data.source" in (expand.values() if isinstance(expand, dict) else [expand])
        wanted_type, payout = params.get("type"), params.get("payout")
        after, before = params.get("starting_after"), params.get("ending_before")
        with self._lock:
            keys, documents = self._lists.get(account, ([], []))
            if after is not None:
                high = min(high, self._place(account, after, "starting_after"))
            elif before is not None:
                place = self._place(account, before, "ending_before")
                low = max(low, (place[0], place[1] + 1))
            start, end = bisect.bisect_left(keys, low), bisect.bisect_left(keys, high)
            indexes = range(start, end) if before is not None and after is None else range(end - 1, start - 1, -1)
            found = []
            for index in indexes:
                document = documents[index]
                if wanted_type is not None and document["type"] != wanted_type:
                    continue
                if payout is not None and document.get("payout") != payout:
                    continue
                found.append(document)
                if len(found) > limit:
                    break
        page, has_more = found[:limit], len(found) > limit
        if before is not None and after is None:
            page.reverse()
        data = [_shown(document, expanded) for document in page]
        return {"object": "list", "url": "/v1/balance_transactions", "has_more": has_more, "data": data}

    def _place(self, account: str | None, transaction_id: str, param: str) -> tuple[int, int]:
        place = self._places.get((account, transaction_id))
        if place is None:
            raise KeyError(param, transaction_id)
        return place


def _shown(document: dict[str, Any], expanded: bool) -> dict[str, Any]:
    """A transaction as listed: its source whole when expanded, else the source's id; never the stand-in's own
    `payout` field."""
    shown = {name: value for name, value in document.items() if name != "payout"}
    source = document.get("source")
    if not expanded and isinstance(source, dict):
        shown["source"] = source.get("id")
    return shown


# -- the objects, shaped as Stripe's API reference shows them ---------------------------------------------

def transaction(txn_id: str, created: int, kind: str, category: str, amount: int, source: Any, currency: str = "usd",
                fee: int = 0) -> dict[str, Any]:
    """A Balance Transaction (https://docs.stripe.com/api/balance_transactions/object); source the whole object (or
    its id, or None), listed expanded or not as the request asks."""
    return {"id": txn_id, "object": "balance_transaction", "amount": amount, "available_on": created + 2 * 86400,
            "created": created, "currency": currency, "description": None, "exchange_rate": None, "fee": fee,
            "fee_details": [{"amount": fee, "application": None, "currency": currency, "description": "Stripe fee",
                             "type": "stripe_fee"}] if fee else [],
            "net": amount - fee, "reporting_category": category, "source": source,
            "status": "available", "type": kind}


def charge(intent_id: str, cents: int, currency: str = "usd", user: str | None = None, created: int = 0
           ) -> dict[str, Any]:
    """A captured Charge of a PaymentIntent (https://docs.stripe.com/api/charges/object)."""
    return {"id": f"ch_{intent_id.rsplit('_', 1)[-1]}", "object": "charge", "amount": cents,
            "amount_captured": cents, "amount_refunded": 0, "captured": True, "created": created,
            "currency": currency, "payment_intent": intent_id, "paid": True, "status": "succeeded",
            "metadata": {} if user is None else {"user_id": user}}


def refund(refund_id: str, intent_id: str, cents: int, status: str = "succeeded", currency: str = "usd",
           created: int = 0) -> dict[str, Any]:
    """A Refund (https://docs.stripe.com/api/refunds/object)."""
    return {"id": refund_id, "object": "refund", "amount": cents, "charge": f"ch_{intent_id.rsplit('_', 1)[-1]}",
            "created": created, "currency": currency, "payment_intent": intent_id, "status": status,
            "reason": None, "metadata": {}}


def dispute(dispute_id: str, intent_id: str, cents: int, status: str = "needs_response", currency: str = "usd",
            created: int = 0) -> dict[str, Any]:
    """A Dispute (https://docs.stripe.com/api/disputes/object)."""
    return {"id": dispute_id, "object": "dispute", "amount": cents,
            "charge": f"ch_{intent_id.rsplit('_', 1)[-1]}", "created": created, "currency": currency,
            "payment_intent": intent_id, "status": status, "reason": "fraudulent", "metadata": {}}


def payout(payout_id: str, amount: int, created: int, currency: str = "usd", status: str = "paid") -> dict[str, Any]:
    """An automatic Payout (https://docs.stripe.com/api/payouts/object)."""
    return {"id": payout_id, "object": "payout", "amount": amount, "arrival_date": created + 86400,
            "automatic": True, "created": created, "currency": currency, "method": "standard", "status": status,
            "type": "bank_account", "reconciliation_status": "completed" if status == "paid" else "not_applicable"}
