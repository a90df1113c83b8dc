"""Retention: `flask events purge` deletes old events in short batches.

Only webhook_events rows go. ledger_journal and payments rows are the ledger
and are kept for ever: the balances still add up after a purge, and a purged
payment redelivered later is recognised by its journal row (or its payment)
and not credited twice.
"""

from datetime import datetime

from .db import Pool, transaction
from .ledger import Status

# Longer than Stripe's 30-day window for resending an event by hand, so that
# a resent event still finds its row (and its payload hash) in the table.
DEFAULT_DAYS = 35
# Rows per transaction: each batch holds its row locks briefly, well inside
# the statement timeout, and never locks the table.
BATCH_SIZE = 1000

CUTOFF = "SELECT now() - make_interval(days => %s)"
# SKIP LOCKED: a row that a delivery or a replay holds now is left for the
# next purge instead of being waited for.
DELETE_BATCH = """
    DELETE FROM webhook_events WHERE id IN (
        SELECT id FROM webhook_events
        WHERE created_at < %(cutoff)s AND status = ANY(%(statuses)s)
          AND (%(source)s::text IS NULL OR source = %(source)s)
        ORDER BY created_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
"""


def purge(pool: Pool, days: int, include_failed: bool = False, batch_size: int = BATCH_SIZE,
          source: str | None = None) -> tuple[int, datetime]:
    """Delete the events received more than days ago; return (rows deleted, cutoff).

    Completed events only, and failed ones too when include_failed; every
    source's, or source's only.
    """
    statuses = [Status.COMPLETED, Status.FAILED] if include_failed else [Status.COMPLETED]
    deleted = 0
    with transaction(pool) as conn:
        row = conn.execute(CUTOFF, [days]).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    cutoff = row[0]
    while True:  # each batch is a transaction of its own, with the pool's timeouts
        with transaction(pool) as conn:
            count = conn.execute(DELETE_BATCH, {"cutoff": cutoff, "statuses": statuses, "batch": batch_size,
                                                "source": source}).rowcount
        deleted += count
        if count < batch_size:
            return deleted, cutoff
