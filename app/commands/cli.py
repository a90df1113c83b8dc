"""Operator commands: `flask init-db`, `flask events list|show|replay|purge`, `flask ledger
verify|adjust`, `flask redis forget-done` and `flask reconcile`."""

import hashlib
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
import psycopg
from flask import Flask, current_app
from flask.cli import with_appcontext
from psycopg.rows import namedtuple_row
from redis.exceptions import RedisClusterException, RedisError

from ..core.errors import ProviderError, ProviderUnavailableError
from ..core.provider import Provider
from ..core.records import EventList, ListedEvent
from ..core.vocabulary import excerpt
from ..intake.events import DEFAULT_SOURCE, Effect, Policy, StoredBodyError, effect_of, stored_event
from ..locking import lock
from ..locking.redis_client import reason_of
from ..providers import PROVIDERS, of
from ..providers.budget import Budget
from ..receiver import fetch, metrics
from ..settings import parsers
from ..settings.config import Needs, Settings
from ..settings.parsers import ConfigError
from ..settings.sources import api_key_setting
from ..store import ledger, retention, verify
from ..store.db import NamedRow, Pool, apply_schema, get_pool, statement_timeout, transaction, unavailable_in_one_line
from ..store.outcome import Outcome
from ..store.schema import SchemaError, one_line, other_currency, recorded_currency, set_currency, why_not_at_release
from . import reconcile, replay
from .base import CENTS, Commands, api_base, either, needs, os_user, progress, table, unit_name, utc, with_accounts

events = Commands("events", help="Inspect, replay and purge stored webhook events.")
ledger_group = Commands("ledger", help="Check the ledger, correct a balance.")
redis_group = Commands("redis", help="Redis's copies of what PostgreSQL knows.")

# waiting_notifications.state: what `events show` says of each.
WAITING_STATES = {
    "waiting": "accepted: waits for its provider's record, which the drain reads",
    "unknown": "its provider had no record of it: kept without its body; a genuine delivery of it applies",
}


# Stored events and, beside them, the notifications that wait for their provider's record (status 'waiting', or
# 'unknown': the provider had none): each table newest first by its primary key, then merged.
LIST_EVENTS = """
    SELECT * FROM (
        (SELECT source, event_id, event_type, status, attempts, mismatches, created_at,
                coalesce('dismissed by ' || dismissed_by || ': ' || dismissed_reason, last_error) AS last_error
         FROM webhook_events
         WHERE (%(sources)s::text[] IS NULL OR source = ANY(%(sources)s))
           AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s))
           AND (%(types)s::text[] IS NULL OR event_type = ANY(%(types)s))
           AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
         ORDER BY id DESC  -- newest first: ids grow with arrival (the primary key, not an index of created_at)
         LIMIT %(limit)s)
        UNION ALL
        (SELECT source, event_id, event_type, state, attempts, 0, received_at, last_error
         FROM waiting_notifications
         WHERE (%(sources)s::text[] IS NULL OR source = ANY(%(sources)s))
           AND (%(statuses)s::text[] IS NULL OR state = ANY(%(statuses)s))
           AND (%(types)s::text[] IS NULL OR event_type = ANY(%(types)s))
           AND (%(since)s::timestamptz IS NULL OR received_at >= %(since)s)
         ORDER BY id DESC
         LIMIT %(limit)s)
    ) listed ORDER BY created_at DESC LIMIT %(limit)s
"""
SHOW_WAITING = """
    SELECT source, event_id, event_type, state, attempts, last_error, payload_sha256 AS body_sha256, received_at,
           not_before, body
    FROM waiting_notifications WHERE source = %s AND event_id = %s
"""
SHOW_EVENT = """
    SELECT e.source, e.event_id, e.event_type, e.status, e.attempts, e.last_error, e.mismatches,
           e.last_mismatch_at, e.payload_sha256 AS body_sha256, e.created_at, e.updated_at, e.completed_at, e.body,
           e.origin, e.ledger_currency, e.test_events_accepted, e.fetched, e.effect_sha256,
           j.kind, j.payment_id, j.movement_id, j.user_id, j.amount_cents, j.created_at AS changed_at
    FROM webhook_events e LEFT JOIN ledger_journal j USING (source, event_id)
    WHERE e.source = %s AND e.event_id = %s
"""
SOURCES_OF_EVENT = "SELECT source FROM webhook_events WHERE event_id = %s ORDER BY source"
SHOW_MOVEMENT = "SELECT state FROM movements WHERE source = %s AND kind = %s AND movement_id = %s"
SHOW_ACCOUNT = "SELECT * FROM payment_accounts WHERE source = %s AND payment_id = %s"
FAILED_EVENTS = """
    SELECT source, event_id FROM webhook_events
    WHERE status = 'failed' AND (%(source)s::text IS NULL OR source = %(source)s)
    ORDER BY created_at, id
"""

# webhook_events.origin, as `events show` tells it.
ORIGINS = {ledger.Origin.DELIVERY: "delivery (a webhook received)",
           ledger.Origin.RECONCILE: "reconcile (the provider's event list: its delivery was lost)"}
SOURCE = click.option("--source", default=DEFAULT_SOURCE, show_default=True,
                      help="The event's source (a name from WEBHOOK_SOURCES).")


def init_app(app: Flask) -> None:
    app.cli.add_command(init_db_command)
    app.cli.add_command(events)
    app.cli.add_command(ledger_group)
    app.cli.add_command(redis_group)
    app.cli.add_command(reconcile_command)


@click.command("init-db")
@with_appcontext
@needs(Needs.SERVICE)  # it recomputes stored effects under the service's policy
def init_db_command() -> None:
    """Create or upgrade the tables (migrations, in order), then the stored events' effects (idempotent)."""
    settings = Settings.of(current_app)
    path, policy = settings.schema_path, settings.policy
    pool = get_pool(current_app)
    with unavailable_in_one_line(), _refused_in_one_line():
        with pool.connection() as conn:
            try:
                applied = apply_schema(conn, path, policy.currency)
            except SchemaError as exc:
                raise click.ClickException(str(exc)) from None
        if applied.created:
            click.echo(f"created the schema from {path}")
        for name in applied.ran:
            click.echo(f"applied migration {name}")
        if not applied.created and not applied.ran:
            click.echo("schema up to date: no migration to apply")
        recomputed = ledger.recompute_effects(pool, policy)
        if recomputed:
            click.echo(f"recomputed the effects of {recomputed} stored events")


@contextmanager
def _refused_in_one_line() -> Iterator[None]:
    """init-db: an error PostgreSQL answers (not an unreachable server's: unavailable_in_one_line's) ends it with
    one line, never a traceback: what a migration refused is said by SchemaError, naming the file."""
    try:
        yield
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        raise click.ClickException(f"init-db stopped: {one_line(exc)}") from None


@events.command("list", needs=Needs.DATABASE)
@click.option("--source", "sources", multiple=True, help="Source name; repeatable.")
# The values, not the members: click (8.2+) matches an Enum's members by their names (FAILED).
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([status.value for status in ledger.Status] + list(WAITING_STATES)), help="Repeatable.")
@click.option("--type", "types", multiple=True, help="Event type; repeatable.")
@click.option("--since", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
              help="Received at or after this UTC date or time.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10000))
def list_events(sources: tuple[str, ...], statuses: tuple[str, ...], types: tuple[str, ...], since: datetime | None,
                limit: int) -> None:
    """List stored events, newest first."""
    params = {"sources": list(sources) or None, "statuses": list(statuses) or None, "types": list(types) or None,
              "limit": limit, "since": since.replace(tzinfo=UTC) if since else None}
    with transaction(get_pool(current_app)) as conn:
        rows: list[NamedRow] = conn.cursor(row_factory=namedtuple_row).execute(LIST_EVENTS, params).fetchall()
    if not rows:
        click.echo("no events")
        return
    header = ("SOURCE", "EVENT ID", "TYPE", "STATUS", "ATTEMPTS", "MISMATCHES", "RECEIVED (UTC)", "LAST ERROR")
    table(header, [(r.source, r.event_id, r.event_type, r.status, r.attempts, r.mismatches, utc(r.created_at),
                     _one_line(r.last_error or "")) for r in rows])


def _one_line(text: str) -> str:
    """text whole, on one line: the last column of a table, left unpadded, is as long as it is."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


@events.command("show", needs=Needs.DATABASE)
@click.argument("event_id")
@SOURCE
def show_event(event_id: str, source: str) -> None:
    """Show one stored event: the bytes received, status, attempts, last error, times."""
    effect, movement, account, elsewhere, waits = None, None, None, [], None
    with transaction(get_pool(current_app)) as conn:
        cursor = conn.cursor(row_factory=namedtuple_row)
        row: NamedRow | None = cursor.execute(SHOW_EVENT, [source, event_id]).fetchone()
        if row is None:
            waits = cursor.execute(SHOW_WAITING, [source, event_id]).fetchone()
            elsewhere = [name for (name,) in conn.execute(SOURCES_OF_EVENT, [event_id]).fetchall()]
        else:
            effect = _stored_effect(row, _decided_under(row, Settings.of(current_app).policy))
        if effect is not None and effect.payment_id is not None:
            if effect.movement_id is not None:
                movement = cursor.execute(SHOW_MOVEMENT, [source, effect.kind, effect.movement_id]).fetchone()
            account = cursor.execute(SHOW_ACCOUNT, [source, effect.payment_id]).fetchone()
    if row is None and waits is not None:
        _show_waiting(waits)
        return
    if row is None:
        hint = f"; it is stored under {', '.join(f'--source {name}' for name in elsewhere)}" if elsewhere else ""
        raise click.ClickException(f"no stored event {event_id!r} of source {source!r}{hint}")
    kept = "match" if hashlib.sha256(row.body).digest() == row.body_sha256 else "DO NOT MATCH their SHA-256"
    change = (f"{row.kind} of payment {row.payment_id}: {row.amount_cents:+} cents to {row.user_id} "
              f"at {utc(row.changed_at)}" if row.kind else "-")
    fields = [
        ("source", row.source), ("event id", row.event_id), ("type", row.event_type), ("status", row.status),
        ("attempts", row.attempts), ("last error", row.last_error or "-"),
        ("mismatches", f"{row.mismatches} (last {utc(row.last_mismatch_at)})"),
        ("body sha256", row.body_sha256.hex()), ("stored bytes", kept),
        ("origin", ORIGINS.get(row.origin, row.origin)),
        ("received", utc(row.created_at)), ("updated", utc(row.updated_at)), ("completed", utc(row.completed_at)),
        ("movement", _movement_line(effect, movement)),
        ("balance change", change),
        ("account", _account_line(account)),
    ]
    for name, value in fields:
        click.echo(f"{name + ':':<16}{value}")
    if row.body is not None:
        # The bytes as received, not re-serialised: the event of record.
        received = "as received" if row.origin == ledger.Origin.DELIVERY else "the Event object as listed"
        click.echo(f"body ({len(row.body)} bytes, {received}):")
        click.echo(bytes(row.body).decode("utf-8", errors="backslashreplace"))
    if row.fetched is not None:
        # What its money was read from: the provider's own record (app/providers/).
        click.echo(f"fetched ({len(row.fetched)} bytes, as the provider's API returned them; the money is read "
                   f"from these):")
        click.echo(bytes(row.fetched).decode("utf-8", errors="backslashreplace"))


def _show_waiting(row: NamedRow) -> None:
    """A notification that waits for its provider's record (or was not found there), and why."""
    fields = [("source", row.source), ("event id", row.event_id), ("type", row.event_type),
              ("status", f"{row.state} ({WAITING_STATES[row.state]})"), ("attempts", row.attempts),
              ("why", row.last_error or "-"), ("body sha256", row.body_sha256.hex()),
              ("received", utc(row.received_at)),
              ("next try", utc(row.not_before) if row.state == "waiting" else "-")]
    for name, value in fields:
        click.echo(f"{name + ':':<16}{value}")
    if row.body is not None:
        click.echo(f"body ({len(row.body)} bytes, as received):")
        click.echo(bytes(row.body).decode("utf-8", errors="backslashreplace"))


def _replay(pool: Pool, source: str, event_id: str, policy: Policy) -> ledger.Result | None:
    """ledger.replay, asking the provider again for an event it had no record of (a fetching source)."""
    try:
        return ledger.replay(pool, source, event_id, policy, fetch.refetch(current_app, source, policy))
    except ProviderUnavailableError as exc:  # ProviderRefusedError too
        return ledger.Result(Outcome.FAILED, f"not replayed: {exc}")


def _decided_under(row: NamedRow, policy: Policy) -> Policy:
    """The policy an event was decided under (recorded with it), else policy: this shell's may not be the service's."""
    if row.ledger_currency is None or row.test_events_accepted is None:
        return policy
    return Policy(row.ledger_currency, row.test_events_accepted)


def _stored_effect(row: NamedRow, policy: Policy) -> Effect | None:
    """What the stored bytes of a row of SHOW_EVENT say it moves, read by the live path's code; None if unreadable."""
    if ledger.unvouched(row.fetched, row.effect_sha256):
        # Its body is a notification nobody vouches for: what it says is not what it moves.
        return Effect(None, problem="unknown: its provider had no record of it when it was asked")
    try:
        return effect_of(stored_event(row.source, row.event_id, row.event_type, row.body, row.body_sha256,
                                      row.fetched), policy)
    except StoredBodyError:
        return None


def _movement_line(effect: Effect | None, movement: NamedRow | None) -> str:
    """What the event's bytes say it moves, and, for a refund or a dispute, the state recorded for it now."""
    if effect is None:
        return "- (its stored bytes cannot be read)"
    if effect.problem:
        return f"none: {effect.problem}"
    if effect.kind is None:
        return "none (this event moves no money)"
    said = f"{effect.kind} of payment {effect.payment_id}, {effect.amount_cents} cents"
    if effect.movement_id is None:
        return said
    recorded = movement.state if movement else "not recorded"
    return f"{effect.kind} {effect.movement_id} {effect.state}: {said} (recorded now: {recorded})"


def _account_line(account: NamedRow | None) -> str:
    """A payment's account (money.sql's payment_accounts), in one line."""
    if account is None:
        return "-"
    return (f"{account.payment_id}: credited {account.credited_cents}, highest refunded total "
            f"{account.refunded_total_cents}, refunds {account.refunds_applied_cents} applied and "
            f"{account.refunds_reversed_cents} reversed, disputes {account.disputes_withdrawn_cents} withdrawn and "
            f"{account.disputes_reinstated_cents} reinstated; {account.debited_cents} debited "
            f"(due {account.debit_due_cents}) from {account.user_id}")


def _warn(message: str) -> None:
    click.echo(message, err=True)


def _counted(counts: metrics.CommandCounts, source: str, result: ledger.Result | None) -> ledger.Result | None:
    """result, counted for /metrics (metrics.command_counts)."""
    counts.observe(source, result)
    return result


def _replayed(source: str, event_id: str, result: ledger.Result | None) -> tuple[bool, str]:
    """Return (ok, the line that tells what replaying event_id did)."""
    if source != DEFAULT_SOURCE:
        event_id = f"{source}/{event_id}"
    if result is None:
        return False, f"{event_id}: no such stored event"
    if result.outcome == Outcome.PROCESSED:
        return True, f"{event_id}: processed; now completed"
    if result.outcome == Outcome.DUPLICATE:
        why = result.problem or "its payment was credited before, by another event"
        return True, f"{event_id}: {why}; nothing changed"
    if result.outcome == Outcome.IGNORED:
        return False, f"{event_id}: still ignored: {result.problem}"
    return False, f"{event_id}: still failed: {result.problem or result.outcome}"


def _in_the_ledgers_currency() -> None:
    """Stop a command that applies events under LEDGER_CURRENCY when the ledger records another (one line)."""
    configured = Settings.of(current_app).policy.currency
    with unavailable_in_one_line(), get_pool(current_app).connection() as conn:
        recorded = recorded_currency(conn)
    if recorded is not None and recorded != configured:
        raise ConfigError(other_currency(configured, recorded))


@events.command("replay", needs=Needs.SERVICE)
@click.argument("event_id", required=False)
@click.option("--all-failed", is_flag=True, help="Replay every failed event, oldest first.")
@click.option("--source", help=f"The event's source [default: {DEFAULT_SOURCE}]; with --all-failed, "
                                "only this source's events [default: every source's].")
def replay_events(event_id: str | None, all_failed: bool, source: str | None) -> None:
    """Re-run stored failed events, from their stored bytes, through the ledger transaction (exactly once).

    Each is decided under the settings it was decided under, but for the one that refused it (docs/operations.md).
    """
    if bool(event_id) == all_failed:
        raise click.UsageError("give either EVENT_ID or --all-failed")
    _in_the_ledgers_currency()
    pool = get_pool(current_app)
    if all_failed:
        with transaction(pool) as conn:
            keys = conn.execute(FAILED_EVENTS, {"source": source}).fetchall()
    else:
        keys = [(source or DEFAULT_SOURCE, event_id)]
    settings = Settings.of(current_app)
    configured = {served.event_source for served in settings.sources.values()}
    results: list[tuple[bool, str]] = []
    skipped: dict[tuple[str, str], list[str]] = {}
    with metrics.command_counts(_warn) as counts, progress("events replayed", len(keys)) as advance:
        for of, named in keys:
            policy = replay.policy_for(pool, of, named, settings.policy, configured)
            if isinstance(policy, replay.Skip):
                skipped.setdefault((of, policy.reason), []).append(named)
            else:
                results.append(_replayed(of, named, _counted(counts, of, _replay(pool, of, named, policy))))
            advance(1)
    for _, message in results:
        click.echo(message)
    for (of, reason), ids in skipped.items():
        click.echo(f"skipped {_count(len(ids), 'event')} of source {of!r}, left as stored: {reason}: {_some(ids)}")
    failures = sum(not ok for ok, _ in results)
    if all_failed:
        completed = len(results) - failures
        not_replayed = sum(len(ids) for ids in skipped.values())
        click.echo(f"replayed {len(results)} failed events: {completed} completed, {failures} still failed"
                   + (f"; skipped {not_replayed}" if not_replayed else ""))
    if failures or skipped:
        raise click.exceptions.Exit(1)


# How many event ids a line names before "and N more".
NAMED_IDS = 10


def _some(ids: list[str]) -> str:
    more = f" and {len(ids) - NAMED_IDS} more" if len(ids) > NAMED_IDS else ""
    return ", ".join(ids[:NAMED_IDS]) + more


DISMISS = """
    UPDATE webhook_events SET status = 'dismissed', dismissed_reason = %(reason)s, dismissed_by = %(by)s,
                              dismissed_at = now(), updated_at = now()
    WHERE source = %(source)s AND event_id = %(event_id)s AND status = 'failed'
    RETURNING dismissed_at
"""
STATUS = "SELECT status FROM webhook_events WHERE source = %s AND event_id = %s"


@events.command("dismiss", needs=Needs.DATABASE)
@click.argument("event_id")
@SOURCE
@click.option("--reason", required=True, help="Why it is closed (required): kept with it, shown by `events list`.")
@click.option("--by", "actor", help="Who dismisses it, recorded with it [default: the OS user].")
def dismiss_event(event_id: str, source: str, reason: str, actor: str | None) -> None:
    """Close a failed event that will never apply, with its reason: kept, listed, never replayed by --all-failed."""
    actor = os_user() if actor is None else actor
    if not reason.strip() or len(reason) > 500:
        raise click.BadParameter("the reason must be 1 to 500 characters, not only spaces", param_hint="--reason")
    if not 1 <= len(actor) <= 128:
        raise click.BadParameter("who dismisses it is named in 1 to 128 characters", param_hint="--by")
    params = {"source": source, "event_id": event_id, "reason": reason, "by": actor}
    with transaction(get_pool(current_app)) as conn:
        dismissed = conn.execute(DISMISS, params).fetchone()
        status = conn.execute(STATUS, [source, event_id]).fetchone()
    if status is None:
        raise click.ClickException(f"no stored event {event_id!r} of source {source!r}")
    if dismissed is None:
        raise click.ClickException(f"event {event_id!r} of source {source!r} is {status[0]}: only a failed event "
                                   "is dismissed")
    click.echo(f"dismissed event {event_id!r} of source {source!r} at {utc(dismissed[0])} by {actor}: {reason}")


@events.command("purge", needs=Needs.DATABASE)
@click.option("--older-than", "days", default=retention.DEFAULT_DAYS, show_default=True,
              type=click.IntRange(min=0), help="Delete events received more than DAYS days ago.")
@click.option("--include-failed", is_flag=True, help="Delete old failed events too (needs --force).")
@click.option("--force", is_flag=True, help=f"Allow a window under {retention.DEFAULT_DAYS} days, or --include-failed.")
@click.option("--batch-size", default=retention.BATCH_SIZE, show_default=True, type=click.IntRange(1, 100000))
@click.option("--source", help="Only this source's events [default: every source's].")
def purge_events(days: int, include_failed: bool, force: bool, batch_size: int, source: str | None) -> None:
    """Delete old completed events in short batches; the ledger's journal and payments are kept."""
    if days < retention.DEFAULT_DAYS and not force:
        raise click.UsageError(f"--older-than {days} is under {retention.DEFAULT_DAYS} days, the minimum that "
                               "outlasts providers' resend windows; add --force to purge anyway")
    if include_failed and not force:
        raise click.UsageError("--include-failed deletes events that never took effect; add --force")
    with progress("events purged") as advance:
        deleted, cutoff = retention.purge(get_pool(current_app), days, include_failed, batch_size, source,
                                          advance.total, advance)
    kinds = "completed and failed" if include_failed else "completed"
    click.echo(f"purged {deleted} {kinds} events received before {utc(cutoff)}; the ledger's journal kept")


@ledger_group.command("verify", needs=Needs.DATABASE)
def verify_ledger() -> None:
    """Check the ledger's invariants; exit 1 and name the offending rows if one fails."""
    pool = get_pool(current_app)
    # The checks are this release's: a database at another would fail them for what init-db changes, not for money.
    with pool.connection() as conn:
        reason = why_not_at_release(conn, Settings.of(current_app).schema_path)
    if reason is not None:
        raise click.ClickException(f"the ledger cannot be checked: {reason}")
    # check() runs its own read-only snapshot, with no statement timeout: no client deadline either.
    with pool.connection() as conn, statement_timeout(pool, conn, 0), progress("stored events checked") as advance:
        report = verify.check(conn, Settings.of(current_app).policy, advance, advance.total)
    for line in report.problems + report.below_zero + report.settings_changed + report.waiting:
        click.echo(line)
    users, events_, payments, journal = report.counts
    counts = f"{users} users, {events_} stored events, {payments} payments, {journal} journal rows"
    if report.problems:
        click.echo(f"ledger INCONSISTENT: {len(report.problems)} problems ({counts})")
        raise click.exceptions.Exit(1)
    below = f"; {len(report.below_zero)} balances below zero" if report.below_zero else ""
    policy = Settings.of(current_app).policy
    changed = (f"; {len(report.settings_changed)} events decided under other settings than this command's "
               f"(LEDGER_CURRENCY={policy.currency}, STRIPE_ACCEPT_TEST_EVENTS={str(policy.accept_test_events).lower()}"
               "), each judged by its own") if report.settings_changed else ""
    click.echo(f"ledger consistent: {counts}{below}{changed}")


@ledger_group.command("set-currency", needs=Needs.DATABASE)
@click.argument("currency")
def set_ledger_currency(currency: str) -> None:
    """Make CURRENCY (ISO 4217) the ledger's: only while no payment and no journal row exists (docs/operations.md)."""
    try:
        currency = parsers.currency("CURRENCY", currency)
    except ConfigError as exc:
        raise click.BadParameter(exc.message) from None
    with unavailable_in_one_line(), get_pool(current_app).connection() as conn:
        try:
            was = set_currency(conn, currency)
        except SchemaError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"the ledger's currency is {currency} (it was {was}): start the service with LEDGER_CURRENCY={currency}")


class SignedAmountCommand(click.Command):
    """A command whose negative amount may follow a `--`, as POSIX tools take one: `USER -- -20 --reason R`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # click ends option parsing at `--`, so the `--reason` after it would be one more argument; here the `--`
        # only quotes the amount after it, which ignore_unknown_options reads as the argument without it anyway.
        if "--" in args:
            at = args.index("--")
            if at + 1 < len(args) and re.fullmatch(r"[-+]?[0-9]+", args[at + 1]):
                args = args[:at] + args[at + 1:]
        return super().parse_args(ctx, args)


# ignore_unknown_options: a negative CENTS ("-500") is the argument, not an unknown option.
@ledger_group.command("adjust", needs=Needs.DATABASE, cls=SignedAmountCommand,
                      context_settings={"ignore_unknown_options": True})
@click.argument("user_id", type=click.UUID)
@click.argument("cents", type=CENTS)
@click.option("--reason", required=True, help="Why the balance is corrected (required): journaled with it.")
@click.option("--by", "actor", help="Who makes the correction, journaled with it [default: the OS user].")
@click.option("--payment", "payment_id", help="The payment whose credit this corrects (one credited twice): "
                                              "`ledger verify` counts it with that payment's credits.")
@click.option("--source", default=DEFAULT_SOURCE, show_default=True, help="The payment's source (with --payment).")
def adjust_balance(user_id: uuid.UUID, cents: int, reason: str, actor: str | None, payment_id: str | None,
                   source: str) -> None:
    """Add CENTS (signed: -500 takes 500 cents away) to USER_ID's balance, journaled as an adjustment."""
    actor = os_user() if actor is None else actor
    payment = None if payment_id is None else (source, payment_id)
    pool = get_pool(current_app)
    try:
        adjusted = ledger.adjust(pool, user_id, cents, reason, actor, payment)
    except ledger.AdjustmentError as exc:
        raise click.ClickException(str(exc)) from None
    with pool.connection() as conn:
        unit = unit_name(conn)
    named = payment_id if source == DEFAULT_SOURCE else f"{source}/{payment_id}"
    corrects = "" if payment_id is None else f", correcting payment {named}"
    click.echo(f"adjusted the balance of user {user_id} by {cents:+} {unit} to {adjusted.balance_after} {unit} "
               f"(journal row {adjusted.journal_id}, by {actor}{corrects})")


@redis_group.command("forget-done", needs=Needs.REDIS)
def forget_done() -> None:
    """Delete every done marker (all primaries of a cluster). Run after PostgreSQL lost commits (failover, restore)."""
    try:
        deleted = lock.forget_done(current_app.extensions["redis"])
    except (RedisError, RedisClusterException) as exc:
        raise click.ClickException(f"redis failed ({reason_of(exc)}); some markers may be left: run it again") from None
    click.echo(f"forgot {deleted} done markers: re-deliveries of those events now reach PostgreSQL")


class When(click.ParamType):
    """ISO 8601; a time without an offset is UTC."""

    name = "WHEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            self.fail(f"{value!r} is not ISO 8601 (2026-11-28 or 2026-11-28T06:00:00, UTC)", param, ctx)
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# A run that yielded to another: sysexits.h's EX_TEMPFAIL, "try again later"
# (the systemd unit counts it a success).
YIELDED_EXIT = 75


@click.command("reconcile")
@click.argument("source_name", metavar="SOURCE")
@click.option("--account", metavar="ACCT", help="A connected account's id "
              f"({', '.join(f'{provider.account_prefix}...' for provider in with_accounts())}): reconcile its events, "
              "not the platform's own.")
@click.option("--all-accounts", is_flag=True, help="Reconcile, in turn, each connected account the platform lists.")
@click.option("--since", type=When(), help="Events created at or after WHEN [default: the watermark minus "
                                           f"{int(reconcile.OVERLAP.total_seconds() // 60)} min].")
@click.option("--until", type=When(), help="Events created before WHEN [default: now].")
@click.option("--dry-run", is_flag=True, help="List the window and say what would be applied; write nothing.")
@with_appcontext
@needs(Needs.SERVICE)
def reconcile_command(source_name: str, account: str | None, all_accounts: bool, since: datetime | None,
                      until: datetime | None, dry_run: bool) -> None:
    """Recover the events of SOURCE whose deliveries were lost, from the provider's event list."""
    settings = Settings.of(current_app)
    source = settings.sources.get(source_name)
    if source is None:
        raise click.UsageError(f"no source named {source_name!r} (WEBHOOK_SOURCES; `default` is WEBHOOK_SECRET's)")
    provider = of(source.scheme)
    make_list = provider.event_list
    if make_list is None:
        listed = either([scheme for scheme, each in PROVIDERS.items() if each.event_list is not None])
        raise click.UsageError(f"source {source_name!r} has the scheme {source.scheme}: only a {listed} source's "
                               "events can be listed")
    if account is not None and all_accounts:
        raise click.ClickException("--account and --all-accounts: give one or the other")
    list_accounts = provider.accounts
    if (account is not None and provider.is_account is None) or (all_accounts and list_accounts is None):
        raise click.ClickException(f"--account and --all-accounts: {provider.name} has no connected accounts")
    if account is not None and not provider.has_account(account):
        raise click.ClickException(f"--account '{excerpt(account, 64)}' is not a {provider.name} account id "
                                   f"({provider.account_words})")
    key_setting, api_key = api_key_setting(source.name), source.api_key
    if api_key is None:
        raise ConfigError(f"{key_setting} is not set: reconcile needs {provider.events_key}")
    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be before --until")
    _in_the_ledgers_currency()

    # The account's budget, shared with every host's fetches through Redis (app/providers/budget.py).
    budget = Budget(current_app.extensions.get("redis"), source.scheme, api_key, source.api_rate, source.api_rate_total)

    def run(whose: str | None, counts: metrics.CommandCounts, advance: Callable[[int], None]) -> reconcile.Summary:
        listing = make_list(api_key, api_base(source), key_setting, whose, budget)
        return reconcile.reconcile(get_pool(current_app), source.event_source, Counted(listing, advance),
                                   settings.policy, since, until, dry_run,
                                   on_result=lambda result: counts.observe(source.event_source, result),
                                   max_body_bytes=settings.max_body_bytes, scheme=source.scheme)

    if all_accounts:
        assert list_accounts is not None  # refused above
        try:
            accounts = list_accounts(api_key, api_base(source), key_setting, budget)
        except ProviderError as exc:
            raise click.ClickException(str(exc)) from None
        raise click.exceptions.Exit(_reconcile_accounts(provider, accounts, run))
    with unavailable_in_one_line(), metrics.command_counts(_warn) as counts, progress("events listed") as advance:
        try:
            summary = run(account, counts, advance)
        except ProviderError as exc:
            raise click.ClickException(str(exc)) from None
    for line in summary_lines(summary):
        click.echo(line)
    if summary.status == reconcile.RunStatus.YIELDED:
        raise click.exceptions.Exit(YIELDED_EXIT)
    if summary.status != reconcile.RunStatus.COMPLETED:
        raise click.exceptions.Exit(1)


def _reconcile_accounts(provider: Provider, accounts: list[str], run: Callable[..., reconcile.Summary]) -> int:
    """Reconcile each account in turn, one line each (and its refusals); return the exit status: 1 if any did not
    complete, else YIELDED_EXIT if one yielded to another run, else 0."""
    ended: list[reconcile.RunStatus] = []
    with unavailable_in_one_line(), metrics.command_counts(_warn) as counts, progress("events listed") as advance:
        for account in accounts:
            if not provider.has_account(account):
                click.echo(f"{excerpt(account, 64)}: failed: {provider.name} listed it as an account, but it is no "
                           f"account id ({provider.account_words}): not reconciled")
                ended.append(reconcile.RunStatus.FAILED)
                continue
            try:
                summary = run(account, counts, advance)
            except ProviderError as exc:
                click.echo(f"{account}: failed: {exc}")
                ended.append(reconcile.RunStatus.FAILED)
                continue
            click.echo(account_line(summary))
            for refused in summary.tally.refused:
                click.echo(f"  refused {refused.event_id} ({refused.event_type}): {refused.reason}")
            if summary.tally.refused_unnamed:
                click.echo(f"  and {summary.tally.refused_unnamed} more refused, not named here")
            ended.append(summary.status)
    tally = ", ".join(f"{ended.count(status)} {status}" for status in reconcile.RunStatus if status in ended)
    click.echo(f"{_count(len(accounts), 'connected account')}{': ' if tally else ''}{tally}")
    if any(status not in (reconcile.RunStatus.COMPLETED, reconcile.RunStatus.YIELDED) for status in ended):
        return 1
    return YIELDED_EXIT if reconcile.RunStatus.YIELDED in ended else 0


class Counted:
    """A provider's event list that tells advance of each page it lists (the run's progress)."""

    def __init__(self, listing: EventList, advance: Callable[[int], None]) -> None:
        self.name, self.horizon_days, self.account = listing.name, listing.horizon_days, listing.account
        self._listing, self._advance = listing, advance

    def pages(self, since: int, until: int) -> Iterator[list[ListedEvent]]:
        for page in self._listing.pages(since, until):
            self._advance(len(page))
            yield page


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def account_line(summary: reconcile.Summary) -> str:
    """A connected account's run in one line, as `flask reconcile --all-accounts` prints it."""
    head = f"{summary.account}: {'dry run' if summary.dry_run else f'run {summary.run_id}'} {summary.status}"
    if summary.status == reconcile.RunStatus.YIELDED:
        return f"{head}: {summary.message}"
    tally = summary.tally
    counts = (f"{tally.applied} not stored, {tally.retried} stored failed, {tally.duplicates} already applied"
              if summary.dry_run else
              f"{tally.applied} applied, {tally.duplicates} duplicates, {tally.refused_count} refused")
    if summary.unprovable:
        end = f"; NOT PROVABLE: {summary.message}"
    else:
        end = f"; watermark {utc(summary.watermark)}" if summary.watermark else ""
    return f"{head}: {_count(tally.pages, 'page')}, {tally.listed} listed: {counts}{end}"


def summary_lines(summary: reconcile.Summary) -> list[str]:
    """A run's summary, as `flask reconcile` prints it."""
    run = "dry run, nothing written" if summary.dry_run else f"run {summary.run_id}"
    start = (f" (the watermark {utc(summary.from_watermark)} minus {reconcile.OVERLAP})"
             if summary.from_watermark else "")
    whose = f" (connected account {summary.account})" if summary.account else ""
    lines = [f"reconcile {summary.source}{whose} from {summary.provider}'s event list, {run}: "
             f"events created {utc(summary.since)} to {utc(summary.until)}{start}"]
    if summary.status == reconcile.RunStatus.YIELDED:
        return [*lines, summary.message]
    tally = summary.tally
    pages = _count(tally.pages, "page")
    if summary.dry_run:
        lines.append(f"  {pages}, {tally.listed} listed: {tally.applied} not stored (would be applied), "
                     f"{tally.retried} stored failed (would be tried again), {tally.duplicates} already applied")
    else:
        lines.append(f"  {pages}, {tally.listed} listed: {tally.applied} applied (recovered: their "
                     f"deliveries were lost), {tally.duplicates} duplicates, {tally.refused_count} refused")
    for refused in tally.refused:
        lines.append(f"  refused {refused.event_id} ({refused.event_type}): {refused.reason}")
    if tally.refused_unnamed:
        lines.append(f"  and {tally.refused_unnamed} more refused, not named here")
    if tally.refused:
        lines.append("  each refused event is recorded failed unless its line says otherwise (`flask events list "
                     "--status failed`); `flask events replay` applies it once what it needs is in (a payment "
                     "outside the window)")
    if summary.unprovable:
        lines.append(f"  NOT PROVABLE: {summary.message}")
    if summary.status == reconcile.RunStatus.COMPLETED:
        moved = f"; watermark {utc(summary.watermark)}" if summary.watermark else ""
        lines.append(f"  {'would complete' if summary.dry_run else 'completed'}{moved}")
    else:
        lines.append(f"  {summary.status}: not reported as done")
    return lines
