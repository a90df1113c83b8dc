"""The ledger's invariants (docs/design.md), checked on one snapshot: `flask ledger verify`.

- no (source, event id) is stored twice (invariant 5);
- no event is left 'processing': that status never outlives its
  transaction (invariant 2);
- each user's balance = opening balance + the sum of their journal, credits
  and refunds (invariant 5);
- a journal row whose event is still stored belongs to a completed event,
  and a completed payment or refund that is still stored did what its
  stored bytes say (checked against their SHA-256 and read by the same code
  as the receiver's; rows stored before the bytes were kept are read from
  their jsonb copy) (invariants 1 and 6);
- each payment is credited once, by a credit of its own user and amount,
  and its refunds debit, in all, exactly its highest refunded total, never
  more than the payment (invariant 6).
Purged events leave their journal rows behind, so these hold after a purge.
Balances below zero are reported apart: a refund may leave one (the money
went back to the card after the credit was spent), which is not an error.
"""

from typing import Any, NamedTuple

import psycopg
from psycopg.rows import namedtuple_row

from .db import NamedRow
from .events import DEFAULT_POLICY, DEFAULT_SOURCE, RULES, Kind, Policy, StoredBodyError, effect_of, stored_event

DUPLICATED_IDS = """
    SELECT source, event_id, count(*) AS times FROM webhook_events GROUP BY source, event_id HAVING count(*) > 1
    ORDER BY source, event_id
"""
STUCK = "SELECT source, event_id, created_at FROM webhook_events WHERE status = 'processing' ORDER BY created_at"
WRONG_BALANCES = """
    SELECT u.user_id, u.balance_cents, u.opening_balance_cents, coalesce(j.changed, 0) AS changed
    FROM user_balances u
    LEFT JOIN (SELECT user_id, sum(amount_cents) AS changed FROM ledger_journal GROUP BY user_id) j USING (user_id)
    WHERE u.balance_cents <> u.opening_balance_cents + coalesce(j.changed, 0)
    ORDER BY u.user_id
"""
BELOW_ZERO = "SELECT user_id, balance_cents FROM user_balances WHERE balance_cents < 0 ORDER BY user_id"
JOURNAL_OF_UNFINISHED = """
    SELECT j.source, j.event_id, e.status FROM ledger_journal j JOIN webhook_events e USING (source, event_id)
    WHERE e.status <> 'completed' ORDER BY j.source, j.event_id
"""
# Per payment: its credits in the journal, and what its refunds debited.
WRONG_PAYMENTS = """
    SELECT * FROM (
        SELECT p.source, p.payment_id, p.user_id, p.amount_cents, p.refunded_cents,
               count(j.id) FILTER (WHERE j.kind = 'credit') AS credits,
               count(j.id) FILTER (WHERE j.kind = 'credit' AND j.user_id = p.user_id
                                     AND j.amount_cents = p.amount_cents) AS exact_credits,
               -coalesce(sum(j.amount_cents) FILTER (WHERE j.kind = 'refund'), 0) AS debited
        FROM payments p LEFT JOIN ledger_journal j USING (source, payment_id)
        GROUP BY p.source, p.payment_id
    ) t
    WHERE credits <> 1 OR exact_credits <> 1 OR debited <> refunded_cents
    ORDER BY source, payment_id
"""
JOURNAL_WITHOUT_PAYMENT = """
    SELECT j.source, j.event_id, j.payment_id FROM ledger_journal j
    WHERE NOT EXISTS (SELECT 1 FROM payments p WHERE p.source = j.source AND p.payment_id = j.payment_id)
    ORDER BY j.source, j.event_id
"""
# Each completed payment or refund still stored, with its journal row (if any)
# and its payment (if any): what it did, to compare with what its bytes say.
COMPLETED_EFFECTS = """
    SELECT e.source, e.event_id, e.event_type, e.body, e.payload_sha256 AS body_sha256,
           CASE WHEN e.body IS NULL THEN convert_to(e.payload::text, 'UTF8') END AS legacy_text,
           j.kind, j.payment_id, j.user_id, j.amount_cents, p.refunded_cents
    FROM webhook_events e
    LEFT JOIN ledger_journal j USING (source, event_id)
    LEFT JOIN payments p ON p.source = e.source AND p.payment_id = j.payment_id
    WHERE e.status = 'completed' AND e.event_type = ANY(%s)
"""
PAYMENT = "SELECT user_id, amount_cents, refunded_cents FROM payments WHERE source = %s AND payment_id = %s"
COUNTS = """
    SELECT (SELECT count(*) FROM user_balances), (SELECT count(*) FROM webhook_events),
           (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger_journal)
"""


class Counts(NamedTuple):
    users: int
    events: int
    payments: int
    journal: int


class Report(NamedTuple):
    problems: list[str]  # one line per offending row: the ledger is inconsistent
    below_zero: list[str]  # one line per balance below zero: reported, not a problem
    counts: Counts


def check(conn: psycopg.Connection[Any], policy: Policy = DEFAULT_POLICY) -> Report:
    """Return a Report of the ledger's invariants on one snapshot."""
    with conn.transaction():
        # One consistent snapshot, however busy the receiver is, and no
        # statement timeout: the sums read whole tables.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL statement_timeout = 0")
        cur: psycopg.Cursor[NamedRow] = conn.cursor(row_factory=namedtuple_row)
        problems = [f"duplicated event id {r.event_id!r} of source {r.source!r}: stored {r.times} times"
                    for r in cur.execute(DUPLICATED_IDS)]
        problems += [f"stuck event {_name(r.source, r.event_id)}: 'processing' since {r.created_at:%Y-%m-%d %H:%M:%S%z}"
                     for r in cur.execute(STUCK)]
        problems += [f"balance of user {r.user_id}: {r.balance_cents} cents, expected "
                     f"{r.opening_balance_cents + r.changed} (opening {r.opening_balance_cents} + journal {r.changed})"
                     for r in cur.execute(WRONG_BALANCES)]
        problems += [f"journal row of event {_name(r.source, r.event_id)}: the event is {r.status!r}, not completed"
                     for r in cur.execute(JOURNAL_OF_UNFINISHED)]
        problems += [_payment_problem(r) for r in cur.execute(WRONG_PAYMENTS)]
        problems += [f"journal row of event {_name(r.source, r.event_id)}: no payment {r.payment_id!r}"
                     for r in cur.execute(JOURNAL_WITHOUT_PAYMENT)]
        with conn.cursor(name="completed_effects", row_factory=namedtuple_row) as rows:  # streamed, not loaded whole
            rows.execute(COMPLETED_EFFECTS, [list(RULES)])
            problems += [p for row in rows if (p := _effect_problem(cur, policy, row))]
        below_zero = [f"balance of user {r.user_id} is below zero: {r.balance_cents} cents"
                      for r in cur.execute(BELOW_ZERO)]
        row = conn.execute(COUNTS).fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        counts = Counts(*row)
    return Report(problems, below_zero, counts)


def _name(source: str, event_id: str) -> str:
    return repr(event_id) if source == DEFAULT_SOURCE else f"{event_id!r} of source {source!r}"


def _payment_problem(row: NamedRow) -> str:
    name = _name(row.source, row.payment_id)
    if row.credits != 1:
        return f"payment {name}: credited {row.credits} times"
    if row.exact_credits != 1:
        return f"payment {name}: its credit is not {row.amount_cents} cents to {row.user_id}"
    return f"payment {name}: refunds debited {row.debited} cents, its refunded total is {row.refunded_cents}"


def _effect_problem(cur: psycopg.Cursor[NamedRow], policy: Policy, row: NamedRow) -> str | None:
    """Why a completed event's balance change is not what its stored bytes say, or None."""
    name = _name(row.source, row.event_id)
    # Stored before the bytes were kept: its jsonb copy, unchecked.
    body, body_sha256 = (row.body, row.body_sha256) if row.body is not None else (row.legacy_text, None)
    try:
        effect = effect_of(stored_event(row.source, row.event_id, row.event_type, body, body_sha256), policy)
    except StoredBodyError as exc:
        return f"completed event {name}: {exc}"
    if effect.problem:
        return f"completed event {name}: {effect.problem}"
    if row.kind is None:  # no balance change: a payment announced again, or a refunded total already applied
        payment = cur.execute(PAYMENT, [row.source, effect.payment_id]).fetchone()
        if payment is None:
            return f"completed event {name}: no payment {effect.payment_id!r} in the ledger"
        if effect.kind == Kind.CREDIT and (payment.user_id, payment.amount_cents) != (effect.user_id,
                                                                                      effect.amount_cents):
            return f"completed event {name}: payment {effect.payment_id!r} was credited {payment.amount_cents} " \
                   f"cents to {payment.user_id}, its bytes say {effect.amount_cents} cents to {effect.user_id}"
        if effect.kind == Kind.REFUND and payment.refunded_cents < effect.amount_cents:
            return f"completed event {name}: refunded total {effect.amount_cents} cents not applied " \
                   f"(payment {effect.payment_id!r} has {payment.refunded_cents})"
        return None
    if row.kind != effect.kind or row.payment_id != effect.payment_id:
        return f"completed event {name}: journal has a {row.kind} of payment {row.payment_id!r}, its bytes say " \
               f"a {effect.kind} of payment {effect.payment_id!r}"
    if row.kind == Kind.CREDIT and (row.user_id, row.amount_cents) != (effect.user_id, effect.amount_cents):
        return (f"completed event {name}: credit of {row.amount_cents} cents to {row.user_id}, "
                f"its bytes say {effect.amount_cents} cents to {effect.user_id}")
    if row.kind == Kind.REFUND and row.refunded_cents < effect.amount_cents:
        return f"completed event {name}: refunded total {effect.amount_cents} cents, payment has {row.refunded_cents}"
    return None
