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

from typing import NamedTuple

from .events import DEFAULT_POLICY, RULES, Kind, StoredBodyError, effect_of, stored_event

DUPLICATED_IDS = """
    SELECT source, event_id, count(*) FROM webhook_events GROUP BY source, event_id HAVING count(*) > 1
    ORDER BY source, event_id
"""
STUCK = "SELECT source, event_id, created_at FROM webhook_events WHERE status = 'processing' ORDER BY created_at"
WRONG_BALANCES = """
    SELECT u.user_id, u.balance_cents, u.opening_balance_cents, coalesce(j.changed, 0)
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
    SELECT e.source, e.event_id, e.event_type, e.body, e.payload_sha256,
           CASE WHEN e.body IS NULL THEN convert_to(e.payload::text, 'UTF8') END,
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
    problems: list  # one line per offending row: the ledger is inconsistent
    below_zero: list  # one line per balance below zero: reported, not a problem
    counts: Counts


def check(conn, policy=DEFAULT_POLICY):
    """Return a Report of the ledger's invariants on one snapshot."""
    with conn.transaction():
        # One consistent snapshot, however busy the receiver is, and no
        # statement timeout: the sums read whole tables.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL statement_timeout = 0")
        problems = [f"duplicated event id {eid!r} of source {src!r}: stored {n} times"
                    for src, eid, n in conn.execute(DUPLICATED_IDS)]
        problems += [f"stuck event {_name(src, eid)}: 'processing' since {at:%Y-%m-%d %H:%M:%S%z}"
                     for src, eid, at in conn.execute(STUCK)]
        problems += [f"balance of user {user}: {balance} cents, expected {opening + changed} "
                     f"(opening {opening} + journal {changed})"
                     for user, balance, opening, changed in conn.execute(WRONG_BALANCES)]
        problems += [f"journal row of event {_name(src, eid)}: the event is {status!r}, not completed"
                     for src, eid, status in conn.execute(JOURNAL_OF_UNFINISHED)]
        problems += [_payment_problem(*row) for row in conn.execute(WRONG_PAYMENTS)]
        problems += [f"journal row of event {_name(src, eid)}: no payment {pid!r}"
                     for src, eid, pid in conn.execute(JOURNAL_WITHOUT_PAYMENT)]
        with conn.cursor(name="completed_effects") as rows:  # streamed, not loaded whole
            rows.execute(COMPLETED_EFFECTS, [list(RULES)])
            stored = [p for row in rows if (p := _effect_problem(conn, policy, *row))]
        problems += stored
        below_zero = [f"balance of user {user} is below zero: {balance} cents"
                      for user, balance in conn.execute(BELOW_ZERO)]
        counts = Counts(*conn.execute(COUNTS).fetchone())
    return Report(problems, below_zero, counts)


def _name(source, event_id):
    return repr(event_id) if source == "default" else f"{event_id!r} of source {source!r}"


def _payment_problem(source, payment_id, user_id, amount, refunded, credits, exact_credits, debited):
    name = repr(payment_id) if source == "default" else f"{payment_id!r} of source {source!r}"
    if credits != 1:
        return f"payment {name}: credited {credits} times"
    if exact_credits != 1:
        return f"payment {name}: its credit is not {amount} cents to {user_id}"
    return f"payment {name}: refunds debited {debited} cents, its refunded total is {refunded}"


def _effect_problem(conn, policy, source, event_id, event_type, body, sha256, legacy_text,
                    kind, journal_payment, journal_user, journal_cents, refunded):
    name = _name(source, event_id)
    try:
        if body is None:  # stored before the bytes were kept: its jsonb copy, unchecked
            body, sha256 = legacy_text, None
        effect = effect_of(stored_event(source, event_id, event_type, body, sha256), policy)
    except StoredBodyError as exc:
        return f"completed event {name}: {exc}"
    if effect.problem:
        return f"completed event {name}: {effect.problem}"
    if kind is None:  # no balance change: a payment announced again, or a refunded total already applied
        payment = conn.execute(PAYMENT, [source, effect.payment_id]).fetchone()
        if payment is None:
            return f"completed event {name}: no payment {effect.payment_id!r} in the ledger"
        if effect.kind == Kind.CREDIT and payment[:2] != (effect.user_id, effect.amount_cents):
            return f"completed event {name}: payment {effect.payment_id!r} was credited {payment[1]} cents " \
                   f"to {payment[0]}, its bytes say {effect.amount_cents} cents to {effect.user_id}"
        if effect.kind == Kind.REFUND and payment[2] < effect.amount_cents:
            return f"completed event {name}: refunded total {effect.amount_cents} cents not applied " \
                   f"(payment {effect.payment_id!r} has {payment[2]})"
        return None
    if kind != effect.kind or journal_payment != effect.payment_id:
        return f"completed event {name}: journal has a {kind} of payment {journal_payment!r}, its bytes say " \
               f"a {effect.kind} of payment {effect.payment_id!r}"
    if kind == Kind.CREDIT and (journal_user, journal_cents) != (effect.user_id, effect.amount_cents):
        return (f"completed event {name}: credit of {journal_cents} cents to {journal_user}, "
                f"its bytes say {effect.amount_cents} cents to {effect.user_id}")
    if kind == Kind.REFUND and refunded < effect.amount_cents:
        return f"completed event {name}: refunded total {effect.amount_cents} cents, payment has {refunded}"
    return None
