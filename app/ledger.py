"""The ledger's unit of work: one event applied in ONE PostgreSQL transaction.

The unique constraint on webhook_events.event_id decides idempotency; the
Redis lock in front of this only saves work. A crash anywhere before COMMIT
leaves nothing behind, and a 2xx is answered only after COMMIT returned.
"""

import psycopg

from .events import MAX_CENTS, InvalidJSON, Unprocessable, credit_of

PROCESSED, DUPLICATE, FAILED = "processed", "duplicate", "failed"

INSERT_EVENT = """
    INSERT INTO webhook_events (event_id, event_type, payload)
    VALUES (%s, %s, %s::jsonb)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id
"""
# A stored event is either completed (nothing more to do) or failed (a new
# delivery tries again). FOR UPDATE serialises two retries of a failed event.
LOCK_STORED_EVENT = """
    UPDATE webhook_events
    SET attempts = attempts + 1, payload = %s::jsonb, updated_at = now()
    WHERE event_id = %s AND status <> 'completed'
    RETURNING id
"""
# The WHERE clause refuses an overflow instead of raising inside the
# transaction, so a refused credit can still be recorded as a failure.
CREDIT_USER = """
    UPDATE user_balances
    SET balance_cents = balance_cents + %(amount)s, updated_at = now()
    WHERE user_id = %(user_id)s AND balance_cents <= %(max)s - %(amount)s
    RETURNING balance_cents
"""
USER_EXISTS = "SELECT 1 FROM user_balances WHERE user_id = %s"
MARK_COMPLETED = """
    UPDATE webhook_events
    SET status = 'completed', completed_at = now(), updated_at = now()
    WHERE id = %s
"""
MARK_FAILED = """
    UPDATE webhook_events
    SET status = 'failed', last_error = %s, updated_at = now()
    WHERE id = %s
"""


def apply_event(pool, event):
    """Record event and apply its effect atomically.

    Returns (PROCESSED, None), (DUPLICATE, None) or (FAILED, reason); a
    failure is committed (attempts, last_error) with no balance change.
    """
    try:
        credit, problem = credit_of(event), None
    except Unprocessable as exc:
        credit, problem = None, str(exc)

    with pool.connection() as conn, conn.transaction():
        row_id = _record(conn, event)
        if row_id is None:
            return DUPLICATE, None
        if credit is not None:
            problem = _credit(conn, credit)
        if problem:
            conn.execute(MARK_FAILED, [problem, row_id])
            return FAILED, problem
        conn.execute(MARK_COMPLETED, [row_id])
    return PROCESSED, None


def _record(conn, event):
    """Return the id of the event's row, new or failed before; None if completed."""
    try:
        row = conn.execute(INSERT_EVENT, [event.id, event.type, event.text]).fetchone()
        if row is None:
            # Blocks behind a twin's uncommitted insert, then sees its outcome.
            row = conn.execute(LOCK_STORED_EVENT, [event.text, event.id]).fetchone()
    except psycopg.errors.DataError:
        # JSON that Python accepts but jsonb does not (\u0000, a lone
        # surrogate escape, a number beyond numeric's range): nothing written.
        raise InvalidJSON("body holds values that cannot be stored") from None
    return None if row is None else row[0]


def _credit(conn, credit):
    """Credit the user; return None, or why the credit cannot apply."""
    params = {"amount": credit.amount_cents, "user_id": credit.user_id, "max": MAX_CENTS}
    if conn.execute(CREDIT_USER, params).fetchone() is not None:
        return None
    if conn.execute(USER_EXISTS, [credit.user_id]).fetchone() is None:
        return f"unknown user {credit.user_id}"
    return "credit would overflow the balance"
