"""`flask payments assign-user` and `move-to-account`: an operator places a payment its events cannot, and its waiting
events apply (docs/operations.md)."""

import uuid
from collections.abc import Sequence
from typing import Any

import click
from flask import Flask, current_app

from ..intake.events import DEFAULT_SOURCE, Kind
from ..settings.config import Needs, Settings
from ..store import ledger
from ..store.db import get_pool, transaction
from ..store.outcome import Outcome
from .base import EVERY_STATUS, Commands, account_words, audit, is_account, os_user, stored_effects, unapplied

payments = Commands("payments", help="Give a payment that names no user its user, or key a connected account's "
                                     "payment in its account, and apply its waiting events.")

KNOWN_PAYMENT = "SELECT 1 FROM payments WHERE source = %s AND payment_id = %s"


def waiting_for(conn: Any, source: str, payment_id: str) -> tuple[list[str], bool]:
    """The ids of source's failed and ignored events that move payment_id (its credits naming no user first: a
    credit that names one is not this command's), and whether there is such a credit."""
    credits, others = [], []
    for event_id, _, effect in unapplied(conn, source):
        if effect.payment_id != payment_id:
            continue
        if effect.kind != Kind.CREDIT:
            others.append(event_id)
        elif not effect.names_user and effect.problem is None:
            credits.append(event_id)
    return credits + others, bool(credits)


def init_app(app: Flask) -> None:
    app.cli.add_command(payments)


@payments.command("assign-user", needs=Needs.SERVICE)
@click.argument("source")
@click.argument("payment_id")
@click.argument("user_id", type=click.UUID)
@click.option("--by", "actor", help="Who assigns it, recorded with it [default: the OS user].")
def assign_user(source: str, payment_id: str, user_id: uuid.UUID, actor: str | None) -> None:
    """Credit SOURCE's PAYMENT_ID (Stripe's pi_...), whose events name no user, to USER_ID, then replay its failed
    and ignored events.

    Refused when the payment was credited to another user, is assigned to another, or has no stored event naming
    no user. An assignment is never changed.
    """
    actor = os_user() if actor is None else actor
    with transaction(get_pool(current_app)) as conn:
        waiting, unnamed = waiting_for(conn, source, payment_id)
        credited = conn.execute(KNOWN_PAYMENT, [source, payment_id]).fetchone() is not None
        if not unnamed and not credited:
            raise click.ClickException(f"no failed or ignored event of source {source} credits payment {payment_id} "
                                       "naming no user: nothing assigned")
        user_now, assigned, credited = ledger.assign_payment_user(conn, source, payment_id, user_id, actor)
    if user_now is None:
        raise click.ClickException(f"no user {user_id} (`flask users add {user_id}` creates it): nothing assigned")
    if user_now != user_id:
        how = "credited" if credited else "assigned"
        raise click.ClickException(f"payment {payment_id} of source {source} is {how} to user {user_now}; "
                                   "a payment's user is never changed: nothing assigned")
    click.echo(f"assigned payment {payment_id} of source {source} to user {user_id}" if assigned else
               f"payment {payment_id} of source {source} is {'credited' if credited else 'assigned'} to user "
               f"{user_id} already")
    replay_waiting(source, waiting)


def replay_waiting(source: str, waiting: Sequence[str]) -> None:
    """Replay each of source's waiting events, as `flask events replay` would, one line each; exit 1 if one is still
    not applied."""
    pool, policy = get_pool(current_app), Settings.of(current_app).policy
    unapplied = 0
    for event_id in waiting:
        result = ledger.replay(pool, source, event_id, policy) or ledger.Result(Outcome.DUPLICATE, "purged meanwhile")
        unapplied += not result.committed
        named = event_id if source == DEFAULT_SOURCE else f"{event_id} of source {source}"
        problem = f": {result.problem}" if result.problem else ""
        click.echo(f"  event {named}: {result.outcome}{problem}")
    if unapplied:
        raise click.ClickException(f"{unapplied} of its events not applied (`flask events show EVENT_ID` says why)")


@payments.command("move-to-account", needs=Needs.SERVICE)
@click.argument("source")
@click.argument("payment_id")
@click.argument("account")
@click.option("--by", "actor", help="Who moves it, logged with it [default: the OS user].")
def move_to_account(source: str, payment_id: str, account: str, actor: str | None) -> None:
    """Key SOURCE's PAYMENT_ID (pi_..., keyed in no account) in the connected ACCOUNT (acct_...), as
    migration 005 keys a connected account's payment, then replay its failed and ignored events.

    Refused when the payment is unknown or in an account already, when ACCOUNT/PAYMENT_ID exists (two rows of
    one payment), when a stored event of it names another account or none, or when a key would be too long.
    """
    actor = os_user() if actor is None else actor
    if not is_account(account):
        raise click.BadParameter(f"a connected account is {account_words()}", param_hint="ACCOUNT")
    within, slash, _ = payment_id.partition("/")
    if slash:
        where = f"account {within}" if is_account(within) else "an account"
        raise click.ClickException(f"payment {payment_id} is keyed in {where} already: nothing moved")
    # No statement timeout: whether a stored event names the payment is read from every stored event's bytes.
    with transaction(get_pool(current_app), statement_timeout=0) as conn:
        try:
            moved = ledger.move_payment_to_account(conn, source, payment_id, account, actor)
        except ledger.MoveRefusedError as exc:
            raise click.ClickException(f"{exc}: nothing moved") from None
        elsewhere = _keyed_elsewhere(conn, source, payment_id, account)
        if elsewhere is not None:
            event_id, named = elsewhere
            whose = "no account (the platform's own)" if named is None else f"account {named}, not {account}"
            raise click.ClickException(f"event {event_id} of payment {payment_id} names {whose}: a payment's events "
                                       "say which account it is in; nothing moved")
        waiting, _ = waiting_for(conn, source, moved.payment_id)
    audit("payment %s of source %s moved into account %s by %s", payment_id, source, account, actor)
    rows = f"{moved.movements} movement{'s' * (moved.movements != 1)} and {moved.journal_rows} journal " \
           f"row{'s' * (moved.journal_rows != 1)} read under it"
    click.echo(f"moved payment {payment_id} of source {source} into account {account}: {moved.payment_id}, "
               f"with {rows} (by {actor})")
    replay_waiting(source, waiting)


def _keyed_elsewhere(conn: Any, source: str, payment_id: str, account: str) -> tuple[str, str | None] | None:
    """The first stored event of source that keys payment_id in another account than account, or in none (the
    platform's own): its id and that account (None: none)."""
    for event_id, _, effect in stored_effects(conn, source, EVERY_STATUS, naming=payment_id):
        if effect.payment_id == payment_id:
            return event_id, None
        if effect.account not in (None, account) and effect.payment_id == f"{effect.account}/{payment_id}":
            return event_id, effect.account
    return None
