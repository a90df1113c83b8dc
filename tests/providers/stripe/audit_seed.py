"""A seeded Stripe account for `flask audit`'s tests: payments, refunds (some failed), disputes (some reinstated)
and non-user transactions, each as its events (List Events, which `flask reconcile` applies to the ledger) and as
its balance transactions (List all balance transactions, which the audit reads), with discrepancies injected
between the two, at least per_class of each class the Stripe adapter can meet."""

import itertools
from dataclasses import dataclass, field

from devservers.stripe_balance import charge, dispute, refund, transaction
from tests.helpers import ALICE, BOB
from tests.providers.stripe.events import dispute as dispute_event
from tests.providers.stripe.events import intent_succeeded
from tests.providers.stripe.events import refund as refund_event

# Non-user transactions: (type, reporting_category, sign of the amount)
# (https://docs.stripe.com/reports/balance-transaction-types, https://docs.stripe.com/reports/reporting-categories).
NON_USER = (("stripe_fee", "fee", -1), ("payout", "payout", -1), ("transfer", "transfer", -1),
            ("adjustment", "other_adjustment", 1))
# A type Stripe has not documented (yet): the adapter must stop it, never guess.
UNKNOWN_TYPE = "balance_sweep"


@dataclass
class Seed:
    events: list = field(default_factory=list)  # to list (the ledger gets them by reconcile)
    transactions: list = field(default_factory=list)  # to list as balance transactions
    withheld: dict = field(default_factory=dict)  # break key -> the event the ledger never got
    injected: dict = field(default_factory=dict)  # class -> {key}
    non_user: dict = field(default_factory=dict)  # category -> (count, sum)

    def inject(self, klass, key):
        self.injected.setdefault(klass, set()).add(key)


def seeded(now, payments=400, refunds=40, failed=4, disputes=10, reinstated=3, non_user=20, per_class=4,
           account=None, start=2 * 86400, end=3 * 3600):
    """A Seed of an account (None: the platform's own) whose objects were made between start and end seconds ago."""
    seed = Seed()
    ids = itertools.count(1)
    prefix = f"{account}/" if account else ""
    tag = account[-4:] if account else "plat"
    span = start - end
    total = payments + 8 * per_class
    times = iter(range(now - start, now - end, max(1, span // (total + refunds + disputes + non_user + 4 * per_class))))

    def at():
        return next(times)

    def event(evt, created):
        evt["created"] = created
        if account:
            evt["account"] = account
        return evt

    def txn(created, kind, category, amount, source, currency="usd", fee=0):
        seed.transactions.append(transaction(f"txn_{tag}{next(ids):07d}", created, kind, category, amount, source,
                                             currency, fee))

    def pay(pi, cents, created, user=ALICE, charged=None, currency="usd", charge_user=None, listed=True,
            withhold=False):
        evt = event(intent_succeeded(pi, user=user, cents=cents), created)
        if withhold:
            seed.withheld[prefix + pi] = evt
        else:
            seed.events.append(evt)
        if listed:
            amount = cents if charged is None else charged
            txn(created, "charge", "charge", amount,
                charge(pi, amount, currency, str(charge_user or user), created), currency, fee=30 + amount // 40)

    paid = []
    for n in range(payments):
        pi, cents = f"pi_{tag}{n:06d}", 1000 + n % 37 * 10
        pay(pi, cents, at())
        paid.append((pi, cents))
    for n in range(per_class):
        pay(f"pi_{tag}mil{n}", 700, at(), withhold=True)
        seed.inject("missing_in_ledger", f"{prefix}pi_{tag}mil{n}")
        pay(f"pi_{tag}map{n}", 800, at(), listed=False)
        seed.inject("missing_at_provider", f"{prefix}pi_{tag}map{n}")
        pay(f"pi_{tag}amt{n}", 900, at(), charged=950)
        seed.inject("amount_mismatch", f"{prefix}pi_{tag}amt{n}")
        pay(f"pi_{tag}cur{n}", 1100, at(), currency="eur")
        seed.inject("currency_mismatch", f"{prefix}pi_{tag}cur{n}")
        pay(f"pi_{tag}usr{n}", 1200, at(), charge_user=BOB)
        seed.inject("user_mismatch", f"{prefix}pi_{tag}usr{n}")
    for n in range(refunds):
        pi, cents = paid[n]
        re_id, created, amount = f"re_{tag}{n:05d}", at(), cents // 2
        seed.events.append(event(refund_event(re_id, pi, amount, status="succeeded",
                                              event_type="refund.created"), created))
        txn(created, "refund", "refund", -amount, refund(re_id, pi, amount, created=created))
        if n < failed:
            failed_at = created + 60
            seed.events.append(event(refund_event(re_id, pi, amount, status="failed"), failed_at))
            txn(failed_at, "refund_failure", "refund_failure", amount,
                refund(re_id, pi, amount, "failed", created=created))
    for n in range(per_class):  # a refund that failed at Stripe, whose refund.failed never reached the ledger
        pi, cents = paid[refunds + n]
        re_id, created, amount = f"re_{tag}st{n}", at(), cents // 4
        seed.events.append(event(refund_event(re_id, pi, amount, event_type="refund.created"), created))
        txn(created, "refund", "refund", -amount, refund(re_id, pi, amount, created=created))
        txn(created + 60, "refund_failure", "refund_failure", amount,
            refund(re_id, pi, amount, "failed", created=created))
        seed.withheld[prefix + re_id] = event(refund_event(re_id, pi, amount, status="failed"), created + 60)
        seed.inject("state_mismatch", prefix + re_id)
    for n in range(disputes):
        pi, cents = paid[refunds + per_class + n]
        du_id, created = f"du_{tag}{n:05d}", at()
        seed.events.append(event(dispute_event(du_id, pi, cents), created))
        txn(created, "adjustment", "dispute", -cents, dispute(du_id, pi, cents, created=created), fee=1500)
        if n < reinstated:
            back = created + 120
            seed.events.append(event(dispute_event(du_id, pi, cents, "charge.dispute.funds_reinstated", "won"), back))
            txn(back, "adjustment", "dispute_reversal", cents, dispute(du_id, pi, cents, "won", created=created),
                fee=-1500)
    for n in range(non_user):
        kind, category, sign = NON_USER[n % len(NON_USER)]
        amount = sign * (100 + n)
        txn(at(), kind, category, amount, {"id": f"{kind[:2]}_{tag}{n}", "object": kind})
        count, total_cents = seed.non_user.get(category, (0, 0))
        seed.non_user[category] = (count + 1, total_cents + amount)
    for _ in range(per_class):
        txn(at(), UNKNOWN_TYPE, "other_adjustment", 5, None)
    seed.injected["unknown_provider_type"] = {t["id"] for t in seed.transactions if t["type"] == UNKNOWN_TYPE}
    return seed
