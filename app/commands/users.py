"""Users and their links to a provider's customers: `flask users add|show|list|link`
(docs/operations.md, "Users and links")."""

import csv
import re
import sys
import uuid
from datetime import UTC, datetime
from typing import Any, cast

import click
import psycopg
from flask import Flask, current_app
from psycopg.rows import namedtuple_row

from ..core.vocabulary import MAX_APP_KEY_CHARS, MAX_ID_CHARS, app_key_of, excerpt
from ..intake.events import Kind
from ..settings.config import Needs
from ..store import ledger
from ..store.db import NamedRow, get_pool, transaction
from ..store.ledger import Entry
from .base import (
    CENTS,
    Commands,
    account_words,
    is_account,
    meant_as_account,
    os_user,
    table,
    unapplied,
    unit_name,
    utc,
)

users = Commands("users", help="Create users, show their balance and journal, link a provider's customers to them.")

USER = "SELECT user_id, balance_cents, opening_balance_cents, created_at FROM user_balances WHERE user_id = %s"
LIST_USERS = """
    SELECT u.user_id, u.balance_cents, u.opening_balance_cents, u.created_at,
           (SELECT count(*) FROM ledger_journal j WHERE j.user_id = u.user_id) AS journal_rows
    FROM user_balances u ORDER BY u.created_at, u.user_id LIMIT %s
"""
# Each balance change with what made it: its event (and type), payment and movement, or a spend's
# reference, or an adjustment's reason and who made it.
JOURNAL = """
    SELECT j.id, j.created_at, j.kind, j.amount_cents, j.source, j.event_id, e.event_type, j.payment_id,
           j.movement_id, j.reference, j.reason, j.actor, j.moved_from
    FROM ledger_journal j LEFT JOIN webhook_events e USING (source, event_id)
    WHERE j.user_id = %s ORDER BY j.id
"""
LINKS_OF = """
    SELECT source, customer_id, linked_by, created_at FROM customer_links WHERE user_id = %s ORDER BY created_at
"""
LINK = "SELECT user_id, linked_by, created_at FROM customer_links WHERE source = %s AND customer_id = %s"
AVAILABLE = "SELECT held_cents, available_cents FROM user_available WHERE user_id = %s"
# The holds that count now (held, not expired): what the available balance is less than the balance.
HOLDS_OF = """
    SELECT reference, amount_cents, expires_at FROM holds
    WHERE user_id = %s AND state = 'held' AND expires_at > now() ORDER BY expires_at, reference
"""
TIDY_HOLDS = "SELECT released FROM release_expired_holds()"
ADD_KEY = "SELECT added FROM add_user_key(p_key => %s, p_user => %s)"
KEY_OF = "SELECT app_key FROM user_keys WHERE user_id = %s"
USER_OF_KEY = "SELECT user_of_key(%s)"
def init_app(app: Flask) -> None:
    app.cli.add_command(users)


@users.command("add", needs=Needs.DATABASE)
@click.argument("user_id", type=click.UUID)
@click.option("--opening", "cents", type=CENTS, default=0, show_default=True,
              help="The opening balance, in cents: what `ledger verify` counts the journal from.")
@click.option("--key", help="The application's own key of the user (an integer, or text), which its calls and "
                            "its payments' metadata may name instead of USER_ID; never changed.")
def add_user(user_id: uuid.UUID, cents: int, key: str | None) -> None:
    """Create the user USER_ID (a UUID) with its opening balance; a second call with the same one changes nothing."""
    with transaction(get_pool(current_app)) as conn:
        added, opening = ledger.add_user(conn, user_id, cents)
        unit = unit_name(conn)
        if key is not None:
            if app_key_of(key) != key:  # a UUID's spelling would be read as the UUID in a payment's metadata
                raise click.BadParameter(f"'{excerpt(key, 64)}' cannot be a key: 1 to {MAX_APP_KEY_CHARS} characters, "
                                         "no NUL, and not a UUID", param_hint="--key")
            try:
                keyed = conn.execute(ADD_KEY, [key, user_id]).fetchone()
            except (psycopg.errors.UniqueViolation, psycopg.errors.InvalidParameterValue) as exc:
                raise click.ClickException(f"{exc.diag.message_primary}: nothing changed") from None
            if keyed and keyed[0]:
                click.echo(f"user {user_id} has the key {key}")
    if added:
        click.echo(f"added user {user_id} with an opening balance of {cents} {unit}")
    elif opening != cents:
        raise click.ClickException(f"user {user_id} exists, with an opening balance of {opening} "
                                   f"{unit}, not {cents}: nothing changed (`flask ledger adjust` corrects a balance)")
    else:
        click.echo(f"user {user_id} exists already, opening balance {cents} {unit}: nothing changed")


def user_named(conn: psycopg.Connection[Any], name: str) -> uuid.UUID:
    """The user a command's USER names: its UUID, or the application's key of it (ClickException: neither)."""
    try:
        return uuid.UUID(name)
    except ValueError:
        row = conn.execute(USER_OF_KEY, [name]).fetchone() if app_key_of(name) == name else None
    if row is None or row[0] is None:
        raise click.ClickException(f"no user has the key {excerpt(name, 64)} (nor is it a UUID)")
    return cast(uuid.UUID, row[0])


@users.command("show", needs=Needs.DATABASE)
@click.argument("name", metavar="USER")
def show_user(name: str) -> None:
    """Show USER's balance, available balance, holds, opening balance, links and journal (each balance change and
    what made it); USER is a UUID or the application's key of the user."""
    with transaction(get_pool(current_app)) as conn:
        user_id = user_named(conn, name)
        key = conn.execute(KEY_OF, [user_id]).fetchone()
        cursor = conn.cursor(row_factory=namedtuple_row)
        user: NamedRow | None = cursor.execute(USER, [user_id]).fetchone()
        journal: list[NamedRow] = cursor.execute(JOURNAL, [user_id]).fetchall()
        links: list[NamedRow] = cursor.execute(LINKS_OF, [user_id]).fetchall()
        available: NamedRow | None = cursor.execute(AVAILABLE, [user_id]).fetchone()
        holds: list[NamedRow] = cursor.execute(HOLDS_OF, [user_id]).fetchall()
        unit = unit_name(conn)
    if user is None:
        raise click.ClickException(f"no user {user_id} (`flask users add {user_id}` creates it)")
    changed = sum(row.amount_cents for row in journal)
    click.echo(f"user:       {user.user_id}" + (f" (key {key[0]})" if key else ""))
    click.echo(f"balance:    {user.balance_cents} {unit}")
    if available is not None:
        held = f"{available.held_cents} {unit} held by {len(holds)} holds" if holds else "nothing held"
        click.echo(f"available:  {available.available_cents} {unit} ({held})")
    for hold in holds:
        click.echo(f"hold:       {hold.reference}, {hold.amount_cents} {unit} until {utc(hold.expires_at)}")
    click.echo(f"opening:    {user.opening_balance_cents} {unit}, created {utc(user.created_at)}")
    click.echo(f"journal:    {len(journal)} rows, {changed:+} {unit}")
    for link in links:
        click.echo(f"linked:     {_linked(link.customer_id)} of source {link.source} (by {link.linked_by}, "
                   f"{utc(link.created_at)})")
    if journal:
        table(("WHEN (UTC)", "KIND", unit.upper(), "MOVEMENT", "MADE BY"),
               [(utc(r.created_at), r.kind, f"{r.amount_cents:+}", _movement(r), _made_by(r)) for r in journal])


# A connected account's customer's id, after the account's and a slash: a provider's id (cus_...), as its events'
# keys end.
_ID = re.compile(r"[A-Za-z0-9_]+")


def _linked(customer_id: str) -> str:
    """What a link links, in words: a customer, or a connected account."""
    return f"{'account' if is_account(customer_id) else 'customer'} {customer_id}"


def _movement(row: NamedRow) -> str:
    """The payment (and refund or dispute) a journal row moved money of, or -."""
    if row.payment_id is None:
        return "-"
    payment = row.payment_id if row.source == "default" else f"{row.source}/{row.payment_id}"
    return f"{payment} {row.movement_id}" if row.movement_id else payment


def _made_by(row: NamedRow) -> str:
    if row.event_id is not None:
        return f"event {row.event_id} ({row.event_type or 'purged'})"
    if row.reference is not None:
        return f"{'give back' if row.kind == Entry.GIVE_BACK else 'spend'} {row.reference}"
    if row.moved_from is not None:  # the rows of that key before it are this payment's
        return f"{row.actor}: moved from {row.moved_from}"
    return f"{row.actor}: {row.reason}"


@users.command("list", needs=Needs.DATABASE)
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1000000))
def list_users(limit: int) -> None:
    """List users, oldest first: balance, opening balance, journal rows."""
    with transaction(get_pool(current_app)) as conn:
        rows: list[NamedRow] = conn.cursor(row_factory=namedtuple_row).execute(LIST_USERS, [limit]).fetchall()
    if not rows:
        click.echo("no users")
        return
    table(("USER", "BALANCE", "OPENING", "JOURNAL ROWS", "CREATED (UTC)"),
           [(r.user_id, r.balance_cents, r.opening_balance_cents, r.journal_rows, utc(r.created_at)) for r in rows])


@users.command("link", needs=Needs.DATABASE)
@click.argument("source")
@click.argument("customer_id")
@click.argument("user_id", type=click.UUID)
@click.option("--by", "actor", help="Who makes the link, recorded with it [default: the OS user].")
def link_customer(source: str, customer_id: str, user_id: uuid.UUID, actor: str | None) -> None:
    """Credit SOURCE's payments of CUSTOMER_ID whose metadata names no user to USER_ID.

    CUSTOMER_ID is a customer's id (Stripe's cus_...), a connected account's customer (acct_.../cus_...), or a
    connected account itself: then each of its payments that neither its metadata nor a linked customer gives a user.
    A link is never changed: a payment credited before it is not moved.
    """
    actor = os_user() if actor is None else actor
    within, slash, customer = customer_id.partition("/")
    if (slash or meant_as_account(customer_id)) and not (
            is_account(within) and (not slash or _ID.fullmatch(customer))):
        raise click.BadParameter(f"a connected account is {account_words()} ({MAX_ID_CHARS} characters at most), "
                                 f"its customer {account_words(customer=True)}", param_hint="CUSTOMER_ID")
    # A provider's id, the customer's; in a connected account, after the account's (a key of MAX_KEY_CHARS at most).
    if not 1 <= len(customer if slash else customer_id) <= MAX_ID_CHARS:
        raise click.BadParameter(f"a customer id is 1 to {MAX_ID_CHARS} characters", param_hint="CUSTOMER_ID")
    account = customer_id if is_account(customer_id) else None
    with transaction(get_pool(current_app)) as conn:
        made = ledger.link_customer(conn, source, customer_id, user_id, actor)
        link: NamedRow | None = conn.cursor(row_factory=namedtuple_row).execute(LINK, [source, customer_id]).fetchone()
        waiting = [(event_id, status) for event_id, status, effect in unapplied(conn, source)
                   if effect.kind == Kind.CREDIT and not effect.names_user
                   and (effect.customer_id == customer_id or account is not None and effect.account == account)]
    if link is None:
        raise click.ClickException(f"no user {user_id} (`flask users add {user_id}` creates it): nothing linked")
    linked = _linked(customer_id)
    if link.user_id != user_id:
        raise click.ClickException(f"{linked} of source {source} is linked to user {link.user_id} "
                                   f"(by {link.linked_by}, {utc(link.created_at)}); a link is never changed")
    click.echo(f"linked {linked} of source {source} to user {user_id}" if made else
               f"{linked} of source {source} is linked to user {user_id} already: nothing changed")
    for event_id, status in waiting:
        replay = event_id if source == "default" else f"{event_id} --source {source}"
        click.echo(f"  event {event_id} is {status} for want of it: flask events replay {replay}")


@users.command("tidy-holds", needs=Needs.DATABASE)
def tidy_holds() -> None:
    """Release every hold past its expiry: tidying only, since an expired hold counts for nothing already."""
    with transaction(get_pool(current_app)) as conn:
        row = conn.execute(TIDY_HOLDS).fetchone()
    click.echo(f"released {row[0] if row else 0} expired holds")


STATEMENT = """
    SELECT s.*, e.event_type FROM statement(p_user => %(user)s, p_from => %(from)s, p_to => %(to)s) s
    LEFT JOIN webhook_events e USING (source, event_id) ORDER BY s.id
"""
BALANCE_AT = "SELECT balance_cents FROM balance_at(p_user => %s, p_at => %s)"
# A statement's CSV: statement()'s columns, in its order, times in UTC ISO 8601.
STATEMENT_COLUMNS = ("id", "created_at", "kind", "amount_cents", "balance_after_cents", "source", "event_id",
                     "payment_id", "movement_id", "reference", "reason", "actor")
WHEN = click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])


@users.command("statement", needs=Needs.DATABASE)
@click.argument("name", metavar="USER")
@click.option("--from", "since", type=WHEN, required=True, help="The period's start (UTC), included.")
@click.option("--to", "until", type=WHEN, help="The period's end (UTC), excluded [default: now].")
@click.option("--csv", "as_csv", is_flag=True, help="One CSV row per journal row (with a header), for a spreadsheet.")
def statement(name: str, since: datetime, until: datetime | None, as_csv: bool) -> None:
    """USER's statement of [--from, --to): its opening and closing balances, and each journal row between, with
    the balance it left; USER is a UUID or the application's key of the user."""
    start = since.replace(tzinfo=UTC)
    end = until.replace(tzinfo=UTC) if until else datetime.now(UTC)
    if end < start:
        raise click.BadParameter("the period ends before it starts", param_hint="--to")
    with transaction(get_pool(current_app), read_only=True) as conn:  # one snapshot: its rows and balances
        user_id = user_named(conn, name)
        key = conn.execute(KEY_OF, [user_id]).fetchone()
        if conn.execute(USER, [user_id]).fetchone() is None:
            raise click.ClickException(f"no user {user_id} (`flask users add {user_id}` creates it)")
        rows: list[NamedRow] = conn.cursor(row_factory=namedtuple_row).execute(
            STATEMENT, {"user": user_id, "from": start, "to": end}).fetchall()
        opening, closing = (conn.execute(BALANCE_AT, [user_id, moment]).fetchone()[0]  # type: ignore[index]
                            for moment in (start, end))
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(STATEMENT_COLUMNS)
        for row in rows:
            writer.writerow([row.created_at.astimezone(UTC).isoformat() if column == "created_at"
                             else getattr(row, column) for column in STATEMENT_COLUMNS])
        return
    click.echo(f"user:       {user_id}" + (f" (key {key[0]})" if key else ""))
    click.echo(f"period:     {utc(start)} to {utc(end)}")
    click.echo(f"opening:    {opening} cents")
    click.echo(f"closing:    {closing} cents ({len(rows)} rows, {closing - opening:+} cents)")
    if rows:
        table(("WHEN (UTC)", "KIND", "CENTS", "BALANCE", "MOVEMENT", "MADE BY"),
              [(utc(r.created_at), r.kind, f"{r.amount_cents:+}", r.balance_after_cents, _movement(r), _made_by(r))
               for r in rows])
