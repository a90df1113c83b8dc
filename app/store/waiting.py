"""Notifications that wait for their provider's record: recorded as received and answered `accepted`, claimed by
the drain, applied through apply_event (docs/design.md, "The provider's pace")."""

from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from ..intake.events import Event
from .db import Pool, one_query, statement_timeout, transaction

# last_error's bound (schema.sql): a provider's message cut to it.
MAX_REASON_CHARS = 1000


class Known(StrEnum):
    """What the ledger holds of an event before any fetch (known())."""

    COMPLETED = "completed"  # its effect is committed (or was, and was purged): a duplicate
    WAITING = "waiting"  # recorded and accepted: the drain applies it
    NEW = "new"  # neither: fetch it (a failed, ignored or unknown one included: a fetch decides again)


# One round trip: the event's row, or its journal (a purged event that moved money), or its wait.
KNOWN = """
    SELECT (SELECT status FROM webhook_events WHERE source = %(source)s AND event_id = %(event_id)s),
           EXISTS (SELECT 1 FROM ledger_journal WHERE source = %(source)s AND event_id = %(event_id)s),
           (SELECT state FROM waiting_notifications WHERE source = %(source)s AND event_id = %(event_id)s)
"""


def known(pool: Pool, source: str, event_id: str) -> Known:
    """Whether source's event_id is completed, waiting, or neither, as PostgreSQL says now."""
    row = one_query(pool, KNOWN, {"source": source, "event_id": event_id})
    assert row is not None  # a SELECT of scalars returns one row
    status, journaled, state = row
    if status == "completed" or (status is None and journaled):
        return Known.COMPLETED
    return Known.WAITING if state == "waiting" else Known.NEW


# A notification already waiting keeps its first bytes; an unknown one (its provider had no record of it) is
# replaced by this genuine delivery, which waits in its turn.
ACCEPT = """
    INSERT INTO waiting_notifications (source, event_id, event_type, body, payload_sha256, last_error)
    VALUES (%(source)s, %(event_id)s, %(type)s, %(body)s, %(payload_sha256)s, %(reason)s)
    ON CONFLICT (source, event_id) DO UPDATE
    SET state = 'waiting', event_type = EXCLUDED.event_type, body = EXCLUDED.body,
        payload_sha256 = EXCLUDED.payload_sha256, last_error = EXCLUDED.last_error, attempts = 0,
        received_at = now(), not_before = now()
    WHERE waiting_notifications.state = 'unknown'
    RETURNING id
"""


def accept(pool: Pool, event: Event, payload_sha256: bytes, reason: str) -> None:
    """Record event as received (its exact bytes, committed) to wait for its provider's record; reason: why."""
    one_query(pool, ACCEPT, {"source": event.source, "event_id": event.id, "type": event.type, "body": event.body,
                             "payload_sha256": payload_sha256, "reason": reason[:MAX_REASON_CHARS]})


# A bounded record of a notification its provider has no record of: no body (a forged one could be 1 MiB), no
# failed event (no alert, no replay); a genuine delivery of the id later is fetched and applied as any other.
UNKNOWN = """
    INSERT INTO waiting_notifications (source, event_id, event_type, state, payload_sha256, attempts, last_error)
    VALUES (%(source)s, %(event_id)s, %(type)s, 'unknown', %(payload_sha256)s, 1, %(reason)s)
    ON CONFLICT (source, event_id) DO UPDATE
    SET state = 'unknown', body = NULL, payload_sha256 = EXCLUDED.payload_sha256, last_error = EXCLUDED.last_error,
        attempts = waiting_notifications.attempts + 1
    RETURNING id
"""


def unknown(pool: Pool, event: Event, payload_sha256: bytes, reason: str) -> None:
    """Record that event's provider has no record of it: a bounded row, its bytes dropped."""
    one_query(pool, UNKNOWN, {"source": event.source, "event_id": event.id, "type": event.type,
                              "payload_sha256": payload_sha256, "reason": reason[:MAX_REASON_CHARS]})


class Claimed(NamedTuple):
    """A waiting notification claimed by one drain until its claim expires."""

    id: int
    source: str
    event_id: str
    event_type: str
    body: bytes
    payload_sha256: bytes
    attempts: int
    received_at: datetime


# Oldest first; SKIP LOCKED leaves rows another host is claiming to it. The claim is not_before pushed past the
# time a claimed batch may take: a host that dies holding it leaves its rows due again then. One short
# transaction, no session state: it works through PgBouncer in transaction mode.
CLAIM = """
    UPDATE waiting_notifications w
    SET attempts = w.attempts + 1, not_before = now() + make_interval(secs => %(claim_seconds)s)
    FROM (SELECT id FROM waiting_notifications
          WHERE state = 'waiting' AND not_before <= now()
          ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) due
    WHERE w.id = due.id
    RETURNING w.id, w.source, w.event_id, w.event_type, w.body, w.payload_sha256, w.attempts, w.received_at
"""


def claim(pool: Pool, limit: int, claim_seconds: float) -> list[Claimed]:
    """Claim up to limit due notifications, oldest first, for claim_seconds."""
    with transaction(pool) as conn:
        rows = conn.execute(CLAIM, {"limit": limit, "claim_seconds": claim_seconds}).fetchall()
    return sorted((Claimed(r[0], r[1], r[2], r[3], bytes(r[4]), bytes(r[5]), r[6], r[7]) for r in rows),
                  key=lambda c: c.id)


# one_query reads a row: each statement here returns one (or none).
# Appended to apply_event's statement (ledger.apply_event's drained): the wait ends with the event's application,
# in the same transaction.
DONE = """;
    DELETE FROM waiting_notifications WHERE source = %(source)s AND event_id = %(event_id)s
"""

BACK_OFF = """
    UPDATE waiting_notifications SET not_before = now() + make_interval(secs => %(seconds)s), last_error = %(reason)s
    WHERE id = %(id)s AND state = 'waiting'
    RETURNING id
"""


def back_off(pool: Pool, claimed: Claimed, seconds: float, reason: str) -> None:
    """Leave claimed waiting for seconds more, saying why."""
    one_query(pool, BACK_OFF, {"id": claimed.id, "seconds": seconds, "reason": reason[:MAX_REASON_CHARS]})


# A claim given back untried: due again now, its claim not counted as an attempt.
RELEASE = """
    UPDATE waiting_notifications SET not_before = now(), attempts = greatest(attempts - 1, 0)
    WHERE id = %(id)s AND state = 'waiting'
    RETURNING id
"""


def release(pool: Pool, claimed: Claimed) -> None:
    """Give claimed back untried: any drain may claim it now."""
    one_query(pool, RELEASE, {"id": claimed.id})


END = "DELETE FROM waiting_notifications WHERE id = %(id)s RETURNING id"


def end(pool: Pool, claimed: Claimed) -> None:
    """The wait of claimed is over: its event was applied (or ended failed)."""
    one_query(pool, END, {"id": claimed.id})


class Backlog(NamedTuple):
    """The notifications waiting for one source: how many, and the oldest one's age."""

    source: str
    waiting: int
    oldest_seconds: float


BACKLOG = """
    SELECT source, count(*), coalesce(extract(epoch FROM now() - min(received_at)), 0)
    FROM waiting_notifications WHERE state = 'waiting' GROUP BY source ORDER BY source
"""


def backlog(pool: Pool, within_ms: int) -> list[Backlog]:
    """Per source with any waiting: the count and the oldest's age; psycopg.Error past within_ms (a scrape's)."""
    with pool.connection(timeout=within_ms / 1000) as conn, statement_timeout(pool, conn, within_ms), \
            conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = {int(within_ms)}")
        return [Backlog(source, count, float(age)) for source, count, age in conn.execute(BACKLOG).fetchall()]
