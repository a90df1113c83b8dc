"""The ledger's unit of work: one event applied in ONE PostgreSQL transaction.

The unique constraint on webhook_events (source, event_id) decides
idempotency; the Redis lock in front of this only saves work. A crash
anywhere before COMMIT leaves nothing behind, and a 2xx is answered only
after COMMIT returned.
"""

from typing import NamedTuple

import psycopg

from .db import pipelined, transaction
from .delivery import Outcome
from .events import DEFAULT_POLICY, MAX_CENTS, InvalidJSON, StoredBodyError, Unprocessable, credit_of, stored_event


class RetryLater(RuntimeError):
    """Nothing was committed and a retry will succeed: answered 503."""


class PayloadMismatch(ValueError):
    """This event id was stored before with a different effect: answered 409."""


class Result(NamedTuple):
    """What applying an event came to: PROCESSED, DUPLICATE, MISMATCH, or FAILED with its reason.

    stored_sha256 is the SHA-256 of the bytes the event's row held when this
    delivery found it (None when it inserted the row): on a DUPLICATE the
    bytes still stored, on a PROCESSED retry of a failed event those it
    replaced. When it differs from the delivery's own, the same effect came
    in other bytes.
    """

    outcome: Outcome
    problem: str | None = None
    stored_sha256: bytes | None = None

    @property
    def committed(self):
        """Whether the event's effect is committed (by this delivery or an earlier one)."""
        return self.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE)

    def raise_for_outcome(self):
        """Raise the exception that answers a FAILED or MISMATCH result; return self otherwise."""
        if self.outcome == Outcome.FAILED:
            raise Unprocessable(self.problem)
        if self.outcome == Outcome.MISMATCH:
            raise PayloadMismatch("this event id was delivered before with a different effect")
        return self


# A new event, in one statement: stored, credited and journaled; its final
# status is written at once unless a credit is to be made ('processing'),
# when FINISH_NEW writes it in the same transaction. A purged event that was
# credited keeps its ledger_credits row: it is not inserted again, so that no
# delivery of it, whatever its bytes, can credit it twice or record it as
# failed. Nothing is inserted when the event is already stored: its delivery
# goes on in _stored. jsonb is derived from the same bytes.
RECORD_NEW = """
    WITH inserted AS (
        INSERT INTO webhook_events (source, event_id, event_type, body, payload, payload_sha256, effect_sha256,
                                    status, completed_at, last_error)
        SELECT %(source)s, %(event_id)s, %(type)s, %(body)s, convert_from(%(body)s, 'UTF8')::jsonb, %(sha)s,
               %(effect)s, %(status)s, CASE WHEN %(status)s = 'completed' THEN now() END, %(problem)s
        WHERE NOT EXISTS (SELECT 1 FROM ledger_credits WHERE source = %(source)s AND event_id = %(event_id)s)
        ON CONFLICT (source, event_id) DO NOTHING
        RETURNING id
    ), credited AS (
        UPDATE user_balances
        SET balance_cents = balance_cents + %(amount)s, updated_at = now()
        WHERE user_id = %(user_id)s AND balance_cents <= %(max)s - %(amount)s AND EXISTS (SELECT 1 FROM inserted)
        RETURNING user_id
    ), journaled AS (
        INSERT INTO ledger_credits (source, event_id, user_id, amount_cents)
        SELECT %(source)s, %(event_id)s, user_id, %(amount)s FROM credited
        RETURNING id
    )
    SELECT id FROM inserted
"""
# Completes the event RECORD_NEW left 'processing' when its credit was
# journaled, or records why it was not. Rows committed are never
# 'processing', so this touches the row of this transaction only.
FINISH_NEW = """
    UPDATE webhook_events e
    SET status = CASE WHEN c.credited THEN 'completed' ELSE 'failed' END,
        completed_at = CASE WHEN c.credited THEN now() END,
        last_error = CASE WHEN c.credited THEN NULL
                          WHEN c.user_exists THEN 'credit would overflow the balance'
                          ELSE 'unknown user ' || %(user_id)s::text END
    FROM (SELECT EXISTS (SELECT 1 FROM ledger_credits WHERE source = %(source)s AND event_id = %(event_id)s),
                 EXISTS (SELECT 1 FROM user_balances WHERE user_id = %(user_id)s)) AS c (credited, user_exists)
    WHERE e.source = %(source)s AND e.event_id = %(event_id)s AND e.status = 'processing'
    RETURNING e.status, e.last_error
"""
# A stored event is either completed (nothing more to do) or failed (a new
# delivery tries again). FOR UPDATE serialises two retries of a failed event,
# and blocks behind a twin's uncommitted insert until its outcome is known.
LOCK_STORED_EVENT = """
    SELECT id, status, payload_sha256, effect_sha256 FROM webhook_events
    WHERE source = %(source)s AND event_id = %(event_id)s
    FOR UPDATE
"""
IS_CREDITED = """
    SELECT EXISTS (SELECT 1 FROM ledger_credits WHERE source = %(source)s AND event_id = %(event_id)s)
"""
# A failed event is tried again from the new delivery, whose bytes (with the
# same effect) become the stored ones.
RETRY_STORED_EVENT = """
    UPDATE webhook_events
    SET attempts = attempts + 1, updated_at = now(), body = %(body)s,
        payload = convert_from(%(body)s, 'UTF8')::jsonb, payload_sha256 = %(sha)s, effect_sha256 = %(effect)s
    WHERE id = %(row_id)s
"""
# A different effect under a stored id is only counted: status, attempts and
# the balance are left as they are.
RECORD_MISMATCH = """
    UPDATE webhook_events SET mismatches = mismatches + 1, last_mismatch_at = now() WHERE id = %s
"""
# Credits the user and journals the credit, in one statement (one round
# trip). The overflow test refuses a credit instead of raising, so that the
# refusal can be recorded; NOT EXISTS skips an event already credited.
CREDIT = """
    WITH credited AS (
        UPDATE user_balances
        SET balance_cents = balance_cents + %(amount)s, updated_at = now()
        WHERE user_id = %(user_id)s AND balance_cents <= %(max)s - %(amount)s
          AND NOT EXISTS (SELECT 1 FROM ledger_credits WHERE source = %(source)s AND event_id = %(event_id)s)
        RETURNING user_id
    )
    INSERT INTO ledger_credits (source, event_id, user_id, amount_cents)
    SELECT %(source)s, %(event_id)s, user_id, %(amount)s FROM credited
    RETURNING id
"""
WHY_NOT_CREDITED = """
    SELECT EXISTS (SELECT 1 FROM ledger_credits WHERE source = %(source)s AND event_id = %(event_id)s),
           EXISTS (SELECT 1 FROM user_balances WHERE user_id = %(user_id)s)
"""
# last_error tells why the event is failed; a completed one is not. How many
# attempts it took stays in attempts (and each one in the logs).
MARK_COMPLETED = """
    UPDATE webhook_events
    SET status = 'completed', completed_at = now(), updated_at = now(), last_error = NULL
    WHERE id = %s
"""
MARK_FAILED = """
    UPDATE webhook_events
    SET status = 'failed', last_error = %s, updated_at = now()
    WHERE id = %s
"""


def apply_event(pool, event, payload_sha256, policy=DEFAULT_POLICY):
    """Record event and apply its effect atomically.

    payload_sha256 is the SHA-256 of the body as received. Returns a Result;
    a failure is committed (attempts, last_error) with no balance change, a
    mismatch is committed as a count and nothing else.
    """
    params, credit, problem = _plan(event, payload_sha256, policy)
    return _apply_new(pool, params) or _apply_stored(pool, params, credit, problem)


def _plan(event, payload_sha256, policy):
    """The statements' parameters, the credit to make (or None) and why it cannot be made (or None)."""
    try:
        credit, problem = credit_of(event, policy), None
    except Unprocessable as exc:
        credit, problem = None, str(exc)
    params = {"source": event.source, "event_id": event.id, "type": event.type, "body": event.body,
              "sha": payload_sha256, "effect": event.effect, "problem": problem, "max": MAX_CENTS,
              "status": "failed" if problem else "processing" if credit else "completed",
              "amount": credit and credit.amount_cents, "user_id": credit and credit.user_id}
    return params, credit, problem


def _apply_new(pool, params):
    """Store, credit, journal and complete a new event in one round trip; None if it is stored already.

    The statements are pipelined: until the Sync they are one implicit
    transaction, committed at the Sync, or rolled back whole by any error.
    """
    try:
        with pipelined(pool) as (conn, pipeline):
            inserted = conn.execute(RECORD_NEW, params)
            finished = conn.execute(FINISH_NEW, params) if params["status"] == "processing" else None
            pipeline.sync()
            if inserted.fetchone() is None:
                return None
            status, problem = finished.fetchone() if finished else (params["status"], params["problem"])
    except psycopg.errors.DataError:
        # JSON that Python accepts but jsonb does not (\u0000, a lone
        # surrogate escape, a number beyond numeric's range): nothing written.
        raise InvalidJSON("body holds values that cannot be stored") from None
    if status == "failed":
        return Result(Outcome.FAILED, problem)
    return Result(Outcome.PROCESSED)


def _apply_stored(pool, params, credit, problem):
    """Go on with an event that RECORD_NEW found stored: a duplicate, a mismatch, or a failed one to retry."""
    with transaction(pool) as conn:
        row_id, stored_sha256, done = _stored(conn, params)
        if done is not None:
            return done
        if credit is not None and conn.execute(CREDIT, params).fetchone() is None:
            already_credited, user_exists = conn.execute(WHY_NOT_CREDITED, params).fetchone()
            if already_credited:
                conn.execute(MARK_COMPLETED, [row_id])
                return Result(Outcome.DUPLICATE, stored_sha256=stored_sha256)
            problem = "credit would overflow the balance" if user_exists else f"unknown user {credit.user_id}"
        if problem:
            conn.execute(MARK_FAILED, [problem, row_id])
            return Result(Outcome.FAILED, problem, stored_sha256)
        conn.execute(MARK_COMPLETED, [row_id])
    return Result(Outcome.PROCESSED, stored_sha256=stored_sha256)


def _stored(conn, params):
    """Return (row id, its bytes' hash, None) for a failed event to retry now, or (None, None, a Result)."""
    stored = conn.execute(LOCK_STORED_EVENT, params).fetchone()
    if stored is None:
        if conn.execute(IS_CREDITED, params).fetchone()[0]:
            # Purged after it was credited: the journal says it is done.
            return None, None, Result(Outcome.DUPLICATE)
        # Purged between the two statements: whether it was applied is
        # for ledger_credits to say on the sender's retry, not a guess now.
        raise RetryLater("the event's row was purged while this delivery ran")
    row_id, status, stored_sha256, stored_effect = stored
    # Rows stored before effects were kept are compared by their bytes.
    same = stored_effect == params["effect"] if stored_effect is not None else stored_sha256 == params["sha"]
    if not same:
        conn.execute(RECORD_MISMATCH, [row_id])
        return None, None, Result(Outcome.MISMATCH, stored_sha256=stored_sha256)
    if status == "completed":
        return None, None, Result(Outcome.DUPLICATE, stored_sha256=stored_sha256)
    conn.execute(RETRY_STORED_EVENT, {**params, "row_id": row_id})
    return row_id, stored_sha256, None


STORED_EVENT = """
    SELECT event_type, status, body, payload_sha256 FROM webhook_events WHERE source = %s AND event_id = %s
"""


def replay(pool, source, event_id, policy=DEFAULT_POLICY):
    """Re-apply a stored event from its stored bytes, as a new delivery of them would; None if none is stored.

    A completed event is left as it is: Result(DUPLICATE, "already completed").
    Stored bytes that cannot be replayed are a FAILED result saying why.
    """
    with transaction(pool) as conn:
        row = conn.execute(STORED_EVENT, [source, event_id]).fetchone()
    if row is None:
        return None
    event_type, status, body, sha256 = row
    if status == "completed":
        return Result(Outcome.DUPLICATE, "already completed")
    try:
        event = stored_event(source, event_id, event_type, body, sha256)
    except StoredBodyError as exc:
        return Result(Outcome.FAILED, f"not replayed: {exc}")
    # The row exists: straight to the stored event's transaction (RECORD_NEW
    # would only find it there).
    result = _apply_stored(pool, *_plan(event, sha256, policy))
    if result.outcome == Outcome.DUPLICATE:
        return Result(Outcome.DUPLICATE, "completed meanwhile by another delivery")
    return result
