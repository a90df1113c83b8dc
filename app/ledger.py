"""The ledger's unit of work: one event applied in ONE PostgreSQL transaction.

The unique constraint on webhook_events.event_id decides idempotency; the
Redis lock in front of this only saves work. A crash anywhere before COMMIT
leaves nothing behind, and a 2xx is answered only after COMMIT returned.
"""

import json

import psycopg

from .events import MAX_CENTS, Event, InvalidJSON, Unprocessable, credit_of

PROCESSED, DUPLICATE, FAILED, MISMATCH = "processed", "duplicate", "failed", "payload_mismatch"


class RetryLater(RuntimeError):
    """Nothing was committed and a retry will succeed: answered 503."""


INSERT_EVENT = """
    INSERT INTO webhook_events (event_id, event_type, payload, payload_sha256)
    VALUES (%s, %s, %s::jsonb, %s)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id
"""
# A stored event is either completed (nothing more to do) or failed (a new
# delivery tries again). FOR UPDATE serialises two retries of a failed event,
# and blocks behind a twin's uncommitted insert until its outcome is known.
LOCK_STORED_EVENT = """
    SELECT id, status, payload_sha256 FROM webhook_events WHERE event_id = %s FOR UPDATE
"""
RETRY_STORED_EVENT = """
    UPDATE webhook_events
    SET attempts = attempts + 1, updated_at = now()
    WHERE id = %s
"""
# A different body under a stored id is only counted: status, attempts and
# the balance are left as they are.
RECORD_MISMATCH = """
    UPDATE webhook_events SET mismatches = mismatches + 1, last_mismatch_at = now() WHERE id = %s
"""
# Credits the user and journals the credit, in one statement (one round
# trip). The overflow test refuses a credit instead of raising, so that the
# refusal can be recorded; NOT EXISTS skips an event whose row was purged and
# that is now delivered again (ledger_credits is never purged).
CREDIT = """
    WITH credited AS (
        UPDATE user_balances
        SET balance_cents = balance_cents + %(amount)s, updated_at = now()
        WHERE user_id = %(user_id)s AND balance_cents <= %(max)s - %(amount)s
          AND NOT EXISTS (SELECT 1 FROM ledger_credits WHERE event_id = %(event_id)s)
        RETURNING user_id
    )
    INSERT INTO ledger_credits (event_id, user_id, amount_cents)
    SELECT %(event_id)s, user_id, %(amount)s FROM credited
    RETURNING id
"""
WHY_NOT_CREDITED = """
    SELECT EXISTS (SELECT 1 FROM ledger_credits WHERE event_id = %(event_id)s),
           EXISTS (SELECT 1 FROM user_balances WHERE user_id = %(user_id)s)
"""
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


def apply_event(pool, event, payload_sha256):
    """Record event and apply its effect atomically.

    payload_sha256 is the SHA-256 of the body as received. Returns
    (PROCESSED, None), (DUPLICATE, None), (MISMATCH, None) or (FAILED,
    reason); a failure is committed (attempts, last_error) with no balance
    change, a mismatch is committed as a count and nothing else.
    """
    try:
        credit, problem = credit_of(event), None
    except Unprocessable as exc:
        credit, problem = None, str(exc)
    params = credit and {"amount": credit.amount_cents, "user_id": credit.user_id,
                         "event_id": event.id, "max": MAX_CENTS}

    with pool.connection() as conn, conn.transaction():
        row_id, outcome = _record(conn, event, payload_sha256)
        if outcome is not None:
            return outcome, None
        if credit is not None and conn.execute(CREDIT, params).fetchone() is None:
            already_credited, user_exists = conn.execute(WHY_NOT_CREDITED, params).fetchone()
            if already_credited:
                conn.execute(MARK_COMPLETED, [row_id])
                return DUPLICATE, None
            problem = "credit would overflow the balance" if user_exists else f"unknown user {credit.user_id}"
        if problem:
            conn.execute(MARK_FAILED, [problem, row_id])
            return FAILED, problem
        conn.execute(MARK_COMPLETED, [row_id])
    return PROCESSED, None


def stored_event(event_id, event_type, payload):
    """Rebuild the Event of a stored row (for replay and verify).

    The id and type are the row's, as first parsed: a signature scheme may
    take them from headers rather than the body (and a GitHub event's data
    is its whole body).
    """
    document = json.loads(payload)
    data = document["data"] if isinstance(document.get("data"), dict) else document
    return Event(id=event_id, type=event_type, data=data, text=payload)


def _record(conn, event, payload_sha256):
    """Return (row id, None) for an event to apply now, or (None, DUPLICATE or MISMATCH)."""
    try:
        row = conn.execute(INSERT_EVENT, [event.id, event.type, event.text, payload_sha256]).fetchone()
    except psycopg.errors.DataError:
        # JSON that Python accepts but jsonb does not (\u0000, a lone
        # surrogate escape, a number beyond numeric's range): nothing written.
        raise InvalidJSON("body holds values that cannot be stored") from None
    return (row[0], None) if row is not None else _stored(conn, event, payload_sha256)


def _stored(conn, event, payload_sha256):
    """Return (row id, None) for a failed event to retry now, or (None, DUPLICATE or MISMATCH)."""
    stored = conn.execute(LOCK_STORED_EVENT, [event.id]).fetchone()
    if stored is None:
        # Purged between the two statements: whether it was applied is
        # for ledger_credits to say on the sender's retry, not a guess now.
        raise RetryLater("the event's row was purged while this delivery ran")
    row_id, status, stored_sha256 = stored
    if stored_sha256 != payload_sha256:
        conn.execute(RECORD_MISMATCH, [row_id])
        return None, MISMATCH
    if status == "completed":
        return None, DUPLICATE
    conn.execute(RETRY_STORED_EVENT, [row_id])
    return row_id, None
