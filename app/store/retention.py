"""Retention: `flask events purge` deletes old events in short batches.
Only webhook_events rows go; the journal and payments are kept for ever (docs/design.md, "Invariant 5")."""

from collections.abc import Callable
from datetime import datetime

import psycopg

from .db import Pool, transaction
from .ledger import Status

# Longer than Stripe's 30-day window for resending an event by hand, so that
# a resent event still finds its row (and its payload hash) in the table.
DEFAULT_DAYS = 35
# Rows per transaction: each batch holds its row locks briefly, well inside
# the statement timeout, and never locks the table.
BATCH_SIZE = 1000

CUTOFF = "SELECT now() - make_interval(days => %s)"
# The next rows after the last batch's, oldest first in the primary key's
# order (ids grow with arrival): which of them go, and whether the batch
# reached the cutoff, where the purge stops, without an index of created_at.
NEXT_ROWS = """
    SELECT id, created_at < %(cutoff)s AND status = ANY(%(statuses)s)
                   AND (%(source)s::text IS NULL OR source = %(source)s),
           created_at >= %(cutoff)s
    FROM webhook_events WHERE id > %(after)s ORDER BY id LIMIT %(batch)s
"""
# The rows a purge will delete, for its progress: a scan of the table (no index of created_at), once, before the
# batches; rows a delivery holds then are left, so fewer may go.
TO_DELETE = """
    SELECT count(*) FROM webhook_events
    WHERE created_at < %(cutoff)s AND status = ANY(%(statuses)s) AND (%(source)s::text IS NULL OR source = %(source)s)
"""
# SKIP LOCKED: a row that a delivery or a replay holds now is left for the
# next purge instead of being waited for; the row is judged again as it is now.
DELETE_ROWS = """
    DELETE FROM webhook_events WHERE id IN (
        SELECT id FROM webhook_events
        WHERE id = ANY(%(ids)s) AND created_at < %(cutoff)s AND status = ANY(%(statuses)s)
        FOR UPDATE SKIP LOCKED)
"""


def purge(pool: Pool, days: int, include_failed: bool = False, batch_size: int = BATCH_SIZE,
          source: str | None = None, on_total: Callable[[int], object] = lambda n: None,
          on_deleted: Callable[[int], object] = lambda n: None) -> tuple[int, datetime]:
    """Delete the completed events (failed ones too when include_failed) of source (None: every source's)
    received more than days ago; return (rows deleted, cutoff)."""
    # on_total(n) is told how many rows are to go, then on_deleted(n) of each batch's.
    statuses = [Status.COMPLETED, Status.FAILED] if include_failed else [Status.COMPLETED]
    deleted = 0
    with transaction(pool) as conn:
        row = conn.execute(CUTOFF, [days]).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    cutoff = row[0]
    try:
        with transaction(pool) as conn:
            counted = conn.execute(TO_DELETE, {"cutoff": cutoff, "statuses": statuses, "source": source}).fetchone()
        assert counted is not None  # an aggregate returns one row
        on_total(counted[0])
    except psycopg.errors.QueryCanceled:  # a table too big to count within the statement timeout: no total, a count
        pass
    after = 0
    while True:  # each batch is a transaction of its own, with the pool's timeouts
        params = {"cutoff": cutoff, "statuses": statuses, "source": source, "after": after, "batch": batch_size}
        with transaction(pool) as conn:
            rows = conn.execute(NEXT_ROWS, params).fetchall()
            ids = [id_ for id_, goes, _ in rows if goes]
            if ids:
                batch = conn.execute(DELETE_ROWS, {**params, "ids": ids}).rowcount
                deleted += batch
                on_deleted(batch)
        # A row received after the cutoff ends it: every later id is later
        # still (but for the seconds a transaction may take, which the next
        # purge finds).
        if len(rows) < batch_size or any(recent for _, _, recent in rows):
            return deleted, cutoff
        after = rows[-1][0]
