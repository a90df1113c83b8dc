"""The ledger's unit of work: one event applied in ONE PostgreSQL transaction.

The unique constraint on webhook_events.event_id decides idempotency; the
Redis lock in front of this only saves work. A crash anywhere before COMMIT
leaves nothing behind, and a 2xx is answered only after COMMIT returned.
"""

from typing import NamedTuple

import psycopg

from .db import transaction
from .delivery import Outcome
from .events import MAX_CENTS, InvalidJSON, Unprocessable, credit_of, stored_event


class RetryLater(RuntimeError):
    """Nothing was committed and a retry will succeed: answered 503."""


class PayloadMismatch(ValueError):
    """This event id was stored before with a different body: answered 409."""


class Result(NamedTuple):
    """What applying an event came to: PROCESSED, DUPLICATE, MISMATCH, or FAILED with its reason."""

    outcome: Outcome
    problem: str | None = None

    @property
    def committed(self):
        """Whether the event's effect is committed (by this delivery or an earlier one)."""
        return self.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE)

    def raise_for_outcome(self):
        """Raise the exception that answers a FAILED or MISMATCH result; return self otherwise."""
        if self.outcome == Outcome.FAILED:
            raise Unprocessable(self.problem)
        if self.outcome == Outcome.MISMATCH:
            raise PayloadMismatch("this event id was delivered before with a different body")
        return self


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

    payload_sha256 is the SHA-256 of the body as received. Returns a Result;
    a failure is committed (attempts, last_error) with no balance change, a
    mismatch is committed as a count and nothing else.
    """
    try:
        credit, problem = credit_of(event), None
    except Unprocessable as exc:
        credit, problem = None, str(exc)
    params = credit and {"amount": credit.amount_cents, "user_id": credit.user_id,
                         "event_id": event.id, "max": MAX_CENTS}

    with transaction(pool) as conn:
        row_id, outcome = _record(conn, event, payload_sha256)
        if outcome is not None:
            return Result(outcome)
        if credit is not None and conn.execute(CREDIT, params).fetchone() is None:
            already_credited, user_exists = conn.execute(WHY_NOT_CREDITED, params).fetchone()
            if already_credited:
                conn.execute(MARK_COMPLETED, [row_id])
                return Result(Outcome.DUPLICATE)
            problem = "credit would overflow the balance" if user_exists else f"unknown user {credit.user_id}"
        if problem:
            conn.execute(MARK_FAILED, [problem, row_id])
            return Result(Outcome.FAILED, problem)
        conn.execute(MARK_COMPLETED, [row_id])
    return Result(Outcome.PROCESSED)


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
        return None, Outcome.MISMATCH
    if status == "completed":
        return None, Outcome.DUPLICATE
    conn.execute(RETRY_STORED_EVENT, [row_id])
    return row_id, None


STORED_EVENT = "SELECT event_type, status, payload::text, payload_sha256 FROM webhook_events WHERE event_id = %s"


def replay(pool, event_id):
    """Re-apply a stored event as a new delivery of it would; None if no such event is stored.

    A completed event is left as it is: Result(DUPLICATE, "already completed").
    """
    with pool.connection() as conn:
        row = conn.execute(STORED_EVENT, [event_id]).fetchone()
    if row is None:
        return None
    event_type, status, payload, sha256 = row
    if status == "completed":
        return Result(Outcome.DUPLICATE, "already completed")
    # The stored hash, not one of the re-serialised jsonb: this is the same body.
    result = apply_event(pool, stored_event(event_id, event_type, payload), sha256)
    if result.outcome == Outcome.DUPLICATE:
        return Result(Outcome.DUPLICATE, "completed meanwhile by another delivery")
    return result
