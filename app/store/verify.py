"""The ledger's invariants, checked on one snapshot: `flask ledger verify`
(docs/design.md, "What `flask ledger verify` checks")."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import namedtuple_row

from ..intake.events import (
    DEFAULT_POLICY,
    DEFAULT_SOURCE,
    RULES,
    Effect,
    Kind,
    Policy,
    State,
    StoredBodyError,
    effect_of,
    read_when_fetched,
    stored_event,
)
from .db import NamedRow
from .ledger import Change, Entry

DUPLICATED_IDS = """
    SELECT source, event_id, count(*) AS times FROM webhook_events GROUP BY source, event_id HAVING count(*) > 1
    ORDER BY source, event_id
"""
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
# Per payment: its credits in the journal, and the adjustments that correct them (a payment credited
# twice, corrected by `flask ledger adjust --payment`), which add up to one credit of its amount; what its other journal
# rows took, what its row says it debited, and what the rule says is due. A spend names no payment.
WRONG_PAYMENTS = """
    SELECT * FROM (
        SELECT p.source, p.payment_id, p.user_id, p.amount_cents, p.debited_cents, a.debit_due_cents,
               count(j.id) FILTER (WHERE j.kind = 'credit') AS credits,
               count(j.id) FILTER (WHERE j.kind = 'credit' AND j.user_id = p.user_id
                                     AND j.amount_cents = p.amount_cents) AS exact_credits,
               coalesce(sum(j.amount_cents) FILTER (WHERE j.kind IN ('credit', 'adjustment')), 0) AS credited,
               coalesce(sum(j.amount_cents) FILTER (WHERE j.kind = 'adjustment'), 0) AS adjusted,
               -coalesce(sum(j.amount_cents) FILTER (WHERE j.kind NOT IN ('credit', 'adjustment')), 0) AS debited,
               count(j.id) FILTER (WHERE j.user_id <> p.user_id) AS others
        FROM payments p JOIN payment_accounts a USING (source, payment_id)
        LEFT JOIN ledger_journal_keyed j USING (source, payment_id)
        GROUP BY p.source, p.payment_id, a.debit_due_cents
    ) t
    WHERE exact_credits = 0 OR credited <> amount_cents OR others <> 0 OR debited <> debited_cents
       OR debited_cents <> debit_due_cents
    ORDER BY source, payment_id
"""
JOURNAL_WITHOUT_PAYMENT = """
    SELECT j.id, j.kind, j.source, j.event_id, j.payment_id FROM ledger_journal_keyed j
    WHERE (j.kind NOT IN ('adjustment', 'spend', 'give_back') OR j.payment_id IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.source = j.source AND p.payment_id = j.payment_id)
    ORDER BY j.source, j.event_id
"""
# A journal row says what made it: an event, or, for an adjustment, its reason and who made it, for a spend or a
# give-back, its reference, for a payment's move into a connected account, its keys and who moved it; none of those
# names an event or a movement, a spend or a give-back no payment either (what schema.sql's
# ledger_journal_names_check holds).
UNEXPLAINED = """
    SELECT id, kind, user_id, amount_cents FROM ledger_journal
    WHERE CASE kind WHEN 'adjustment' THEN reason IS NULL OR reason !~ '\\S' OR actor IS NULL
                                           OR num_nonnulls(source, payment_id) = 1
                    WHEN 'spend' THEN reference IS NULL OR num_nonnulls(source, payment_id) > 0
                    WHEN 'give_back' THEN reference IS NULL OR num_nonnulls(source, payment_id) > 0
                    WHEN 'payment_moved' THEN num_nonnulls(source, payment_id, moved_from, actor) < 4
                    ELSE source IS NULL OR event_id IS NULL END
       OR kind IN ('adjustment', 'spend', 'give_back', 'payment_moved') AND num_nonnulls(event_id, movement_id) > 0
    ORDER BY id
"""
# A journal row of a refund object or a dispute names a movement of its own payment.
JOURNAL_WITHOUT_MOVEMENT = """
    SELECT j.source, j.event_id, j.kind, j.movement_id FROM ledger_journal_keyed j
    WHERE j.movement_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM movements m WHERE m.source = j.source AND m.movement_id = j.movement_id
        AND m.payment_id = j.payment_id AND m.kind = split_part(j.kind, '_', 1))
    ORDER BY j.source, j.event_id
"""
# A give-back gives its spend's amount back to its spend's user: the spend of its reference.
WRONG_GIVE_BACKS = """
    SELECT g.id, g.user_id, g.amount_cents, g.reference, s.id AS spend_id, s.user_id AS spend_user,
           -s.amount_cents AS spent
    FROM ledger_journal g LEFT JOIN ledger_journal s ON s.kind = 'spend' AND s.reference = g.reference
    WHERE g.kind = 'give_back' AND (s.id IS NULL OR s.user_id <> g.user_id OR s.amount_cents <> -g.amount_cents)
    ORDER BY g.id
"""
# A captured hold names the spend of its reference, to its user, of what it captured (up to its amount, which
# schema.sql's CHECK holds); a hold not captured has no spend of its reference.
WRONG_HOLDS = """
    SELECT h.reference, h.user_id, h.state, h.captured_cents, h.journal_id, s.id AS spend_id,
           s.user_id AS spend_user, -s.amount_cents AS spent
    FROM holds h LEFT JOIN ledger_journal s ON s.kind = 'spend' AND s.reference = h.reference
    WHERE CASE WHEN h.state = 'captured' THEN s.id IS DISTINCT FROM h.journal_id OR s.user_id <> h.user_id
                                               OR s.amount_cents <> -h.captured_cents
               ELSE s.id IS NOT NULL END
    ORDER BY h.reference
"""
# Each completed event of a type that moves money, still stored, with its journal row (if any): what it
# did, to compare with what its bytes say.
COMPLETED_EFFECTS = """
    SELECT e.source, e.event_id, e.event_type, e.body, e.payload_sha256,
           e.ledger_currency, e.test_events_accepted, e.user_metadata_key, e.fetched,
           j.kind, j.payment_id, j.movement_id, j.user_id, j.amount_cents
    FROM webhook_events e
    LEFT JOIN ledger_journal_keyed j USING (source, event_id)
    WHERE e.status = 'completed' AND e.event_type = ANY(%s)
"""
# How many rows COMPLETED_EFFECTS streams, on the same snapshot: the total a progress bar counts to.
COMPLETED_COUNT = "SELECT count(*) FROM webhook_events WHERE status = 'completed' AND event_type = ANY(%s)"
# credited_by: the type of the event that credited it, while that event is stored.
PAYMENT = """
    SELECT p.user_id, p.amount_cents, p.refunded_cents, p.customer_id,
           (SELECT e.event_type FROM webhook_events e WHERE e.source = p.source AND e.event_id = p.event_id)
               AS credited_by
    FROM payments p WHERE p.source = %s AND p.payment_id = %s
"""
# A credit made through a link (a customer's, or a connected account's): links are never changed, so today's is
# the one it was made by.
LINK = "SELECT user_id, customer_id FROM customer_links WHERE source = %s AND customer_id = %s"
# A connected account's customer's bare link made under 1.0, before migration 005 ran: read in every account, as 1.0
# read it (money.sql's credit_payment), when the account has no link of its own for the customer.
LINK_BEFORE_CONNECT = """
    SELECT user_id, customer_id FROM customer_links
    WHERE source = %s AND customer_id = %s
        AND created_at < (SELECT applied_at FROM schema_migrations WHERE name = '005_connect_accounts.sql' AND ran)
"""
# A credit made through an operator's assignment (`flask payments assign-user`): never changed either.
ASSIGNED = "SELECT user_id FROM payment_users WHERE source = %s AND payment_id = %s"
APP_KEY = "SELECT user_id FROM user_keys WHERE app_key = %s"
MOVEMENT = "SELECT payment_id, amount_cents, state FROM movements WHERE source = %s AND kind = %s AND movement_id = %s"
COUNTS = """
    SELECT (SELECT count(*) FROM user_balances), (SELECT count(*) FROM webhook_events),
           (SELECT count(*) FROM payments), (SELECT count(*) FROM ledger_journal)
"""


# Notifications accepted and not applied yet (app/store/waiting.py): by state, how many, the oldest's age; and those
# whose bytes of record no longer match their SHA-256 (a problem: the drain would apply other bytes than received).
WAITING = """
    SELECT state, count(*) AS n, coalesce(extract(epoch FROM now() - min(received_at)), 0)::bigint AS oldest
    FROM waiting_notifications GROUP BY state ORDER BY state
"""
WAITING_CORRUPT = """
    SELECT source, event_id FROM waiting_notifications WHERE state = 'waiting' AND sha256(body) <> payload_sha256
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
    # One line per completed event that today's settings would refuse, decided under others: not a problem.
    settings_changed: list[str] = []
    # One line per state of the notifications that wait for (or were not found at) their provider: not a problem.
    waiting: list[str] = []


def check(conn: psycopg.Connection[Any], policy: Policy = DEFAULT_POLICY,
          on_row: Callable[[int], object] = lambda n: None,
          on_total: Callable[[int], object] = lambda n: None) -> Report:
    """Return a Report of the ledger's invariants on one snapshot; on_total(n) is told how many stored events it
    reads, then on_row(1) of each as it is read."""
    with conn.transaction():
        # One consistent snapshot, however busy the receiver is, and no
        # statement timeout: the sums read whole tables.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL statement_timeout = 0")
        cur: psycopg.Cursor[NamedRow] = conn.cursor(row_factory=namedtuple_row)
        problems = [f"duplicated event id {r.event_id!r} of source {r.source!r}: stored {r.times} times"
                    for r in cur.execute(DUPLICATED_IDS)]
        problems += [f"balance of user {r.user_id}: {r.balance_cents} cents, expected "
                     f"{r.opening_balance_cents + r.changed} (opening {r.opening_balance_cents} + journal {r.changed})"
                     for r in cur.execute(WRONG_BALANCES)]
        problems += [f"journal row {r.id}: {r.kind} of {r.amount_cents:+} cents to user {r.user_id} does not say "
                     f"what made it: {EXPLAINS.get(r.kind, EXPLAINS[None])}" for r in cur.execute(UNEXPLAINED)]
        problems += [f"journal row of event {_name(r.source, r.event_id)}: the event is {r.status!r}, not completed"
                     for r in cur.execute(JOURNAL_OF_UNFINISHED)]
        problems += [_payment_problem(r) for r in cur.execute(WRONG_PAYMENTS)]
        problems += [f"{_row(r)}: no payment {r.payment_id!r}" for r in cur.execute(JOURNAL_WITHOUT_PAYMENT)]
        problems += [_give_back_problem(r) for r in cur.execute(WRONG_GIVE_BACKS)]
        problems += [_hold_problem(r) for r in cur.execute(WRONG_HOLDS)]
        problems += [f"journal row of event {_name(r.source, r.event_id)}: a {r.kind} of no movement "
                     f"{r.movement_id!r} of its payment" for r in cur.execute(JOURNAL_WITHOUT_MOVEMENT)]
        counted = conn.execute(COMPLETED_COUNT, [list(RULES)]).fetchone()
        assert counted is not None  # an aggregate returns one row
        on_total(counted[0])
        with conn.cursor(name="completed_effects", row_factory=namedtuple_row) as rows:  # streamed, not loaded whole
            rows.execute(COMPLETED_EFFECTS, [list(RULES)])
            settings_changed: list[str] = []
            for stored in rows:
                if problem := _effect_problem(cur, policy, stored, settings_changed):
                    problems.append(problem)
                on_row(1)
        below_zero = [f"balance of user {r.user_id} is below zero: {r.balance_cents} cents"
                      for r in cur.execute(BELOW_ZERO)]
        problems += [f"waiting notification {_name(r.source, r.event_id)}: its stored bytes do not match their "
                     f"SHA-256" for r in cur.execute(WAITING_CORRUPT)]
        waiting = [WAITING_LINES[r.state].format(n=r.n, oldest=r.oldest) for r in cur.execute(WAITING)]
        row = conn.execute(COUNTS).fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        counts = Counts(*row)
    return Report(problems, below_zero, counts, settings_changed, waiting)


WAITING_LINES = {
    "waiting": "{n} notifications accepted wait for their provider's record (the oldest {oldest} s): the drain "
               "applies them",
    "unknown": "{n} notifications were not found at their provider: kept without their bodies, applied if a genuine "
               "delivery comes",
}


def _name(source: str, event_id: str) -> str:
    return repr(event_id) if source == DEFAULT_SOURCE else f"{event_id!r} of source {source!r}"


def _row(row: NamedRow) -> str:
    """A journal row, named by its event, or (an adjustment, a spend) by its id and kind."""
    return f"journal row {row.id} ({row.kind})" if row.event_id is None else \
        f"journal row of event {_name(row.source, row.event_id)}"


def _give_back_problem(row: NamedRow) -> str:
    spend = f"no spend {row.reference!r}" if row.spend_id is None else \
        f"spend {row.reference!r} took {row.spent} cents from user {row.spend_user}"
    return f"journal row {row.id} (give_back) gives back {row.amount_cents} cents to user {row.user_id}: {spend}"


def _hold_problem(row: NamedRow) -> str:
    spend = "no spend" if row.spend_id is None else \
        f"spend row {row.spend_id} of {row.spent} cents from user {row.spend_user}"
    if row.state == "captured":
        return f"hold {row.reference!r} of user {row.user_id}: captured {row.captured_cents} cents in journal row " \
               f"{row.journal_id}, its reference has {spend}"
    return f"hold {row.reference!r} of user {row.user_id} is {row.state}, but its reference has {spend}"


def _payment_problem(row: NamedRow) -> str:
    name = _name(row.source, row.payment_id)
    if row.credits == 0:
        return f"payment {name}: credited 0 times"
    if row.exact_credits == 0:
        return f"payment {name}: its credit is not {row.amount_cents} cents to {row.user_id}"
    if row.credited != row.amount_cents:
        adjusted = f" and adjusted by {row.adjusted:+} cents" if row.adjusted else ""
        return f"payment {name}: credited {row.credits} times{adjusted}: {row.credited} cents in all, " \
               f"not its {row.amount_cents}"
    if row.others:
        return f"payment {name}: {row.others} journal rows debit or credit another user than {row.user_id}"
    if row.debited != row.debited_cents:
        return f"payment {name}: its journal debited {row.debited} cents, its row says {row.debited_cents}"
    return f"payment {name}: {row.debited_cents} cents debited, its refunds and disputes make {row.debit_due_cents} due"


def _effect_problem(cur: psycopg.Cursor[NamedRow], policy: Policy, row: NamedRow,
                    settings_changed: list[str]) -> str | None:
    """Why a completed event's balance change (or its record) is not what its stored bytes say, or None."""
    # An event that today's settings refuse is judged by the settings it was decided under (recorded with it): one
    # line in settings_changed if those differ, a problem if they are today's.
    name = _name(row.source, row.event_id)
    if row.user_metadata_key is not None:  # the metadata key it was decided under, not today's
        users = replace(policy.users_of(row.source), metadata_key=row.user_metadata_key)
        policy = replace(policy, users={**policy.users, row.source: users})
    try:
        event = stored_event(row.source, row.event_id, row.event_type, row.body, row.payload_sha256, row.fetched)
        effect = effect_of(event, policy)
    except StoredBodyError as exc:
        return f"completed event {name}: {exc}"
    if effect.setting:
        then = (row.ledger_currency, row.test_events_accepted)
        if then == (policy.currency, policy.accept_test_events):
            return f"completed event {name}: {effect.problem}"
        decided = (f"under LEDGER_CURRENCY={row.ledger_currency}, "
                   f"STRIPE_ACCEPT_TEST_EVENTS={str(row.test_events_accepted).lower()}")
        settings_changed.append(f"completed event {name}: today's {effect.setting} refuses it; "
                                f"it was decided {decided}")
    elif effect.problem:
        return f"completed event {name}: {effect.problem}"
    if effect.app_key is not None:  # the application's key names the user (user_keys: never changed)
        key = cur.execute(APP_KEY, [effect.app_key]).fetchone()
        if key is None:
            return f"completed event {name}: no user has the application's key {effect.app_key!r}"
        effect = replace(effect, user_id=key.user_id)
    if effect.kind is None:  # its bytes say it moves no money
        return f"completed event {name}: journal has a {row.kind}, its bytes move no money" if row.kind else None
    if effect.kind == Kind.LINK:
        return _link_problem(cur, row, effect, name)
    if row.kind is not None and (row.kind not in CHANGES_OF[effect.kind] or row.payment_id != effect.payment_id
                                 or row.movement_id != effect.movement_id):
        return f"completed event {name}: journal has a {row.kind} of payment {row.payment_id!r}, its bytes say " \
               f"a {effect.kind} of payment {effect.payment_id!r}"
    if effect.kind == Kind.CREDIT and effect.user_id is None:
        return _linked_credit_problem(cur, row, effect, name)
    if effect.kind == Kind.CREDIT:
        if row.kind is not None:
            if (row.user_id, row.amount_cents) != (effect.user_id, effect.amount_cents):
                return (f"completed event {name}: credit of {row.amount_cents} cents to {row.user_id}, "
                        f"its bytes say {effect.amount_cents} cents to {effect.user_id}")
            return None
        # A payment announced again: nothing credited, the payment is the one its bytes name.
        payment = cur.execute(PAYMENT, [row.source, effect.payment_id]).fetchone()
        if payment is None:
            return f"completed event {name}: no payment {effect.payment_id!r} in the ledger"
        disagreed = payment.amount_cents == effect.amount_cents and (
            read_when_fetched(row.event_type) or read_when_fetched(payment.credited_by or ""))
        if (payment.user_id, payment.amount_cents) != (effect.user_id, effect.amount_cents) and not disagreed:
            return f"completed event {name}: payment {effect.payment_id!r} was credited {payment.amount_cents} " \
                   f"cents to {payment.user_id}, its bytes say {effect.amount_cents} cents to {effect.user_id}"
        return None
    if effect.kind == Kind.REFUNDED_TOTAL:
        payment = cur.execute(PAYMENT, [row.source, effect.payment_id]).fetchone()
        if payment is None or payment.refunded_cents < effect.amount_cents:
            return f"completed event {name}: refunded total {effect.amount_cents} cents not recorded " \
                   f"(payment {effect.payment_id!r} has {payment and payment.refunded_cents})"
        return None
    movement = cur.execute(MOVEMENT, [row.source, effect.kind, effect.movement_id]).fetchone()
    if movement is None or (movement.payment_id, movement.amount_cents) != (effect.payment_id, effect.amount_cents):
        return f"completed event {name}: its {effect.kind} {effect.movement_id!r} of {effect.amount_cents} cents " \
               f"of payment {effect.payment_id!r} is not recorded as such"
    if effect.state == State.REVERSED and movement.state != State.REVERSED:
        return f"completed event {name}: its {effect.kind} {effect.movement_id!r} is {movement.state}, " \
               f"its bytes say {effect.state}"
    return None


def _linked_credit_problem(cur: psycopg.Cursor[NamedRow], row: NamedRow, effect: Effect, name: str) -> str | None:
    """Why a completed credit whose metadata names no user is neither its customer's link's, nor a duplicate of
    the payment's credit, nor its connected account's link's, nor the operator's assigned user's, or None."""
    payment = cur.execute(PAYMENT, [row.source, effect.payment_id]).fetchone()
    link = effect.customer_id and cur.execute(LINK, [row.source, effect.customer_id]).fetchone()
    if not link and effect.account and effect.customer_id and effect.customer_id.startswith(f"{effect.account}/"):
        bare = effect.customer_id.removeprefix(f"{effect.account}/")
        link = cur.execute(LINK_BEFORE_CONNECT, [row.source, bare]).fetchone()
    if not link and payment is not None and row.kind is None and payment.amount_cents == effect.amount_cents:
        return None  # a payment that another event credited to the user it named, announced again
    if not link and effect.account:  # read after the payment's own user, as money.sql's credit_payment does
        link = cur.execute(LINK, [row.source, effect.account]).fetchone()
    assigned = not link and cur.execute(ASSIGNED, [row.source, effect.payment_id]).fetchone()
    if assigned:
        if payment is None or (payment.user_id, payment.amount_cents) != (assigned.user_id, effect.amount_cents) \
                or row.kind is not None and row.user_id != assigned.user_id:
            return f"completed event {name}: payment {effect.payment_id!r} is not {effect.amount_cents} cents " \
                   f"credited to {assigned.user_id}, the user an operator assigned to it"
        return None
    if not link:
        return f"completed event {name}: its metadata names no user, and customer {effect.customer_id!r} is linked " \
               "to none"
    # The event that credited it names the customer (or account) its row records; another event of it (a duplicate)
    # need not.
    through = payment is not None and (row.kind is None or payment.customer_id == link.customer_id)
    linked = f"{'account' if link.customer_id == effect.account else 'customer'} {link.customer_id!r}"
    if payment is None or not through or (payment.user_id, payment.amount_cents) != (link.user_id, effect.amount_cents):
        return f"completed event {name}: payment {effect.payment_id!r} is not {effect.amount_cents} cents credited " \
               f"to {link.user_id} through {linked}"
    if row.kind is not None and (row.user_id, row.amount_cents) != (link.user_id, effect.amount_cents):
        return f"completed event {name}: credit of {row.amount_cents} cents to {row.user_id}, its bytes and " \
               f"{linked}'s link say {effect.amount_cents} cents to {link.user_id}"
    return None


def _link_problem(cur: psycopg.Cursor[NamedRow], row: NamedRow, effect: Effect, name: str) -> str | None:
    """Why a completed link (a subscription's Checkout Session) moved money, or its customer is not linked to the
    user its bytes name (links are never changed: today's is the one it found or made), or None."""
    if row.kind is not None:
        return f"completed event {name}: journal has a {row.kind}, its bytes link customer " \
               f"{effect.customer_id!r} and move no money"
    link = cur.execute(LINK, [row.source, effect.customer_id]).fetchone()
    if link is None or link.user_id != effect.user_id:
        return f"completed event {name}: customer {effect.customer_id!r} is linked to " \
               f"{link.user_id if link else 'no user'}, its bytes link it to {effect.user_id}"
    return None


# What a journal row of each kind names, to say what made it.
EXPLAINS = {
    Entry.ADJUSTMENT: "an adjustment names its reason and who made it, no event or movement, and the payment it "
                      "corrects (if any) by its source and id",
    Entry.SPEND: "a spend names its reference, and no event or payment",
    Entry.GIVE_BACK: "a give-back names the reference of its spend, and no event or payment",
    Entry.PAYMENT_MOVED: "a payment's move names its source, its key now and before, and who moved it, no event or "
                         "movement",
    None: "a row an event wrote names its source and event",
}

# The journal kinds an event of each kind may write.
CHANGES_OF = {
    Kind.CREDIT: {Change.CREDIT},
    Kind.REFUNDED_TOTAL: {Change.REFUND},
    Kind.REFUND: {Change.REFUND, Change.REFUND_REVERSED},
    Kind.DISPUTE: {Change.DISPUTE_WITHDRAWN, Change.DISPUTE_REINSTATED},
}
