"""A payment none of whose events names a user: `flask payments assign-user` gives it one and applies its waiting
events (docs/operations.md, "A Checkout payment refused for want of a user")."""

import uuid
from typing import Any

import click
from flask import Flask, current_app

from ..intake.events import DEFAULT_SOURCE, Kind
from ..settings.config import Needs, Settings
from ..store import ledger
from ..store.db import get_pool, transaction
from ..store.outcome import Outcome
from .base import Commands, os_user, unapplied

payments = Commands("payments", help="Give a payment that names no user its user, and apply its waiting events.")

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
        elif effect.user_id is None and effect.problem is None:
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
    pool = get_pool(current_app)
    with transaction(pool) as conn:
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
    policy = Settings.of(current_app).policy
    unapplied = 0
    for event_id in waiting:
        result = ledger.replay(pool, source, event_id, policy) or ledger.Result(Outcome.DUPLICATE, "purged meanwhile")
        unapplied += not result.committed
        named = event_id if source == DEFAULT_SOURCE else f"{event_id} of source {source}"
        problem = f": {result.problem}" if result.problem else ""
        click.echo(f"  event {named}: {result.outcome}{problem}")
    if unapplied:
        raise click.ClickException(f"{unapplied} of its events not applied (`flask events show EVENT_ID` says why)")
