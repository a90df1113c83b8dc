"""Prometheus metrics, served at GET /metrics, correct across gunicorn workers
(docs/operations.md, "Metrics: `GET /metrics`")."""

import collections
import glob
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from flask import Flask, Response, current_app
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.records import BreakClass
from ..locking.lock import LockState
from ..settings.config import Settings
from ..store import waiting
from ..store.db import Pool, get_pool, pool_as_it_is, statement_timeout
from ..store.ledger import Change, Result
from ..store.outcome import Outcome

if TYPE_CHECKING:  # delivery.py counts each delivery here
    from .delivery import Delivery

log = logging.getLogger(__name__)

# From a duplicate answered by Redis alone up past PG_POOL_TIMEOUT_MS, whose
# 503 ends the slowest delivery.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Seconds between two readings of a worker's pool figures outside a scrape.
POOL_INTERVAL = 1.0

# psycopg_pool's get_stats() key -> gauge name and help. Each worker sets its
# own pool's figures; a scrape adds up those of the workers alive now.
POOL_GAUGES = {
    "pool_size": ("webhook_ledger_db_pool_connections", "Open database connections"),
    "pool_available": ("webhook_ledger_db_pool_idle_connections", "Database connections idle in the pool"),
    "requests_waiting": ("webhook_ledger_db_pool_waiting_requests", "Requests waiting for a database connection"),
    "pool_max": ("webhook_ledger_db_pool_max_connections", "Most database connections the pools may open"),
}


PAYMENT_MISMATCHES = "webhook_ledger_payment_mismatches"
BELOW_ZERO = "webhook_ledger_balances_below_zero"

# ledger.Change -> counter name and help.
CHANGES = {
    Change.CREDIT: ("webhook_ledger_payments_credited", "Payments credited (each payment once)"),
    Change.PAYMENT_DUPLICATE: (
        "webhook_ledger_payment_duplicates",
        "Events announcing a payment already credited by another event (200 duplicate, nothing credited)"),
    Change.PAYMENT_USER_DISAGREED: (
        "webhook_ledger_payment_user_disagreements",
        "Events announcing a credited payment with another user, one of the two read from its object as it is now "
        "(its metadata changed after it succeeded): 200 duplicate, the first credit stands"),
    Change.REFUND: ("webhook_ledger_refunds_applied",
                    "Refund events that debited a refund (by its object, or what a higher refunded total adds)"),
    Change.REFUND_REVERSED: ("webhook_ledger_refunds_reversed",
                             "Refunds that failed or were canceled after they were debited, given back"),
    Change.DISPUTE_WITHDRAWN: ("webhook_ledger_disputes_withdrawn", "Disputes whose funds were withdrawn, debited"),
    Change.DISPUTE_REINSTATED: ("webhook_ledger_disputes_reinstated",
                                "Disputes whose funds were reinstated, given back"),
}


def counted(outcome: str | None, change: str | None, balance_after: int | None) -> list[str]:
    """The counters (by name) that applying an event adds one to: its change, a balance below zero, a mismatch."""
    names = []
    if change:
        names.append(CHANGES[Change(change)][0])
        if balance_after is not None and balance_after < 0:
            names.append(BELOW_ZERO)
    if outcome == Outcome.PAYMENT_MISMATCH:
        names.append(PAYMENT_MISMATCHES)
    return names


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # source: a configured name only (never a name taken from a request).
        self.deliveries = Counter(
            "webhook_ledger_deliveries", "Deliveries to POST /api/webhooks by outcome; reason names a rejection",
            ["source", "outcome", "reason"], registry=registry)
        self.latency = Histogram(
            "webhook_ledger_delivery_duration_seconds", "Time from request to answer of a delivery, by outcome",
            ["source", "outcome"], buckets=LATENCY_BUCKETS, registry=registry)
        self.unknown_source = Counter(
            "webhook_ledger_unknown_source_requests",
            "Requests under /api/webhooks that reach no configured source: an unknown name, no route, not a POST",
            registry=registry)
        self.reserialised = Counter(
            "webhook_ledger_reserialised_deliveries",
            "Re-deliveries of a stored event's effect in other bytes: duplicate, or processed after failing",
            ["source", "outcome"], registry=registry)
        self.redis_degraded = Counter(
            "webhook_ledger_redis_degraded_deliveries",
            "Deliveries applied without a Redis lock: Redis unreachable or faulty", registry=registry)
        self.redis_faults = Counter(
            "webhook_ledger_redis_faults",
            "Deliveries that met a Redis fault (an error answer, not an outage), by reason: NOPERM, OOM, ...",
            ["reason"], registry=registry)
        # Keyed by value: a delivery's change is a StrEnum (delivery.py), equal to its value.
        self.changes: dict[str, Counter] = {change: Counter(name, text, ["source"], registry=registry)
                        for change, (name, text) in CHANGES.items()}
        self.payment_mismatches = Counter(
            PAYMENT_MISMATCHES,
            "Events naming a credited payment otherwise (user, amount, currency), or a known refund or dispute"
            " otherwise (payment, amount): 409, nothing moved",
            ["source"], registry=registry)
        self.below_zero = Counter(
            BELOW_ZERO,
            "Refunds and disputes that left their user's balance below zero (recorded all the same)", ["source"],
            registry=registry)
        # By name, the counters that a `flask` command's changes add to (CommandCounts).
        self.by_name: dict[str, Counter] = {
            **{name: self.changes[change] for change, (name, _) in CHANGES.items()},
            PAYMENT_MISMATCHES: self.payment_mismatches, BELOW_ZERO: self.below_zero}
        # provider: a scheme's provider, or paypal_certificates (PayPal's certificate host); result: the HTTP
        # status, or timeout, unreachable, no_slot, no_budget (the certificate host's), stale_token (a PayPal token
        # refused once, and renewed).
        self.provider_calls = Counter(
            "webhook_ledger_provider_calls", "Calls to providers' APIs, by provider and result (status, timeout, "
            "unreachable, no_slot, no_budget, stale_token)", ["provider", "result"], registry=registry)
        self.provider_latency = Histogram(
            "webhook_ledger_provider_call_duration_seconds", "Time a call to a provider's API took",
            ["provider"], buckets=LATENCY_BUCKETS, registry=registry)
        self.contradictions = Counter(
            "webhook_ledger_provider_contradictions",
            "Events whose provider's record moved other money than the notification said: the record decided",
            ["source"], registry=registry)
        self.drained = Counter(
            "webhook_ledger_drained_notifications",
            "Accepted notifications the drain ended, by outcome (processed, duplicate, failed, unknown: the provider "
            "had no record of it, ...)", ["source", "outcome"], registry=registry)
        self.pool = {key: Gauge(name, text, registry=registry, multiprocess_mode="livesum")
                     for key, (name, text) in POOL_GAUGES.items()}
        self._pool_observed_at = 0.0

    def observe_delivery(self, delivery: "Delivery", seconds: float) -> None:
        """Count one delivery by outcome, and its latency."""
        if delivery.source is None:
            self.unknown_source.inc()
            return
        self.deliveries.labels(source=delivery.source, outcome=delivery.outcome, reason=delivery.reason or "").inc()
        self.latency.labels(source=delivery.source, outcome=delivery.outcome).observe(seconds)
        if delivery.reserialised:
            self.reserialised.labels(source=delivery.source, outcome=delivery.outcome).inc()
        for name in counted(delivery.outcome, delivery.change, delivery.balance_after):
            self.by_name[name].labels(source=delivery.source).inc()
        if delivery.lock_state == LockState.DEGRADED:
            self.redis_degraded.inc()
        if delivery.redis_fault:
            self.redis_faults.labels(reason=delivery.redis_fault).inc()
        if delivery.contradicted:
            self.contradictions.labels(source=delivery.source).inc()

    def observe_call(self, provider: str, result: str, seconds: float) -> None:
        """Count one call to a provider's API (app/providers/outbound.py), and its time."""
        self.provider_calls.labels(provider=provider, result=result).inc()
        self.provider_latency.labels(provider=provider).observe(seconds)

    def observe_pool(self, pool: Pool, at_most_every: float = 0.0) -> None:
        now = time.monotonic()
        if now - self._pool_observed_at < at_most_every:
            return
        self._pool_observed_at = now
        # A pool not yet opened (no request in this worker needed it) has none.
        stats = {"pool_max": pool.max_size} if pool.closed else pool.get_stats()
        for key, gauge in self.pool.items():
            gauge.set(stats.get(key, 0))


# `flask reconcile` runs outside gunicorn (a timer): its figures are read
# from its records in PostgreSQL at each scrape, whichever host answers it.
RECONCILE_RUNS = """
    SELECT source, status, count(*), sum(applied)
    FROM reconcile_runs WHERE status <> 'running' GROUP BY source, status
"""
# A source's last success is that of its account reconciled least recently (0: one never was), among those with a
# watermark row: the platform's own and each connected account a run has listed (`--account`, `--all-accounts`).
RECONCILE_LAST_SUCCESS = """
    SELECT w.source, min(coalesce(extract(epoch FROM last.finished_at), 0))
    FROM reconcile_watermarks w CROSS JOIN LATERAL (
        SELECT max(r.finished_at) AS finished_at FROM reconcile_runs r
        WHERE r.source = w.source AND r.account = w.account AND r.status = 'completed') last
    GROUP BY w.source
"""

# The application's holds (money.sql's place_hold): those that count now, what they reserve, and those past their
# expiry that nobody closed (they count for nothing; `flask users tidy-holds` closes them). The partial index
# holds_held_idx holds exactly the held ones.
HOLDS = """
    SELECT count(*) FILTER (WHERE expires_at > now()), coalesce(sum(amount_cents) FILTER (WHERE expires_at > now()), 0),
           count(*) FILTER (WHERE expires_at <= now())
    FROM holds WHERE state = 'held'
"""


# reconcile_runs.status of a run that ended (app/commands/reconcile.py's RunStatus, but for 'running').
ENDED = ("completed", "incomplete", "failed", "interrupted", "yielded")
# The longest a scrape waits for PostgreSQL (a connection, then the query), in ms.
SCRAPE_DB_MS = 500


@contextmanager
def _scrape_reads(app: Flask) -> "Iterator[psycopg.Connection[Any]]":
    """A pooled connection for a collector's reads, in one transaction, each bounded well under a scrape's timeout:
    a database that is down or frozen leaves the collector's metrics out (psycopg.Error), not the whole scrape."""
    pool = get_pool(app)
    with pool.connection(timeout=SCRAPE_DB_MS / 1000) as conn, statement_timeout(pool, conn, SCRAPE_DB_MS), \
            conn.transaction():
        conn.execute(f"SET LOCAL statement_timeout = {SCRAPE_DB_MS}")
        yield conn


class ReconcileCollector(Collector):
    """Per source: the last successful reconcile (of its least recent account), the events it recovered, its runs by
    how they ended. All read from PostgreSQL at each scrape."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> "list[GaugeMetricFamily | CounterMetricFamily]":
        settings = Settings.of(self.app)
        last = GaugeMetricFamily("webhook_ledger_reconcile_last_success_timestamp_seconds",
                                 "When the last successful flask reconcile of the source ended, of its account "
                                 "(the platform's own, each connected one) reconciled least recently (0: never)",
                                 labels=["source"])
        max_age = GaugeMetricFamily("webhook_ledger_reconcile_max_age_seconds",
                                    "RECONCILE_MAX_AGE_SECONDS: the longest time without a successful reconcile",
                                    labels=["source"])
        recovered = CounterMetricFamily("webhook_ledger_reconcile_recovered_events",
                                        "Events flask reconcile applied from the provider's list: each one a "
                                        "delivery that was lost", labels=["source"])
        runs = CounterMetricFamily("webhook_ledger_reconcile_runs", "flask reconcile runs by how they ended",
                                   labels=["source", "status"])
        try:
            with _scrape_reads(self.app) as conn:
                rows = conn.execute(RECONCILE_RUNS).fetchall()
                lasts = conn.execute(RECONCILE_LAST_SUCCESS).fetchall()
        except psycopg.Error:
            rows, lasts = None, []  # PostgreSQL unavailable: the delivery metrics still answer
        keyed = {source.event_source for source in settings.sources.values() if source.api_key}
        successes: dict[str, float] = dict.fromkeys(keyed, 0.0)
        totals: dict[str, int] = dict.fromkeys(keyed, 0)
        # Every ended status of a keyed source from 0, so that increase() sees its first run.
        counts = {(source, status): 0 for source in keyed for status in ENDED}
        for source, status, count, applied in rows or []:
            counts[source, status] = count
            totals[source] = totals.get(source, 0) + int(applied or 0)
        for source, finished in lasts:
            successes[source] = float(finished)
        if rows is not None:
            for (source, status), count in sorted(counts.items()):
                runs.add_metric([source, status], count)
            for source, seconds in successes.items():
                last.add_metric([source], seconds)
                max_age.add_metric([source], settings.reconcile_max_age_seconds)
            for source, total in totals.items():
                recovered.add_metric([source], total)
        return [last, max_age, recovered, runs]


class WaitingCollector(Collector):
    """Per source that asks its provider: the notifications waiting for the provider's record, and the oldest's age
    (invariant 7: none waits unseen)."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> "list[GaugeMetricFamily]":
        count = GaugeMetricFamily("webhook_ledger_waiting_notifications",
                                  "Notifications answered accepted whose provider's record is not read yet",
                                  labels=["source"])
        oldest = GaugeMetricFamily("webhook_ledger_waiting_oldest_seconds",
                                   "Age of the oldest notification waiting for its provider's record (0: none)",
                                   labels=["source"])
        try:
            rows = waiting.backlog(get_pool(self.app), SCRAPE_DB_MS)
        except psycopg.Error:
            return []  # PostgreSQL unavailable: the delivery metrics still answer
        asking = {source.event_source: (0, 0.0) for source in Settings.of(self.app).sources.values()
                  if source.api_key}
        asking.update({row.source: (row.waiting, row.oldest_seconds) for row in rows})
        for source, (waiting_now, age) in sorted(asking.items()):
            count.add_metric([source], waiting_now)
            oldest.add_metric([source], age)
        return [count, oldest]


class HoldsCollector(Collector):
    """The application's holds (HOLDS), read from PostgreSQL at each scrape; left out when it does not answer."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> "list[GaugeMetricFamily]":
        active = GaugeMetricFamily("webhook_ledger_holds_active", "The application's holds that count now (held, "
                                   "not expired)")
        active_cents = GaugeMetricFamily("webhook_ledger_holds_active_cents", "What the active holds reserve, in cents")
        expired = GaugeMetricFamily("webhook_ledger_holds_expired_open", "Holds past their expiry that were neither "
                                    "captured nor released: they count for nothing (flask users tidy-holds)")
        try:
            with _scrape_reads(self.app) as conn:
                holds = conn.execute(HOLDS).fetchone()
        except psycopg.Error:
            return []  # PostgreSQL unavailable: the delivery metrics still answer
        for family, value in zip((active, active_cents, expired), holds or (0, 0, 0), strict=True):
            family.add_metric([], value)
        return [active, active_cents, expired]


# `flask audit` runs outside gunicorn too: its open breaks and last complete run, read from PostgreSQL at each scrape.
AUDIT_OPEN_BREAKS = "SELECT source, class, count(*) FROM audit_breaks WHERE status <> 'resolved' GROUP BY 1, 2"
# A priority break (money known in the wrong place) seen again by a second run: alerted on.
AUDIT_PERSISTING = """
    SELECT source, count(*) FROM audit_breaks WHERE status <> 'resolved' AND priority AND runs_seen >= 2 GROUP BY 1
"""
# A complete run read its window whole (whatever it found); an incomplete one did not.
AUDIT_LAST_COMPLETE = """
    SELECT source, extract(epoch FROM max(finished_at)) FROM audit_runs
    WHERE verdict IN ('reconciled', 'reconciled_with_pending', 'breaks') GROUP BY source
"""


class AuditCollector(Collector):
    """Per source: the audit's open breaks by class, its priority breaks that persist, its last complete run."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> "list[GaugeMetricFamily]":
        open_breaks = GaugeMetricFamily("webhook_ledger_audit_open_breaks",
                                        "Breaks flask audit found and no later run resolved, by class",
                                        labels=["source", "class"])
        persisting = GaugeMetricFamily("webhook_ledger_audit_priority_breaks_persisting",
                                       "Open priority breaks (money in the wrong place) found by two runs or more",
                                       labels=["source"])
        last = GaugeMetricFamily("webhook_ledger_audit_last_complete_timestamp_seconds",
                                 "When the last flask audit of the source that read its window whole ended (0: never)",
                                 labels=["source"])
        try:
            with _scrape_reads(self.app) as conn:
                counts = conn.execute(AUDIT_OPEN_BREAKS).fetchall()
                persist = dict(conn.execute(AUDIT_PERSISTING).fetchall())
                lasts = dict(conn.execute(AUDIT_LAST_COMPLETE).fetchall())
        except psycopg.Error:
            return [open_breaks, persisting, last]  # PostgreSQL unavailable: left out, the rest still answers
        keyed = {source.event_source for source in Settings.of(self.app).sources.values() if source.api_key}
        sources = keyed | {source for source, _, _ in counts} | set(lasts)
        found = {(source, klass): count for source, klass, count in counts}
        for source in sorted(sources):
            for klass in BreakClass:  # each reported from 0
                open_breaks.add_metric([source, klass], found.get((source, klass), 0))
            persisting.add_metric([source], persist.get(source, 0))
            last.add_metric([source], float(lasts.get(source) or 0))
        return [open_breaks, persisting, last]


_made = threading.Lock()


def init_app(app: Flask) -> None:
    app.extensions["metrics_registry"] = registry = CollectorRegistry()
    app.extensions["metrics_reconcile"] = collector = ReconcileCollector(app)
    registry.register(collector)
    app.extensions["metrics_waiting"] = waiting_collector = WaitingCollector(app)
    registry.register(waiting_collector)
    app.extensions["metrics_audit"] = audited = AuditCollector(app)
    registry.register(audited)
    app.extensions["metrics_holds"] = holding = HoldsCollector(app)
    registry.register(holding)
    app.add_url_rule("/metrics", "metrics", scrape)
    app.before_request(lambda: None if of(app) else None)  # made by the first request (delivery.py counts each)
    app.after_request(_observe_pool)


def of(app: Flask) -> Metrics:
    """The app's metrics, made on first use: a `flask` command, which serves nothing, makes none."""
    # Under multiprocess mode making them writes this process's files; a command's would be left behind in the
    # service's folder, one set per run.
    if "metrics" not in app.extensions:
        with _made:
            if "metrics" not in app.extensions:
                if path := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                    # A cleaner may have removed it since the worker booted (post_fork made it).
                    os.makedirs(path, mode=0o700, exist_ok=True)
                app.extensions["metrics"] = Metrics(app.extensions["metrics_registry"])
    made: Metrics = app.extensions["metrics"]
    return made


def scrape() -> Response:
    """The Prometheus text exposition of every worker's metrics."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        # Removed under us (a /tmp cleaner): the counts in it are gone, but a
        # scrape still answers, with what the workers write from now on.
        os.makedirs(path, mode=0o700, exist_ok=True)
    metrics = of(current_app)
    metrics.observe_pool(pool_as_it_is(current_app))
    if path:
        add_command_counts(metrics, path)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(current_app.extensions["metrics_reconcile"])
        registry.register(current_app.extensions["metrics_waiting"])
        registry.register(current_app.extensions["metrics_audit"])
        registry.register(current_app.extensions["metrics_holds"])
    else:
        registry = current_app.extensions["metrics_registry"]
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _observe_pool(response: Response) -> Response:
    # After requests, so that each worker's figures are recent even when
    # another worker answers the scrapes; at most every POOL_INTERVAL, since
    # on every request they would be a large share of a duplicate's cost.
    of(current_app).observe_pool(pool_as_it_is(current_app), at_most_every=POOL_INTERVAL)
    return response


# -- what `flask` commands apply: replays, reconcile ---------------------------
# A command runs outside gunicorn: it leaves what it applied in a file of the
# service's PROMETHEUS_MULTIPROC_DIR (its environment names that folder), and
# the next scrape adds it to the counters of the worker that answers it, as
# if that worker had applied it. A file is taken by renaming it, which one
# worker alone can do, then deleted: counted once, and no file is left.
COMMAND_COUNTS = "commands-*.json"
# A file being written, or taken by a worker (its pid after): named outside COMMAND_COUNTS.
WRITING, TAKEN = ".writing-", ".taken-"


class CommandCounts:
    """What one command applied, by counter name and source; written on exit (record)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def observe(self, source: str, result: Result | None) -> None:
        """Count what applying an event came to, as a delivery's is counted."""
        if result is not None:
            for name in counted(result.outcome, result.change, result.balance_after):
                self.counts[name, source] += 1


@contextmanager
def command_counts(warn: Callable[[str], object]) -> Iterator[CommandCounts]:
    """A command's CommandCounts, left for the service's scrapes however the command ends; warn says why not."""
    counts = CommandCounts()
    try:
        yield counts
    finally:
        # Unset: no service's folder is named (a development shell, the tests), and nothing is said.
        if counts.counts and (path := os.environ.get("PROMETHEUS_MULTIPROC_DIR")):
            problem = record(counts, path)
            if problem:
                warn(f"metrics: what this command applied is not counted in /metrics: {problem}")


def record(counts: CommandCounts, path: str) -> str | None:
    """Leave counts in path (the service's PROMETHEUS_MULTIPROC_DIR) for its next scrape; return why not, or None."""
    if not os.path.isdir(path):
        return f"PROMETHEUS_MULTIPROC_DIR {path} is not a folder (is the service running?)"
    rows = [[name, source, count] for (name, source), count in sorted(counts.counts.items())]
    try:
        fd, writing = tempfile.mkstemp(prefix=WRITING, dir=path)
        with os.fdopen(fd, "w") as out:
            # Readable by the service's user when root runs the command; counts are no secret.
            os.fchmod(out.fileno(), 0o644)
            json.dump({"counts": rows}, out)
        unique = os.path.basename(writing)[len(WRITING):]
        os.replace(writing, os.path.join(path, f"commands-{os.getpid()}-{unique}.json"))
    except OSError as exc:
        return f"cannot write in PROMETHEUS_MULTIPROC_DIR {path}: {exc.strerror}"
    return None


def add_command_counts(metrics: Metrics, path: str) -> None:
    """Add the counts commands left in path to this worker's counters, each file once."""
    for left in glob.glob(os.path.join(path, COMMAND_COUNTS)):
        taken = f"{left}{TAKEN}{os.getpid()}"
        try:
            os.rename(left, taken)
        except FileNotFoundError:
            continue  # another worker took it
        try:
            with open(taken) as counts:
                rows = json.load(counts)["counts"]
            for name, source, count in rows:
                if name in metrics.by_name:
                    metrics.by_name[name].labels(source=source).inc(count)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("metrics: the counts a command left in %s cannot be read: %s", left, exc)
        finally:
            os.unlink(taken)
