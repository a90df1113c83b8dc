"""Operator commands: `flask events list|show|replay|purge`, `flask ledger verify` and `flask redis forget-done`."""

import json
from datetime import UTC

import click
from flask import current_app
from flask.cli import AppGroup
from redis.exceptions import RedisClusterException, RedisError

from . import ledger, lock, retention, verify
from .db import get_pool, transaction
from .delivery import Outcome
from .redis_client import reason_of

events = AppGroup("events", help="Inspect, replay and purge stored webhook events.")
ledger_group = AppGroup("ledger", help="Check the ledger.")
redis_group = AppGroup("redis", help="Redis's copies of what PostgreSQL knows.")

STATUSES = ("processing", "completed", "failed")
LIST_EVENTS = """
    SELECT event_id, event_type, status, attempts, mismatches, created_at, last_error
    FROM webhook_events
    WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s))
      AND (%(types)s::text[] IS NULL OR event_type = ANY(%(types)s))
      AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
"""
SHOW_EVENT = """
    SELECT e.event_id, e.event_type, e.status, e.attempts, e.last_error, e.mismatches, e.last_mismatch_at,
           e.payload_sha256, e.created_at, e.updated_at, e.completed_at, e.payload::text,
           c.user_id, c.amount_cents, c.created_at
    FROM webhook_events e LEFT JOIN ledger_credits c USING (event_id)
    WHERE e.event_id = %s
"""
FAILED_EVENTS = "SELECT event_id FROM webhook_events WHERE status = 'failed' ORDER BY created_at, id"


def init_app(app):
    app.cli.add_command(events)
    app.cli.add_command(ledger_group)
    app.cli.add_command(redis_group)


def _utc(moment):
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(header, rows):
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip())


@events.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES), help="Repeatable.")
@click.option("--type", "types", multiple=True, help="Event type; repeatable.")
@click.option("--since", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
              help="Received at or after this UTC date or time.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10000))
def list_events(statuses, types, since, limit):
    """List stored events, newest first."""
    params = {"statuses": list(statuses) or None, "types": list(types) or None, "limit": limit,
              "since": since.replace(tzinfo=UTC) if since else None}
    with transaction(get_pool(current_app)) as conn:
        rows = conn.execute(LIST_EVENTS, params).fetchall()
    if not rows:
        click.echo("no events")
        return
    header = ("EVENT ID", "TYPE", "STATUS", "ATTEMPTS", "MISMATCHES", "RECEIVED (UTC)", "LAST ERROR")
    _table(header, [(eid, etype, status, attempts, mismatches, _utc(created), (error or "")[:60])
                    for eid, etype, status, attempts, mismatches, created, error in rows])


@events.command("show")
@click.argument("event_id")
def show_event(event_id):
    """Show one stored event: payload, status, attempts, last error, times."""
    with transaction(get_pool(current_app)) as conn:
        row = conn.execute(SHOW_EVENT, [event_id]).fetchone()
    if row is None:
        raise click.ClickException(f"no stored event {event_id!r}")
    (eid, etype, status, attempts, error, mismatches, mismatch_at, sha256, created, updated, completed,
     payload, credit_user, credit_cents, credited_at) = row
    fields = [
        ("event id", eid), ("type", etype), ("status", status), ("attempts", attempts),
        ("last error", error or "-"), ("mismatches", f"{mismatches} (last {_utc(mismatch_at)})"),
        ("payload sha256", sha256.hex()),
        ("received", _utc(created)), ("updated", _utc(updated)), ("completed", _utc(completed)),
        ("credit", f"{credit_cents} cents to {credit_user} at {_utc(credited_at)}" if credit_user else "-"),
    ]
    for name, value in fields:
        click.echo(f"{name + ':':<16}{value}")
    click.echo("payload:")
    click.echo(json.dumps(json.loads(payload), indent=2, ensure_ascii=False))


def _replayed(event_id, result):
    """Return (ok, the line that tells what replaying event_id did)."""
    if result is None:
        return False, f"{event_id}: no such stored event"
    if result.outcome == Outcome.PROCESSED:
        return True, f"{event_id}: processed; now completed"
    if result.outcome == Outcome.DUPLICATE:
        return True, f"{event_id}: {result.problem}; nothing changed"
    return False, f"{event_id}: still failed: {result.problem or result.outcome}"


@events.command("replay")
@click.argument("event_id", required=False)
@click.option("--all-failed", is_flag=True, help="Replay every failed event, oldest first.")
def replay_events(event_id, all_failed):
    """Re-run stored failed events through the ledger transaction (exactly once, as a delivery would)."""
    if bool(event_id) == all_failed:
        raise click.UsageError("give either EVENT_ID or --all-failed")
    pool = get_pool(current_app)
    if all_failed:
        with transaction(pool) as conn:
            event_ids = [r[0] for r in conn.execute(FAILED_EVENTS)]
    else:
        event_ids = [event_id]
    results = [_replayed(eid, ledger.replay(pool, eid)) for eid in event_ids]
    for _, message in results:
        click.echo(message)
    failures = sum(not ok for ok, _ in results)
    if all_failed:
        completed = len(results) - failures
        click.echo(f"replayed {len(results)} failed events: {completed} completed, {failures} still failed")
    if failures:
        raise click.exceptions.Exit(1)


@events.command("purge")
@click.option("--older-than", "days", default=retention.DEFAULT_DAYS, show_default=True,
              type=click.IntRange(min=0), help="Delete events received more than DAYS days ago.")
@click.option("--include-failed", is_flag=True, help="Delete old failed events too (needs --force).")
@click.option("--force", is_flag=True, help=f"Allow a window under {retention.DEFAULT_DAYS} days, or --include-failed.")
@click.option("--batch-size", default=retention.BATCH_SIZE, show_default=True, type=click.IntRange(1, 100000))
def purge_events(days, include_failed, force, batch_size):
    """Delete old completed events in short batches; ledger credits are kept."""
    if days < retention.DEFAULT_DAYS and not force:
        raise click.UsageError(f"--older-than {days} is under {retention.DEFAULT_DAYS} days, the minimum that "
                               "outlasts providers' resend windows; add --force to purge anyway")
    if include_failed and not force:
        raise click.UsageError("--include-failed deletes events that never took effect; add --force")
    deleted, cutoff = retention.purge(get_pool(current_app), days, include_failed, batch_size)
    kinds = "completed and failed" if include_failed else "completed"
    click.echo(f"purged {deleted} {kinds} events received before {_utc(cutoff)}; ledger credits kept")


@ledger_group.command("verify")
def verify_ledger():
    """Check the ledger's invariants; exit 1 and name the offending rows if one fails."""
    with get_pool(current_app).connection() as conn:
        problems, (users, stored, credits) = verify.check(conn)
    if problems:
        for problem in problems:
            click.echo(problem)
        click.echo(f"ledger INCONSISTENT: {len(problems)} problems "
                   f"({users} users, {stored} stored events, {credits} credits)")
        raise click.exceptions.Exit(1)
    click.echo(f"ledger consistent: {users} users, {stored} stored events, {credits} credits")


@redis_group.command("forget-done")
def forget_done():
    """Delete every done marker (all primaries of a cluster). Run after PostgreSQL lost commits (failover, restore)."""
    try:
        deleted = lock.forget_done(current_app.extensions["redis"])
    except (RedisError, RedisClusterException) as exc:
        raise click.ClickException(f"redis failed ({reason_of(exc)}); some markers may be left: run it again") from None
    click.echo(f"forgot {deleted} done markers: re-deliveries of those events now reach PostgreSQL")
