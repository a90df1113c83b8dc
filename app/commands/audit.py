"""`flask audit`: the ledger held against the provider's own money records, object by object; every break
classified and stored under a stable id with the command that fixes it. It never writes a money table
(docs/design.md, "Books against the provider")."""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

import psycopg

from ..core.errors import ProviderError
from ..core.records import BreakClass, Kind, MoneyRecords, Record
from ..store.db import Pool, transaction
from .reconcile import PLATFORM

# A run without --since reads this far back: a daily run (deploy/systemd/webhook-ledger-audit@.timer) overlaps the
# previous one by 12 hours.
DEFAULT_WINDOW = timedelta(hours=36)
# Items younger than this are pending, not broken: a provider sends an event seconds after the money moves (Stripe
# does), and a delivery lost meanwhile is recovered by the hourly reconcile; an hour and a half covers one reconcile
# run and its random delay (deploy/systemd/webhook-ledger-reconcile@.timer).
DEFAULT_GRACE = timedelta(minutes=90)
# The provider is read this much further back than --since, only to find the provider's record of a ledger item
# made in the window: the ledger learns of a payment after the provider makes it, by up to its retries (Stripe's
# three days; a ledger item recovered later than that, by reconcile, shows as missing_at_provider: rerun wider).
LOOKBACK = timedelta(days=3)
# Keys looked up in the ledger per query.
BATCH = 1000
# missing_in_ledger breaks whose stored failed event is looked for (to suggest replaying it): a scan each.
EVENT_LOOKUPS = 50
# The key of a provider record that names no id (PayPal's disputes), before it is matched by amount.
AMOUNT_ONLY = "amount-only:"
# The prefix of an adjustment's reason that corrects a break: `flask ledger adjust ... --reason "audit brk_...: ..."`.
TAG = "audit "


# Breaks where money is known to be in the wrong place: alerted on when they persist (deploy/prometheus/alerts.yml).
PRIORITY = frozenset(BreakClass) - {BreakClass.MATCHED_BY_AMOUNT_ONLY, BreakClass.UNKNOWN_PROVIDER_TYPE}


class Verdict(StrEnum):
    """audit_runs.verdict; the exit status is EXIT[verdict]."""

    RUNNING = "running"
    RECONCILED = "reconciled"
    RECONCILED_WITH_PENDING = "reconciled_with_pending"
    BREAKS = "breaks"
    INCOMPLETE = "incomplete"


EXIT = {Verdict.RECONCILED: 0, Verdict.RECONCILED_WITH_PENDING: 0, Verdict.BREAKS: 1, Verdict.INCOMPLETE: 2}


class PayoutCheck(NamedTuple):
    payout: str
    amount: int
    currency: str
    transactions: int  # how many it paid out (its own transaction aside)
    net: int  # their net sum
    checked: bool  # False: a manual payout


@dataclass(slots=True)
class Seen:
    """The provider's side of one object, from all its records."""

    kind: Kind
    key: str
    payment: str
    amount: int
    currency: str
    user: str | None
    reversed: bool
    created: int  # its earliest record in the window (0: only before it)
    latest: int  # its latest record
    gross: dict[str, int]  # its records' gross amounts, by their currency
    pending: bool = False  # not settled yet at the provider: pending whatever its age

    @property
    def signed(self) -> int:
        """What the object moved for its user, as the ledger signs it."""
        if self.kind == Kind.PAYMENT:
            return self.amount
        return 0 if self.reversed else -self.amount


class Break(NamedTuple):
    break_id: str
    klass: BreakClass
    provider_key: str | None
    ledger_key: str | None
    provider_amount: int | None
    ledger_amount: int | None
    provider_currency: str | None
    ledger_currency: str | None
    provider_user: str | None
    ledger_user: str | None
    occurred_at: datetime
    detail: str
    fix: str


class Pending(NamedTuple):
    key: str
    kind: str
    provider_amount: int | None
    ledger_amount: int | None
    occurred_at: datetime
    why: str


@dataclass
class Statement:
    """One currency's: the ledger's sum and the provider's (of the objects audited), and what explains the gap."""

    ledger: int = 0
    provider: int = 0  # gross, of every record of the objects audited (those before the window too)
    pending: int = 0  # provider minus ledger, of pending objects
    breaks: int = 0  # provider minus ledger, of broken objects
    # provider minus ledger of what the ledger holds no money for on purpose: payments its source's policy ignores
    # (no user), and a credit in another currency that an operator undid (currency_mismatch fixed).
    set_aside: int = 0
    fees: int = 0  # of every record in the window
    non_user: dict[str, int] = field(default_factory=dict)  # by category, of the window's non-user records
    non_user_count: dict[str, int] = field(default_factory=dict)
    unknown: int = 0  # gross, of records of unknown types

    @property
    def residual(self) -> int:
        return self.provider - self.ledger - self.pending - self.breaks - self.set_aside

    def as_json(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "provider": self.provider, "difference": self.provider - self.ledger,
                "explained": {"pending": self.pending, "breaks": self.breaks, "set_aside": self.set_aside},
                "residual": self.residual, "fees": self.fees, "non_user": self.non_user,
                "non_user_count": self.non_user_count, "unknown_types": self.unknown,
                "provider_net": self.provider - self.fees + sum(self.non_user.values()) + self.unknown}


@dataclass
class Run:
    source: str
    provider: str
    account: str | None
    since: datetime
    until: datetime
    grace: timedelta
    verdict: Verdict = Verdict.RUNNING
    reason: str = ""
    run_id: int | None = None
    listed: int = 0
    objects: dict[str, int] = field(default_factory=dict)  # audited, by kind
    statements: dict[str, Statement] = field(default_factory=dict)
    breaks: list[Break] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    new: int = 0
    resolved: int = 0
    payouts: list[PayoutCheck] | None = None  # with --payouts
    what: str = "records"  # what the provider's records are called (MoneyRecords.what)

    def statement(self, currency: str) -> Statement:
        return self.statements.setdefault(currency, Statement())

    def as_json(self) -> dict[str, Any]:
        return {
            "header": {"run": self.run_id, "source": self.source, "provider": self.provider,
                       "account": self.account, "since": _iso(self.since), "until": _iso(self.until),
                       "grace_seconds": int(self.grace.total_seconds()), "verdict": str(self.verdict),
                       "reason": self.reason, "listed": self.listed, "objects": self.objects},
            "statements": {currency: statement.as_json() for currency, statement in sorted(self.statements.items())},
            "breaks": [_shown(b) for b in self.breaks],
            "pending": [{**p._asdict(), "occurred_at": _iso(p.occurred_at)} for p in self.pending],
            "payouts": None if self.payouts is None else [check._asdict() for check in self.payouts],
        }


def _shown(found: Break) -> dict[str, Any]:
    shown = found._asdict()
    shown["class"] = str(shown.pop("klass"))
    shown["occurred_at"] = _iso(found.occurred_at)
    return shown


def break_id(klass: BreakClass, source: str, account: str | None, key: str) -> str:
    """A break's stable id: the same class and keys give the same id in every run."""
    digest = hashlib.sha256(f"{klass}\x00{source}\x00{account or PLATFORM}\x00{key}".encode()).hexdigest()
    return f"brk_{digest[:20]}"


# -- the ledger's side ----------------------------------------------------------------------------------

LEDGER_PAYMENTS = """
    SELECT p.payment_id, p.user_id::text, p.amount_cents, p.currency, p.created_at,
           p.refunded_cents - coalesce((SELECT sum(m.amount_cents) FROM movements m WHERE m.source = p.source
                                         AND m.payment_id = p.payment_id AND m.kind = 'refund'), 0) AS uncovered
    FROM payments p WHERE p.source = %(source)s AND p.payment_id = ANY(%(keys)s)
"""
LEDGER_MOVEMENTS = """
    SELECT m.kind, m.movement_id, m.payment_id, m.amount_cents, m.state, m.created_at, p.user_id::text, p.currency
    FROM movements m JOIN payments p USING (source, payment_id)
    WHERE m.source = %(source)s AND m.kind = %(kind)s AND m.movement_id = ANY(%(keys)s)
"""
IGNORED = "SELECT payment_id FROM ignored_payments WHERE source = %(source)s AND payment_id = ANY(%(keys)s)"
# The ledger's items made in the window, of the account audited: those the provider listed no record of are
# missing at the provider.
SCOPE = """(CASE WHEN %(account)s = '' THEN {key} !~ '^acct_[A-Za-z0-9]+/'
                 ELSE starts_with({key}, %(account)s || '/') END)"""
LEDGER_PAYMENTS_MADE = f"""
    SELECT payment_id, user_id::text, amount_cents, currency, created_at FROM payments
    WHERE source = %(source)s AND created_at >= %(since)s AND created_at < %(until)s
      AND {SCOPE.format(key="payment_id")}
"""
LEDGER_MOVEMENTS_MADE = f"""
    SELECT m.kind, m.movement_id, m.payment_id, m.amount_cents, m.state, m.created_at, p.user_id::text, p.currency
    FROM movements m JOIN payments p USING (source, payment_id)
    WHERE m.source = %(source)s AND m.created_at >= %(since)s AND m.created_at < %(until)s
      AND {SCOPE.format(key="m.movement_id")}
"""
# Operators' adjustments that correct a break (their reason names it), by the object the break is of.
CORRECTIONS = """
    SELECT b.class, coalesce(b.ledger_key, b.provider_key), j.user_id::text, sum(j.amount_cents)
    FROM ledger_journal j
    JOIN audit_breaks b ON b.source = %(source)s AND b.break_id = substring(j.reason FROM '^audit (brk_[0-9a-f]{20})')
    WHERE j.kind = 'adjustment' AND j.reason LIKE 'audit brk\\_%%'
    GROUP BY 1, 2, 3
"""
CURRENCY = "SELECT currency FROM ledger_currency"


class Ledger(NamedTuple):
    """The ledger's side of one object."""

    key: str
    user: str
    amount: int
    currency: str
    reversed: bool
    created_at: datetime
    uncovered: int = 0  # a payment's refunds by running total that no refund object accounts for

    def signed(self, kind: Kind) -> int:
        if kind == Kind.PAYMENT:
            return self.amount
        return 0 if self.reversed else -self.amount


# -- the run ----------------------------------------------------------------------------------------------

START_RUN = """
    INSERT INTO audit_runs (source, account, since, until, grace_seconds)
    VALUES (%(source)s, %(account)s, %(since)s, %(until)s, %(grace)s) RETURNING id
"""
FINISH_RUN = """
    UPDATE audit_runs SET verdict = %(verdict)s, reason = %(reason)s, listed = %(listed)s, pending = %(pending)s,
           breaks = %(breaks)s, statements = %(statements)s, finished_at = now()
    WHERE id = %(id)s
"""
SAVE_BREAK = """
    INSERT INTO audit_breaks (source, break_id, account, class, priority, status, provider_key, ledger_key,
                              provider_amount, ledger_amount, provider_currency, ledger_currency, provider_user,
                              ledger_user, occurred_at, detail, fix, first_run, last_run)
    VALUES (%(source)s, %(break_id)s, %(account)s, %(class)s, %(priority)s, 'new', %(provider_key)s, %(ledger_key)s,
            %(provider_amount)s, %(ledger_amount)s, %(provider_currency)s, %(ledger_currency)s, %(provider_user)s,
            %(ledger_user)s, %(occurred_at)s, %(detail)s, %(fix)s, %(run)s, %(run)s)
    ON CONFLICT (source, break_id) DO UPDATE SET
        status = CASE WHEN audit_breaks.status = 'resolved' THEN 'new' ELSE 'persisting' END,
        runs_seen = CASE WHEN audit_breaks.status = 'resolved' THEN 1 ELSE audit_breaks.runs_seen + 1 END,
        provider_amount = EXCLUDED.provider_amount, ledger_amount = EXCLUDED.ledger_amount,
        provider_currency = EXCLUDED.provider_currency, ledger_currency = EXCLUDED.ledger_currency,
        provider_user = EXCLUDED.provider_user, ledger_user = EXCLUDED.ledger_user, detail = EXCLUDED.detail,
        fix = EXCLUDED.fix, last_run = EXCLUDED.last_run, last_seen_at = now(), resolved_run = NULL,
        resolved_at = NULL
    RETURNING status
"""
# A run that read its window whole resolves the open breaks of its account in that window that it did not find.
RESOLVE = """
    UPDATE audit_breaks SET status = 'resolved', resolved_run = %(run)s, resolved_at = now()
    WHERE source = %(source)s AND account = %(account)s AND status <> 'resolved' AND last_run <> %(run)s
      AND occurred_at >= %(since)s AND occurred_at < %(until)s
      AND (%(payouts)s OR coalesce(provider_key, '') !~ '(^|/)payout/')  -- a run without --payouts read none
"""


def audit(pool: Pool, source: str, records: MoneyRecords, since: datetime, until: datetime, grace: timedelta,
          now: datetime | None = None, fixes: "Fixes | None" = None, payouts: bool = False) -> Run:
    """Read the provider's records of [since, until), match them with the ledger object by object, and record the
    run and its breaks (never a money table). A read that fails midway ends the run incomplete, with its reason."""
    now = now or datetime.now(UTC)
    account = records.account
    run = Run(source, records.name, account, since, until, grace, what=records.what)
    fixes = fixes or Fixes(source, account)
    with transaction(pool) as conn:
        run.run_id = conn.execute(START_RUN, {"source": source, "account": account or PLATFORM, "since": since,
                                              "until": until, "grace": int(grace.total_seconds())}
                                  ).fetchone()[0]  # type: ignore[index]
    seen: dict[tuple[Kind, str], Seen] = {}
    unknown: list[Record] = []
    start = int(since.timestamp())
    try:
        # No provider has a record before the Unix epoch: a --since before it lists from there.
        for page in records.pages(max(start - int(LOOKBACK.total_seconds()), 0), int(until.timestamp())):
            for record in page:
                _take(run, seen, unknown, record, record.created >= start)
        if payouts:
            _check_payouts(run, records, start, int(until.timestamp()))
    except ProviderError as exc:
        run.verdict, run.reason = Verdict.INCOMPLETE, f"the provider's records could not be read whole: {exc}"
        run.breaks = []  # a partial read records no break and resolves none
        _finish(pool, run)
        return run
    with transaction(pool) as conn:
        _match(conn, run, seen, fixes, now, start, records)
    for record in unknown:
        run.breaks.append(Break(break_id(BreakClass.UNKNOWN_PROVIDER_TYPE, source, account, record.txn),
                                BreakClass.UNKNOWN_PROVIDER_TYPE, record.txn, None, record.amount, None,
                                record.currency, None, None, None, _at(record.created),
                                record.unknown or "?", fixes.unknown(record)))
    _residuals(run)
    # A record the adapter cannot read makes the run incomplete; one matched by amount only is flagged, not broken.
    money_breaks = any(b.klass in PRIORITY for b in run.breaks)
    if unknown:
        run.verdict = Verdict.INCOMPLETE
        run.reason = (f"{len(unknown)} record(s) the {records.name} adapter cannot read (an unknown type, or a "
                      "source it cannot key): their objects are stopped, not guessed")
    elif money_breaks:
        run.verdict = Verdict.BREAKS
    else:
        run.verdict = Verdict.RECONCILED_WITH_PENDING if run.pending else Verdict.RECONCILED
    _finish(pool, run, whole=True)
    return run


def _check_payouts(run: Run, records: MoneyRecords, since: int, until: int) -> None:
    """Each paid payout of the window against the net sum of the transactions it paid out (its own aside): a payout
    that differs is an amount_mismatch break keyed payout/<id>."""
    run.payouts = []
    for payout in records.payouts(since, until):
        if not payout.automatic:
            run.payouts.append(PayoutCheck(payout.id, payout.amount, payout.currency, 0, 0, False))
            continue
        count = net = 0
        for page in records.paid_out(payout.id):
            for record in page:
                if record.type != "payout":
                    count, net = count + 1, net + record.amount - record.fee
        run.payouts.append(PayoutCheck(payout.id, payout.amount, payout.currency, count, net, True))
        if net != payout.amount:
            key = f"{run.account}/payout/{payout.id}" if run.account else f"payout/{payout.id}"
            klass = BreakClass.AMOUNT_MISMATCH
            run.breaks.append(Break(break_id(klass, run.source, run.account, key), klass, key, None, payout.amount,
                                    net, payout.currency, payout.currency, None, None, _at(payout.created),
                                    f"payout {payout.id} paid {payout.amount} {payout.currency}, its {count} "
                                    f"transactions add up to {net}", f"none: read {payout.id} in the provider's "
                                    "dashboard (its payout reconciliation report)"))


def _take(run: Run, seen: dict[tuple[Kind, str], Seen], unknown: list[Record], record: Record,
          in_window: bool) -> None:
    """Add one record to what the provider says, and to its currency's statement when it is in the window."""
    if in_window:
        run.listed += 1
        statement = run.statement(record.currency)
        statement.fees += record.fee
    if isinstance(record.money, str) or record.unknown is not None:
        if in_window:
            unknown.append(record._replace(unknown=record.unknown or str(record.money)))
            run.statement(record.currency).unknown += record.amount
        return
    if record.money is None:
        if in_window:
            statement.non_user[record.category] = statement.non_user.get(record.category, 0) + record.amount
            statement.non_user_count[record.category] = statement.non_user_count.get(record.category, 0) + 1
        return
    money = record.money
    if not money.key:  # no id at the provider (PayPal's disputes): matched by amount, one object per record
        money = money._replace(key=f"{AMOUNT_ONLY}{record.txn}")
    found = seen.get((money.kind, money.key))
    if found is None:
        found = seen[money.kind, money.key] = Seen(money.kind, money.key, money.payment, 0, money.currency,
                                                   money.user, False, 0, record.created, {})
        if money.kind != Kind.PAYMENT:
            found.amount = money.amount
    if money.kind == Kind.PAYMENT:
        found.amount += money.amount  # one charge per payment; a second one is money too
    found.reversed = found.reversed or money.reversal
    found.pending = found.pending or record.pending
    found.latest = max(found.latest, record.created)
    found.gross[record.currency] = found.gross.get(record.currency, 0) + record.amount  # all of it: see Statement
    if in_window:
        found.created = min(found.created or record.created, record.created)


def _match(conn: psycopg.Connection[Any], run: Run, seen: dict[tuple[Kind, str], Seen], fixes: "Fixes",
           now: datetime, start: int, records_delay: object = None) -> None:
    """Each object the provider has in the window against the ledger's, then each the ledger made in the window
    that the provider has no record of."""
    source, account = run.source, run.account
    ledger_currency = (conn.execute(CURRENCY).fetchone() or ("?",))[0]
    corrections, moved = _corrections(conn, source)
    fixes.bind(conn, ledger_currency)
    # An item made after this is pending: the grace, or the provider's own delay in listing if longer (PayPal's).
    young = now - max(run.grace, getattr(records_delay, "delay", timedelta(0)))
    audited = [item for item in seen.values() if item.created]
    for kind in Kind:
        items = [item for item in audited if item.kind == kind]
        run.objects[str(kind)] = len(items)
        for first in range(0, len(items), BATCH):
            batch = items[first:first + BATCH]
            ledger = _ledger(conn, source, kind, [item.key for item in batch])
            ignored = _ignored(conn, source, [item.payment for item in batch])
            uncovered = _uncovered(conn, source, [item.payment for item in batch]) if kind == Kind.REFUND else {}
            for item in batch:
                if item.key.startswith(AMOUNT_ONLY):
                    _by_amount(conn, run, seen, item, fixes, young, ledger_currency)
                    continue
                _judge(run, item, ledger.get(item.key), item.payment in ignored, uncovered, corrections, moved,
                       fixes, young, ledger_currency)
    params = {"source": source, "account": account or PLATFORM, "since": run.since, "until": run.until}
    for row in conn.execute(LEDGER_PAYMENTS_MADE, params):
        _ledger_only(run, seen, Kind.PAYMENT, Ledger(row[0], row[1], row[2], row[3], False, row[4]), corrections,
                     fixes, young)
    for row in conn.execute(LEDGER_MOVEMENTS_MADE, params):
        _ledger_only(run, seen, Kind(row[0]), Ledger(row[1], row[6], row[3], row[7], row[4] == "reversed", row[5]),
                     corrections, fixes, young)


DISPUTES_OF = """
    SELECT m.movement_id, m.amount_cents, m.state, m.created_at, p.user_id::text, p.currency
    FROM movements m JOIN payments p USING (source, payment_id)
    WHERE m.source = %(source)s AND m.kind = 'dispute' AND m.payment_id = %(payment)s ORDER BY m.created_at
"""


def _by_amount(conn: psycopg.Connection[Any], run: Run, seen: dict[tuple[Kind, str], Seen], item: Seen,
               fixes: "Fixes", young: datetime, ledger_currency: str) -> None:
    """A provider dispute record with no id: the ledger's dispute of the same payment and amount, flagged
    matched_by_amount_only (never missing); none of that amount: missing_in_ledger."""
    for key, cents, state, created_at, user, currency in conn.execute(
            DISPUTES_OF, {"source": run.source, "payment": item.payment}):
        if cents == item.amount and (Kind.DISPUTE, key) not in seen:
            ledger = Ledger(key, user, cents, currency, state == "reversed", created_at)
            seen[Kind.DISPUTE, key] = item  # the ledger's dispute is the provider's: not missing at the provider
            _finding(run, item, ledger, BreakClass.MATCHED_BY_AMOUNT_ONLY, False, fixes,
                     f"the provider's dispute money of payment {item.payment} ({item.amount} {item.currency}) names "
                     f"no dispute: matched to the ledger's {key} by amount", ledger_currency)
            return
    _judge(run, item, None, False, {}, {}, {}, fixes, young, ledger_currency)


def _ledger(conn: psycopg.Connection[Any], source: str, kind: Kind, keys: list[str]) -> dict[str, Ledger]:
    if kind == Kind.PAYMENT:
        return {row[0]: Ledger(row[0], row[1], row[2], row[3], False, row[4], row[5])
                for row in conn.execute(LEDGER_PAYMENTS, {"source": source, "keys": keys})}
    return {row[1]: Ledger(row[1], row[6], row[3], row[7], row[4] == "reversed", row[5])
            for row in conn.execute(LEDGER_MOVEMENTS, {"source": source, "kind": str(kind), "keys": keys})}


def _ignored(conn: psycopg.Connection[Any], source: str, payments: list[str]) -> set[str]:
    return {row[0] for row in conn.execute(IGNORED, {"source": source, "keys": payments})}


def _uncovered(conn: psycopg.Connection[Any], source: str, payments: list[str]) -> dict[str, int]:
    """Per payment: what its running total refunded beyond its refund objects (a refund known only by total)."""
    return {row[0]: row[5] for row in conn.execute(LEDGER_PAYMENTS, {"source": source, "keys": payments})}


def _corrections(conn: psycopg.Connection[Any], source: str
                 ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Operators' adjustments tagged with a break, per object key: their sum, and (user_mismatch) per user."""
    sums: dict[str, int] = {}
    moved: dict[str, dict[str, int]] = {}
    for klass, key, user, cents in conn.execute(CORRECTIONS, {"source": source}):
        if klass == BreakClass.USER_MISMATCH:
            moved.setdefault(key, {})[user] = moved.get(key, {}).get(user, 0) + int(cents)
        else:
            sums[key] = sums.get(key, 0) + int(cents)
    return sums, moved


def _judge(run: Run, item: Seen, ledger: Ledger | None, ignored: bool, uncovered: dict[str, int],
           corrections: dict[str, int], moved: dict[str, dict[str, int]], fixes: "Fixes", young: datetime,
           ledger_currency: str) -> None:
    """One object the provider has: matched, pending, ignored, or its breaks."""
    provider_signed = item.signed
    pending = _at(item.latest) > young
    if item.pending:  # captured, not settled yet: whatever the ledger says, the provider has not settled it
        _finding(run, item, ledger, BreakClass.MISSING_AT_PROVIDER, True, fixes,
                 "captured at the provider, not settled yet", ledger_currency)
        return
    if ledger is None:
        if ignored:  # the source's policy ignores its payment (no user): explained, not a break
            _set_aside(run, item)
            return
        if item.kind == Kind.REFUND and uncovered.get(item.payment, 0) >= item.amount:
            uncovered[item.payment] -= item.amount  # the ledger took it by the charge's running total
            _add(run, item, provider_signed, ledger_currency)
            return
        _finding(run, item, None, BreakClass.MISSING_IN_LEDGER, pending, fixes,
                 f"{item.kind} {item.key} of {_money(item.amount, item.currency)}: the provider moved it, the ledger "
                 "has no record of it", ledger_currency)
        return
    effective = ledger.signed(item.kind) + corrections.get(item.key, 0)
    klass: BreakClass | None = None
    if item.currency != ledger.currency and effective == 0:
        _set_aside(run, item)  # the credit in the wrong currency was undone: the ledger holds none of it
        return
    if item.currency != ledger.currency:
        klass, why = BreakClass.CURRENCY_MISMATCH, (f"the provider's {item.kind} is in {item.currency}, the "
                                                    f"ledger's in {ledger.currency}")
    elif effective != provider_signed:
        if item.kind != Kind.PAYMENT and item.reversed != ledger.reversed:
            klass, why = BreakClass.STATE_MISMATCH, (
                f"the provider's {item.kind} is {'reversed' if item.reversed else 'applied'} (failed or reinstated:"
                f" {item.reversed}), the ledger's {'reversed' if ledger.reversed else 'applied'}")
        else:
            klass, why = BreakClass.AMOUNT_MISMATCH, (f"the provider's {item.kind} moved {provider_signed}, the "
                                                      f"ledger's {effective}")
    if klass is not None:
        _finding(run, item, ledger, klass, pending, fixes, why, ledger_currency, effective)
        return
    if item.user is not None and item.user != ledger.user:
        shifted = moved.get(item.key, {})
        if not (shifted.get(ledger.user) == -ledger.amount and shifted.get(item.user) == ledger.amount):
            _finding(run, item, ledger, BreakClass.USER_MISMATCH, pending, fixes,
                     f"the provider's metadata names user {item.user}, the ledger credited {ledger.user}",
                     ledger_currency, effective)
            return
    _add(run, item, effective, ledger_currency)


def _set_aside(run: Run, item: Seen) -> None:
    for currency, gross in item.gross.items():
        run.statement(currency).provider += gross
        run.statement(currency).set_aside += gross


def _add(run: Run, item: Seen, ledger_signed: int, ledger_currency: str) -> None:
    """A matched object's sums, into its currencies' statements."""
    for currency, gross in item.gross.items():
        run.statement(currency).provider += gross
    run.statement(ledger_currency).ledger += ledger_signed


def _finding(run: Run, item: Seen, ledger: Ledger | None, klass: BreakClass, pending: bool, fixes: "Fixes",
             why: str, ledger_currency: str, effective: int | None = None) -> None:
    """A break of an object the provider has (or, young, a pending item), with its statement lines."""
    ledger_signed = (ledger.signed(item.kind) if ledger else 0) if effective is None else effective
    for currency, gross in item.gross.items():
        statement = run.statement(currency)
        statement.provider += gross
        if pending:
            statement.pending += gross
        else:
            statement.breaks += gross
    statement = run.statement(ledger.currency if ledger else ledger_currency)
    statement.ledger += ledger_signed
    if pending:
        statement.pending -= ledger_signed
        run.pending.append(Pending(item.key, str(item.kind), item.signed, ledger_signed if ledger else None,
                                   _at(item.latest), f"{klass}: {why}"))
        return
    statement.breaks -= ledger_signed
    run.breaks.append(Break(break_id(klass, run.source, run.account, item.key), klass, item.key,
                            ledger.key if ledger else None, item.signed, ledger_signed if ledger else None,
                            item.currency, ledger.currency if ledger else None, item.user,
                            ledger.user if ledger else None, _at(item.created), why,
                            fixes.suggest(klass, item, ledger, ledger_signed)))


def _ledger_only(run: Run, seen: dict[tuple[Kind, str], Seen], kind: Kind, ledger: Ledger,
                 corrections: dict[str, int], fixes: "Fixes", young: datetime) -> None:
    """A ledger item made in the window: missing at the provider unless the provider has a record of it."""
    if (kind, ledger.key) in seen:
        return
    effective = ledger.signed(kind) + corrections.get(ledger.key, 0)
    if effective == 0:
        run.statement(ledger.currency).ledger += 0  # corrected to nothing (or a refund given back): nothing owed
        return
    statement = run.statement(ledger.currency)
    statement.ledger += effective
    if ledger.created_at > young:
        statement.pending -= effective
        run.pending.append(Pending(ledger.key, str(kind), None, effective, ledger.created_at,
                                   f"{BreakClass.MISSING_AT_PROVIDER}: no provider record yet"))
        return
    statement.breaks -= effective
    klass = BreakClass.MISSING_AT_PROVIDER
    run.breaks.append(Break(break_id(klass, run.source, run.account, ledger.key), klass, None, ledger.key, None,
                            effective, None, ledger.currency, None, ledger.user, ledger.created_at,
                            f"{kind} {ledger.key} of {_money(ledger.amount, ledger.currency)}: in the ledger, but the "
                            "provider has no record of it", fixes.adjust(klass, ledger.key, ledger.user,
                                                                          -effective, "no provider record")))


def _residuals(run: Run) -> None:
    """A currency whose statement does not add up is itself a break (its residual, keyed by the currency)."""
    for currency, statement in sorted(run.statements.items()):
        if statement.residual:
            key = f"statement/{currency}"
            run.breaks.append(Break(break_id(BreakClass.AMOUNT_MISMATCH, run.source, run.account, key),
                                    BreakClass.AMOUNT_MISMATCH, key, key, statement.provider, statement.ledger,
                                    currency, currency, None, None, run.since,
                                    f"the {currency} statement leaves a residual of {statement.residual}: the "
                                    "provider's gross amounts differ from its objects' own (a conversion?)",
                                    "none: read the transactions in the provider's dashboard"))


def _finish(pool: Pool, run: Run, whole: bool = False) -> None:
    """Record the run's end and its breaks; a run that read its window whole resolves those it no longer finds."""
    statements = json.dumps({currency: s.as_json() for currency, s in sorted(run.statements.items())})
    params = {"source": run.source, "account": run.account or PLATFORM, "run": run.run_id}
    with transaction(pool) as conn:
        for found in run.breaks:
            status = conn.execute(SAVE_BREAK, {
                **params, **found._asdict(), "class": str(found.klass), "priority": found.klass in PRIORITY,
            }).fetchone()[0]  # type: ignore[index]
            run.new += status == "new"
        if whole:
            run.resolved = conn.execute(RESOLVE, {**params, "since": run.since, "until": run.until,
                                                  "payouts": run.payouts is not None}).rowcount
        conn.execute(FINISH_RUN, {"id": run.run_id, "verdict": str(run.verdict), "reason": run.reason,
                                  "listed": run.listed, "pending": len(run.pending), "breaks": len(run.breaks),
                                  "statements": statements})


# -- the fixing commands ----------------------------------------------------------------------------

class Fixes:
    """The command that fixes each break, as an operator types it."""

    def __init__(self, source: str, account: str | None) -> None:
        self.source, self.account = source, account
        self._conn: psycopg.Connection[Any] | None = None
        self._lookups = 0

    def bind(self, conn: psycopg.Connection[Any], ledger_currency: str) -> None:
        self._conn, self.ledger_currency = conn, ledger_currency

    def suggest(self, klass: BreakClass, item: Seen, ledger: Ledger | None, ledger_signed: int) -> str:
        if klass == BreakClass.MISSING_IN_LEDGER:
            return self._missing(item)
        assert ledger is not None
        if klass == BreakClass.MATCHED_BY_AMOUNT_ONLY:
            return f"none: check {ledger.key} against the provider's dispute of {item.payment} in its dashboard"
        if klass == BreakClass.STATE_MISMATCH and item.reversed:
            return self.reconcile(item.latest)  # its failure or reinstatement was lost: its event applies it
        if klass == BreakClass.USER_MISMATCH:
            tag = self.tag(klass, item.key, f"credited to {ledger.user}, the provider names {item.user}")
            return (f"flask ledger adjust {ledger.user} {-ledger.amount} --reason {tag} && "
                    f"flask ledger adjust {item.user} {ledger.amount} --reason {tag}")
        target = 0 if klass == BreakClass.CURRENCY_MISMATCH else item.signed
        return self.adjust(klass, item.key, ledger.user, target - ledger_signed, str(klass))

    def adjust(self, klass: BreakClass, key: str, user: str, cents: int, why: str) -> str:
        return f"flask ledger adjust {user} {cents} --reason {self.tag(klass, key, why)}"

    def tag(self, klass: BreakClass, key: str, why: str) -> str:
        return _quote(f"{TAG}{break_id(klass, self.source, self.account, key)}: {key} {why}")

    def reconcile(self, created: int) -> str:
        window = f"--since {_iso(_at(created - 300))} --until {_iso(_at(created + 300))}"
        whose = f" --account {self.account}" if self.account else ""
        return f"flask reconcile {self.source}{whose} {window}"

    def unknown(self, record: Record) -> str:
        return f"none: read {record.txn} in the provider's dashboard; the adapter must learn its type"

    def _missing(self, item: Seen) -> str:
        """A stored event that failed for want of a user or of its payment is applied where it waits; else the
        provider's event list is read again around the object's time."""
        if self._conn is not None and self._lookups < EVENT_LOOKUPS:
            self._lookups += 1
            from .base import UNAPPLIED, stored_effects  # noqa: PLC0415 - base imports Flask's CLI
            for event_id, _, effect in stored_effects(self._conn, self.source, UNAPPLIED, item.key.rsplit("/", 1)[-1]):
                if effect.payment_id != item.payment:
                    continue
                if item.kind == Kind.PAYMENT and not effect.names_user and effect.problem is None:
                    return f"flask payments assign-user {self.source} {item.key} {item.user or 'USER_ID'}"
                return f"flask events replay {event_id} --source {self.source}"
        return self.reconcile(item.latest)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _money(cents: int, currency: str) -> str:
    return f"{cents} {currency}"
