"""The drain: applies the notifications that wait for their provider's record, oldest first, on every host at once,
through the ledger's own apply_event (docs/design.md, "The provider's pace"). A thread in each gunicorn worker."""

import logging
import random
import threading
import time
from typing import TYPE_CHECKING

import psycopg

from ..core.errors import NoSlotError, OverBudgetError, ProviderUnavailableError
from ..intake.events import Event, StoredBodyError, stored_event
from ..settings.config import Settings
from ..store import ledger, waiting
from ..store.db import get_pool
from ..store.outcome import Outcome
from . import fetch, metrics, pages

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

# Claimed at once by one drain: few enough that a host dying mid-batch delays few, enough to keep a drain busy
# between two claims.
BATCH = 10
# Claimed at once by a drain that found a full BATCH due (behind): enough for several pages of one source's records
# (a page lists up to 100), few enough to apply within half a claim (each a short transaction, a few milliseconds).
BEHIND_BATCH = 500
# A batch's claim: BATCH calls at the provider's deadline each would take longer, but the budget paces a drain
# well below that; a claim that expires while its drain still works is only a wasted call (the ledger's unique keys
# decide), and a host that died frees its rows after this.
CLAIM_SECONDS = 30.0
# Between two looks when nothing is due: one indexed query a second per worker. No LISTEN: a transaction pooler
# (PgBouncer) cannot hold one.
IDLE_SECONDS = 1.0
# A notification whose provider could not answer is tried again after 2, 4, 8 ... s, never more than this apart:
# once the provider answers again, everything that waits is tried within it.
MAX_BACKOFF_SECONDS = 30.0
# A notification the ledger records failed (a refund before its payment's credit) is tried again this many times
# in all (about three and a half minutes with the backoff above), then ends failed, as a 422 delivery does: the
# failed-events count, `flask events replay`.
FAILED_ATTEMPTS = 10


class Drain:
    """One process's drain: its thread, and one round that any caller (a test, a command) may run."""

    def __init__(self, app: "Flask") -> None:
        self.app = app
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pause = 0.0  # seconds the whole drain waits before its next claim (the provider is down)

    def start(self) -> None:
        """Run rounds in a daemon thread until stop(); call it after gunicorn forked the worker."""
        self._thread = threading.Thread(target=self._run, name="drain", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.round()
            except psycopg.Error as exc:  # PostgreSQL unavailable: the rows wait in it, nothing is lost
                log.warning("drain: the database is unavailable (%s); trying again", type(exc).__name__)
                done = 0
            except Exception:  # a bug must not end the drain for the life of the worker
                log.exception("drain: a round failed")
                done = 0
            wait = self.pause or (0.0 if done else IDLE_SECONDS * random.uniform(0.5, 1.5))
            self._stop.wait(wait)

    def round(self) -> int:
        """Claim due notifications and apply each; return how many ended (applied, failed or unknown)."""
        pool = get_pool(self.app)
        started, ended, self.pause = time.monotonic(), 0, 0.0
        claimed = waiting.claim(pool, BATCH, CLAIM_SECONDS)
        calls, listed = fetch.of(self.app), {}
        if len(claimed) == BATCH and any(pages.pageable(calls, item) for item in claimed):
            # Behind, on a source whose provider lists its records: claim enough to read them in pages.
            claimed += waiting.claim(pool, BEHIND_BATCH - BATCH, CLAIM_SECONDS)
            listed = pages.read(calls, claimed)
            if not listed:  # nothing read in pages: the rest are other drains' again, each round a BATCH as before
                for rest in claimed[BATCH:]:
                    waiting.release(pool, rest)
                claimed = claimed[:BATCH]
        for index, item in enumerate(claimed):
            if time.monotonic() - started > CLAIM_SECONDS / 2:
                # The rest's claim is running out: due again now, for another round (or host).
                for rest in claimed[index:]:
                    waiting.release(pool, rest)
                break
            try:
                ended += self.apply(item, listed.get((item.source, item.event_id)))
            except ProviderUnavailableError as exc:
                seconds = _backoff(item.attempts)
                waiting.back_off(pool, item, seconds, str(exc))
                # The provider is down (or refuses us): the rest of the batch waits with it, and so does this drain.
                for rest in claimed[index + 1:]:
                    waiting.back_off(pool, rest, seconds, f"waiting with {item.event_id}: {exc}")
                self.pause = seconds
                break
        return ended

    def apply(self, item: waiting.Claimed, listed: bytes | None = None) -> int:
        """Fetch item's record (listed: as a page carried it, pages.read) and apply it (1), or record that its
        provider has none (1); raise ProviderUnavailableError when the provider cannot answer, waiting for a slot or
        the budget first."""
        settings, calls, pool = Settings.of(self.app), fetch.of(self.app), get_pool(self.app)
        source = calls.serving(item.source)
        try:
            event = stored_event(item.source, item.event_id, item.event_type, item.body, item.payload_sha256)
        except StoredBodyError as exc:  # not bytes this service stored: say so, bounded, and stop asking
            waiting.unknown(pool, _event_of(item), item.payload_sha256, f"not applied: {exc}")
            return 1
        if source is None:
            raise ProviderUnavailableError(f"no source serves {item.source}'s events with an API key on this host")
        while True:
            try:
                fetched = calls.fetch(source, event, settings.policy, listed)
                break
            except OverBudgetError as exc:  # the shared budget: wait for it, as long as it says
                time.sleep(exc.wait_seconds)
            except NoSlotError:  # the process's inline fetches hold every slot: they end within the deadline
                time.sleep(0.05)
        if fetched.effect.sha256 == ledger.UNKNOWN_EFFECT:
            waiting.unknown(pool, event, item.payload_sha256, fetched.effect.problem or "the provider has no record")
            self._count(item.source, "unknown")
            return 1
        result = ledger.apply_event(pool, fetched.event, fetched.effect, item.payload_sha256, settings.policy,
                                    fetched=fetched.body)
        if result.outcome == Outcome.FAILED and item.attempts < FAILED_ATTEMPTS:
            # Recorded failed (a refund before its payment's credit, say): tried again as the provider would have
            # retried a 422, had it not been answered 202.
            waiting.back_off(pool, item, _backoff(item.attempts), result.problem or "failed")
            return 0
        waiting.end(pool, item)  # a crash before this: the next claim fetches again, and the ledger says duplicate
        self._count(item.source, result.outcome)
        if result.outcome not in (Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.IGNORED):
            log.warning("drain: event %s (source %s) ended %s: %s", item.event_id, item.source, result.outcome,
                        result.problem)
        return 1

    def _count(self, source: str, outcome: str) -> None:
        metrics.of(self.app).drained.labels(source=source, outcome=outcome).inc()


def _event_of(item: waiting.Claimed) -> Event:
    return Event(item.event_id, item.event_type, {}, {}, b"", item.source)


def _backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 2.0 ** attempts)


EXTENSION = "drain"


def start(app: "Flask") -> Drain:
    """Start the app's drain in this process (wsgi.py: each gunicorn worker, after the fork)."""
    drain = app.extensions[EXTENSION] = Drain(app)
    drain.start()
    return drain
