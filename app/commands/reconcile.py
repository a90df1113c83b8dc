"""`flask reconcile`: the events whose deliveries were lost, recovered from the provider's own event list
(an `EventList`) and applied as live deliveries are (docs/design.md, "Reconciliation")."""

import hashlib
import json
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

import psycopg

from ..core.errors import ProviderError
from ..core.records import EventList, ListedEvent
from ..core.vocabulary import MAX_ID_CHARS, MAX_TYPE_CHARS, excerpt, load
from ..intake.events import Effect, Event, InvalidEventError, InvalidJSONError, Policy, effect_of, parse
from ..receiver.webhooks import too_large
from ..store.db import Pool, transaction
from ..store.ledger import Origin, Result, apply_event, replay
from ..store.outcome import Outcome

# Events reach the list a little after they are created (their `created` is
# earlier than the moment they can be listed): a run without --since starts
# this long before where the last complete one got to. Its cost is listing
# again, as duplicates, what that run saw.
OVERLAP = timedelta(minutes=15)
# A first run (no watermark) starts this far inside the provider's horizon, so
# that the oldest events it lists are still listed when it reaches them.
HORIZON_MARGIN = timedelta(hours=1)
# Threads that apply a page's events, each its share of the payments: a
# delivery is one round trip and one commit, so one at a time a run is bound
# by the commit's flush (about 1.6 ms here); eight overlap them (PostgreSQL
# flushes concurrent commits together). Each holds a pooled connection.
APPLIERS = 8
# An event that meets a transient PostgreSQL refusal (a lock or statement
# timeout: a live delivery of the same event holding its row, a deadlock, its row purged under it) is
# tried again, this many times, 0.1 s apart, before the run fails.
TRANSIENT_TRIES = 5
# The refused events a run keeps, to try once more at its end and to name in
# its summary. A run's memory must not grow with its window (a window of
# refunds whose payments are older could refuse every event); each refused
# event is recorded failed in PostgreSQL whatever this keeps, and those
# beyond it are counted, and left to `flask events replay`.
REFUSED_KEPT = 1000
# reconcile_runs.account and reconcile_watermarks.account of the platform's own (the API key's) account.
PLATFORM = ""
TRANSIENT = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, psycopg.errors.SerializationFailure,
             psycopg.errors.DeadlockDetected)


class RunStatus(StrEnum):
    """reconcile_runs.status."""

    RUNNING = "running"
    COMPLETED = "completed"  # every event of the window listed, and applied or refused (counted)
    INCOMPLETE = "incomplete"  # part of the window was beyond the provider's horizon: not provable
    FAILED = "failed"  # the provider refused the key or stayed unavailable
    INTERRUPTED = "interrupted"  # killed midway; marked by the next run of its source and account
    YIELDED = "yielded"  # another run of the source (and account) held it


class Refused(NamedTuple):
    event_id: str
    event_type: str
    reason: str


@dataclass
class Tally:
    """A run's counts: a few integers and at most REFUSED_KEPT refusals, whatever the window."""

    pages: int = 0
    listed: int = 0
    applied: int = 0  # recovered: stored (or completed) by this run
    duplicates: int = 0  # applied before: delivered live, or by an earlier run
    retried: int = 0  # dry run: stored failed, would be tried again
    refused: list[Refused] = field(default_factory=list)  # the first REFUSED_KEPT, named in the summary
    refused_unnamed: int = 0  # refused beyond those: counted only

    @property
    def refused_count(self) -> int:
        return len(self.refused) + self.refused_unnamed

    def refuse(self, refusal: Refused) -> None:
        if len(self.refused) < REFUSED_KEPT:
            self.refused.append(refusal)
        else:
            self.refused_unnamed += 1


@dataclass
class Summary:
    source: str
    provider: str
    since: datetime
    until: datetime
    status: RunStatus
    tally: Tally
    run_id: int | None = None
    message: str = ""
    from_watermark: datetime | None = None  # the watermark a window without --since started from
    unprovable: tuple[datetime, datetime] | None = None  # the part of the window beyond the horizon
    watermark: datetime | None = None  # where the source's (account's) watermark is after the run
    dry_run: bool = False
    account: str | None = None  # the connected account whose events were listed; None: the platform's own


LOCK_WATERMARK = """
    INSERT INTO reconcile_watermarks (source, account) VALUES (%(source)s, %(account)s)
    ON CONFLICT (source, account) DO NOTHING;
"""
HOLD_WATERMARK = """
    SELECT reconciled_until FROM reconcile_watermarks WHERE source = %(source)s AND account = %(account)s
    FOR UPDATE NOWAIT
"""
READ_WATERMARK = "SELECT reconciled_until FROM reconcile_watermarks WHERE source = %(source)s AND account = %(account)s"
INTERRUPTED = """
    UPDATE reconcile_runs SET status = 'interrupted', finished_at = now(),
           message = 'ended before it finished (killed, or its connection lost): the next run lists its window again'
    WHERE source = %(source)s AND account = %(account)s AND status = 'running'
"""
START_RUN = """
    INSERT INTO reconcile_runs (source, account, since, until, status)
    VALUES (%(source)s, %(account)s, %(since)s, %(until)s, %(status)s)
    RETURNING id
"""
PROGRESS = """
    UPDATE reconcile_runs SET pages = %(pages)s, listed = %(listed)s, applied = %(applied)s,
           duplicates = %(duplicates)s, refused = %(refused)s
    WHERE id = %(id)s
"""
FINISH_RUN = """
    UPDATE reconcile_runs SET status = %(status)s, pages = %(pages)s, listed = %(listed)s, applied = %(applied)s,
           duplicates = %(duplicates)s, refused = %(refused)s, message = %(message)s, finished_at = now()
    WHERE id = %(id)s
"""
MOVE_WATERMARK = """
    UPDATE reconcile_watermarks SET reconciled_until = %(until)s, run_id = %(id)s, updated_at = now()
    WHERE source = %(source)s AND account = %(account)s
"""
# For a dry run: what is stored of a page's events (a purged one that moved money: its journal row).
STORED = """
    SELECT event_id, status FROM webhook_events WHERE source = %(source)s AND event_id = ANY(%(ids)s)
    UNION ALL
    SELECT event_id, 'completed' FROM ledger_journal WHERE source = %(source)s AND event_id = ANY(%(ids)s)
"""


class RunLockedError(RuntimeError):
    """Another run of the source's account holds its watermark row."""


def _seconds(moment: datetime) -> int:
    return int(moment.timestamp())


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def window(listing: EventList, watermark: datetime | None, since: datetime | None, until: datetime | None,
           now: datetime) -> tuple[datetime, datetime, tuple[datetime, datetime] | None]:
    """(since, until, the part before the horizon or None) of a run; a datetime without offset is UTC."""
    horizon = now - timedelta(days=listing.horizon_days)
    until = min(_utc(until), now) if until is not None else now
    if since is None:
        since = watermark - OVERLAP if watermark is not None else horizon + HORIZON_MARGIN
    since = _utc(since).replace(microsecond=0)
    until = until.replace(microsecond=0)
    unprovable = (since, min(horizon + HORIZON_MARGIN, until)) if since < horizon else None
    return since, until, unprovable


def reconcile(pool: Pool, source: str, listing: EventList, policy: Policy, since: datetime | None = None,
              until: datetime | None = None, dry_run: bool = False, now: datetime | None = None,
              on_result: Callable[[Result], object] = lambda result: None, *, max_body_bytes: int,
              scheme: str) -> Summary:
    """List source's events of the window and apply each as a live delivery of scheme would; return the run's Summary.
    ProviderError (the run recorded failed) when the window cannot be listed; psycopg's when PostgreSQL is down."""
    # source is the name its events are stored under (Source.event_source); listing.account the connected account
    # whose events, run and watermark these are (None: the platform's own); max_body_bytes the largest body a
    # delivery may have (MAX_BODY_BYTES); on_result is told what applying each event came to (for /metrics). A page
    # that cannot be followed is a ProviderError too; after a psycopg error, the next run marks this one interrupted.
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    key = _key(source, listing)
    if dry_run:
        with transaction(pool) as conn:
            row = conn.execute(READ_WATERMARK, key).fetchone()
        return _dry_run(pool, source, listing, row[0] if row else None, since, until, now, max_body_bytes, scheme)
    failure: ProviderError | None = None
    try:
        # The run's lock: the watermark row of the source's account, held FOR
        # UPDATE by one transaction left open for the whole run. A killed
        # run's connection closes, and PostgreSQL ends the transaction and frees the row.
        with transaction(pool, idle_in_transaction_session_timeout=0) as holder:
            watermark = _hold(holder, key)
            first, last, unprovable = window(listing, watermark, since, until, now)
            summary = Summary(source, listing.name, first, last, RunStatus.RUNNING, Tally(),
                              from_watermark=watermark if since is None else None, unprovable=unprovable,
                              account=listing.account)
            holder.execute(INTERRUPTED, key)
            with transaction(pool) as conn:  # committed now: the run is seen while it runs
                summary.run_id = conn.execute(START_RUN, {**key, "since": first, "until": last,
                                                          "status": RunStatus.RUNNING}).fetchone()[0]  # type: ignore
            try:
                _apply_window(pool, source, listing, policy, summary, on_result, max_body_bytes, scheme)
            except ProviderError as exc:
                summary.status, summary.message = RunStatus.FAILED, str(exc)
                summary.watermark, failure = watermark, exc
                _finish(holder, summary)  # committed with the holder, the watermark as it was
            else:
                _complete(holder, key, listing, summary, watermark)
        if failure is not None:
            raise failure
        return summary
    except RunLockedError:
        return _yielded(pool, source, listing, since, until, now)


def _key(source: str, listing: EventList) -> dict[str, str]:
    """The source and account that name a run's records and its watermark."""
    return {"source": source, "account": listing.account or PLATFORM}


def _complete(holder: psycopg.Connection, key: dict[str, str], listing: EventList, summary: Summary,
              watermark: datetime | None) -> None:
    """Record the run's end and, when its window started at or before the watermark, move the watermark."""
    first, last, unprovable = summary.since, summary.until, summary.unprovable
    covers = watermark is None or first <= watermark
    summary.watermark = last if covers and (watermark is None or last > watermark) else watermark
    if unprovable:
        summary.status = RunStatus.INCOMPLETE
        summary.message = (f"{_text(unprovable[0])} to {_text(unprovable[1])} is beyond {listing.name}'s "
                           f"{listing.horizon_days}-day limit: it cannot be listed, so not provable")
    else:
        summary.status = RunStatus.COMPLETED
        summary.message = f"{summary.tally.applied} recovered, {summary.tally.refused_count} refused"
    _finish(holder, summary)
    if summary.watermark != watermark:
        holder.execute(MOVE_WATERMARK, {**key, "until": summary.watermark, "id": summary.run_id})


def _yielded(pool: Pool, source: str, listing: EventList, since: datetime | None, until: datetime | None,
             now: datetime) -> Summary:
    """Record a run that found another running, and say so."""
    first, last, _ = window(listing, None, since, until, now)
    whose = f"account {listing.account} of this source" if listing.account else "this source"
    with transaction(pool) as conn:
        run_id = conn.execute(START_RUN, {**_key(source, listing), "since": first, "until": last,
                                          "status": RunStatus.YIELDED}).fetchone()[0]  # type: ignore[index]
        conn.execute("UPDATE reconcile_runs SET finished_at = now(), message = %s WHERE id = %s",
                     [f"another run of {whose} was running", run_id])
    return Summary(source, listing.name, first, last, RunStatus.YIELDED, Tally(), run_id,
                   f"another reconcile of {whose} is running (it holds the watermark row): this one yields",
                   account=listing.account)


def _listed_since(summary: Summary) -> int:
    """Where listing starts: the window's start, or, past the horizon, where the provider still lists."""
    return _seconds(summary.unprovable[1] if summary.unprovable else summary.since)


def _hold(holder: psycopg.Connection, key: dict[str, str]) -> datetime | None:
    """Lock the watermark row of key's source and account (made if new) for this run; return the watermark.
    RunLockedError if held."""
    try:
        holder.execute(LOCK_WATERMARK, key)  # waits at most lock_timeout on a twin's new row
        row = holder.execute(HOLD_WATERMARK, key).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise RunLockedError(key["source"]) from None
    assert row is not None
    watermark: datetime | None = row[0]
    return watermark


def _finish(holder: psycopg.Connection, summary: Summary) -> None:
    tally = summary.tally
    holder.execute(FINISH_RUN, {"id": summary.run_id, "status": summary.status, "pages": tally.pages,
                                "listed": tally.listed, "applied": tally.applied, "duplicates": tally.duplicates,
                                "refused": tally.refused_count, "message": summary.message})


def _apply_window(pool: Pool, source: str, listing: EventList, policy: Policy, summary: Summary,
                  on_result: Callable[[Result], object], max_body_bytes: int, scheme: str) -> None:
    """Apply every event of the summary's window, oldest first per payment; then try the refused ones once more."""
    # A page's events are applied by APPLIERS threads, each taking the events of some payments in the list's order
    # (a payment's refund after its credit), the next page fetched meanwhile; a page is done before the next.
    tally = summary.tally
    pool.resize(pool.min_size, max(pool.max_size, APPLIERS + 2))  # the appliers, the run's lock and its record
    with ThreadPoolExecutor(APPLIERS, thread_name_prefix="reconcile") as appliers:
        for page in _fetched_ahead(listing.pages(_listed_since(summary), _seconds(summary.until))):
            tally.pages += 1
            tally.listed += len(page)
            lanes: dict[int, list[tuple[Event, Effect, ListedEvent]]] = {}
            for listed in page:
                event = _read(listed, source, scheme, listing.account, max_body_bytes, tally)
                if event is not None:
                    effect = effect_of(event, policy)
                    lane = zlib.crc32((effect.payment_id or event.id).encode()) % APPLIERS
                    lanes.setdefault(lane, []).append((event, effect, listed))
            results = appliers.map(lambda lane: [(event, _applied(pool, event, listed, policy, effect))
                                                 for event, effect, listed in lane], lanes.values())
            for lane_results in results:
                for event, result in lane_results:
                    _count(tally, event, result)
                    on_result(result)
            with transaction(pool) as conn:
                conn.execute(PROGRESS, {"id": summary.run_id, "pages": tally.pages, "listed": tally.listed,
                                        "applied": tally.applied, "duplicates": tally.duplicates,
                                        "refused": tally.refused_count})
    # A refund listed before its payment (both created in one second, in
    # the list's order) found no payment: now that every event is in, once more.
    refused, tally.refused = tally.refused, []
    for refusal in refused:
        again = replay(pool, source, refusal.event_id, policy) if refusal.reason.startswith("unknown payment") else None
        if again is not None:
            on_result(again)
        if again is not None and again.outcome == Outcome.PROCESSED:
            tally.applied += 1
        else:
            tally.refuse(refusal)


def _read(listed: ListedEvent, source: str, scheme: str, account: str | None, max_body_bytes: int,
          tally: Tally) -> Event | None:
    """The listed event read as a delivery's body is (its size, then events.parse); None, refused and counted but
    not stored, where a delivery of it would be refused 413 or 400, or where it is not of the account listed (its
    `account` other than account's, or, listed as the platform's own, any)."""
    if len(listed.body) > max_body_bytes:
        problem = too_large(max_body_bytes)
    else:
        try:
            event = parse(listed.body, scheme, None, source)
        except (InvalidJSONError, InvalidEventError) as exc:
            problem = str(exc)
        else:
            named = event.document.get("account")
            if named == account:
                return event
            whose = f"account {account}" if account else "the platform's own account"
            names = "no account" if named is None else \
                f"the account {excerpt(named if isinstance(named, str) else json.dumps(named), MAX_ID_CHARS)}"
            problem = f"listed as an event of {whose}, it names {names}"
    tally.refuse(Refused(excerpt(listed.id, MAX_ID_CHARS), _type_of(listed.body), f"not stored: {problem}"))
    return None


def _type_of(body: bytes) -> str:
    """The type an unreadable event names, to name it by ("?" if none)."""
    try:
        event_type = load(body).get("type")
    except InvalidJSONError:
        return "?"
    return excerpt(event_type, MAX_TYPE_CHARS) if isinstance(event_type, str) else "?"


def _count(tally: Tally, event: Event, result: Result) -> None:
    if result.outcome == Outcome.PROCESSED:
        tally.applied += 1
    elif result.outcome in (Outcome.DUPLICATE, Outcome.IGNORED):  # ignored: not ours, by the source's NO_USER
        tally.duplicates += 1
    elif result.outcome == Outcome.PAYLOAD_MISMATCH:  # the stored event is left as it is: not recorded failed
        tally.refuse(Refused(event.id, event.type, "payload_mismatch: stored before with another effect, which "
                                                   "it keeps (not recorded failed; `flask events show` it)"))
    else:
        tally.refuse(Refused(event.id, event.type, result.problem or str(result.outcome)))


def _fetched_ahead(pages: Iterator[list[ListedEvent]]) -> Iterator[list[ListedEvent]]:
    """pages, the next one fetched (in a thread) while the caller applies this one: two in memory at most."""
    with ThreadPoolExecutor(1, thread_name_prefix="reconcile-list") as fetcher:
        ahead = fetcher.submit(next, pages, None)
        while (page := ahead.result()) is not None:
            ahead = fetcher.submit(next, pages, None)
            yield page


def _applied(pool: Pool, event: Event, listed: ListedEvent, policy: Policy, effect: Effect) -> Result:
    """apply_event, as a live delivery calls it, tried again on a transient refusal (PostgreSQL decides)."""
    payload_sha256 = hashlib.sha256(listed.body).digest()
    for attempt in range(TRANSIENT_TRIES):
        try:
            return apply_event(pool, event, effect, payload_sha256, policy, origin=Origin.RECONCILE)
        except TRANSIENT:
            if attempt == TRANSIENT_TRIES - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _dry_run(pool: Pool, source: str, listing: EventList, watermark: datetime | None, since: datetime | None,
             until: datetime | None, now: datetime, max_body_bytes: int, scheme: str) -> Summary:
    """List the window and say what a run would do, writing nothing."""
    first, last, unprovable = window(listing, watermark, since, until, now)
    summary = Summary(source, listing.name, first, last, RunStatus.COMPLETED, Tally(), dry_run=True,
                      from_watermark=watermark if since is None else None, unprovable=unprovable,
                      watermark=watermark, account=listing.account)
    tally = summary.tally
    for page in listing.pages(_listed_since(summary), _seconds(last)):
        tally.pages += 1
        tally.listed += len(page)
        events = [event for listed in page
                  if (event := _read(listed, source, scheme, listing.account, max_body_bytes, tally)) is not None]
        with transaction(pool) as conn:
            stored = dict(conn.execute(STORED, {"source": source, "ids": [event.id for event in events]}).fetchall())
        for event in events:
            status = stored.get(event.id)
            if status is None:
                tally.applied += 1
            elif status == "completed":
                tally.duplicates += 1
            else:
                tally.retried += 1
    if unprovable:
        summary.status = RunStatus.INCOMPLETE
        summary.message = (f"{_text(unprovable[0])} to {_text(unprovable[1])} is beyond {listing.name}'s "
                           f"{listing.horizon_days}-day limit: it cannot be listed, so not provable")
    return summary


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
