"""The ledger's invariants, checked on one snapshot: `flask ledger verify`.

1. no (source, event id) is stored twice;
2. no event is left 'processing' (that status never outlives its transaction);
3. each user's balance = opening balance + the sum of their ledger_credits;
4. a credit whose event is still stored belongs to a completed event, and a
   completed payment that is still stored has exactly the credit its stored
   bytes say (checked against their SHA-256 and read by the same code as the
   receiver's). Rows stored before the bytes were kept are read from their
   jsonb copy instead.
Purged events leave their credits behind, so 3 holds after a purge.
"""

from .events import DEFAULT_POLICY, PAYMENTS, StoredBodyError, Unprocessable, credit_of, stored_event

# Every event type that credit_of credits.
CREDITING_TYPES = list(PAYMENTS)

DUPLICATED_IDS = """
    SELECT source, event_id, count(*) FROM webhook_events GROUP BY source, event_id HAVING count(*) > 1
    ORDER BY source, event_id
"""
STUCK = "SELECT source, event_id, created_at FROM webhook_events WHERE status = 'processing' ORDER BY created_at"
WRONG_BALANCES = """
    SELECT u.user_id, u.balance_cents, u.opening_balance_cents, coalesce(c.credited, 0)
    FROM user_balances u
    LEFT JOIN (SELECT user_id, sum(amount_cents) AS credited FROM ledger_credits GROUP BY user_id) c USING (user_id)
    WHERE u.balance_cents <> u.opening_balance_cents + coalesce(c.credited, 0)
    ORDER BY u.user_id
"""
CREDITS_OF_UNFINISHED = """
    SELECT c.source, c.event_id, e.status FROM ledger_credits c JOIN webhook_events e USING (source, event_id)
    WHERE e.status <> 'completed' ORDER BY c.source, c.event_id
"""
COMPLETED_PAYMENTS = """
    SELECT e.source, e.event_id, e.event_type, e.body, e.payload_sha256,
           CASE WHEN e.body IS NULL THEN convert_to(e.payload::text, 'UTF8') END, c.user_id, c.amount_cents
    FROM webhook_events e LEFT JOIN ledger_credits c USING (source, event_id)
    WHERE e.status = 'completed' AND e.event_type = ANY(%s)
"""
COUNTS = """
    SELECT (SELECT count(*) FROM user_balances), (SELECT count(*) FROM webhook_events),
           (SELECT count(*) FROM ledger_credits)
"""


def check(conn, policy=DEFAULT_POLICY):
    """Return (problems, counts): one line per offending row, and (users, events, credits)."""
    with conn.transaction():
        # One consistent snapshot, however busy the receiver is, and no
        # statement timeout: the sums read whole tables.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL statement_timeout = 0")
        problems = [f"duplicated event id {eid!r} of source {src!r}: stored {n} times"
                    for src, eid, n in conn.execute(DUPLICATED_IDS)]
        problems += [f"stuck event {_name(src, eid)}: 'processing' since {at:%Y-%m-%d %H:%M:%S%z}"
                     for src, eid, at in conn.execute(STUCK)]
        problems += [f"balance of user {user}: {balance} cents, expected {opening + credited} "
                     f"(opening {opening} + credits {credited})"
                     for user, balance, opening, credited in conn.execute(WRONG_BALANCES)]
        problems += [f"credit of event {_name(src, eid)}: the event is {status!r}, not completed"
                     for src, eid, status in conn.execute(CREDITS_OF_UNFINISHED)]
        with conn.cursor(name="completed_payments") as rows:  # streamed, not loaded whole
            rows.execute(COMPLETED_PAYMENTS, [CREDITING_TYPES])
            problems += [p for row in rows if (p := _credit_problem(policy, *row))]
        counts = conn.execute(COUNTS).fetchone()
    return problems, counts


def _name(source, event_id):
    return repr(event_id) if source == "default" else f"{event_id!r} of source {source!r}"


def _credit_problem(policy, source, event_id, event_type, body, sha256, legacy_text, user_id, amount_cents):
    name = _name(source, event_id)
    try:
        if body is None:  # stored before the bytes were kept: its jsonb copy, unchecked
            body, sha256 = legacy_text, None
        event = stored_event(source, event_id, event_type, body, sha256)
        expected = credit_of(event, policy)
    except (StoredBodyError, Unprocessable) as exc:
        return f"completed event {name}: {exc}"
    if user_id is None:
        return f"completed event {name}: no credit in ledger_credits"
    if (expected.user_id, expected.amount_cents) != (user_id, amount_cents):
        return (f"completed event {name}: credit of {amount_cents} cents to {user_id}, "
                f"its bytes say {expected.amount_cents} cents to {expected.user_id}")
    return None
