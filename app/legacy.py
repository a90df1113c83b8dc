"""Payments of an earlier release filed under the id of the event that credited them: `flask ledger
legacy-payments` lists them, `flask ledger name-payment` files one under the id its provider knows it by, and
`flask init-db` files what an upgrade set aside (migrations/001a_legacy_values.sql) as far as its event allows.

Migration 002 files a credit under the payment its event names, read from the event's stored copy; when the
event was purged already (or named a value the ledger refuses, 001a), under the event's id, which no provider
refunds by: its refunds are `422 unknown payment` until the payment is named. Naming moves the payment's row
and its credit's journal row to the new id, in one transaction, then replays the failed events that waited for
that id; a payment that something else moved money on since is known by its event id, and is not renamed.
"""

import json
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import namedtuple_row

from .db import NamedRow, Pool, transaction
from .events import DEFAULT_SOURCE, MAX_ID_CHARS, PAYMENT_SUCCEEDED, RULES, Policy
from .ledger import Result, replay


class NamingError(ValueError):
    """A payment cannot be named so: nothing was changed (the message says why, in one line)."""


class TakenError(NamingError):
    """The new payment id is another payment's already."""


# A payment of a release before payments, filed under its event's id: credited before the migration that made
# payments was recorded (never, on a database that schema.sql created), and its event no longer stored, so no
# stored bytes say what its provider calls it.
LEGACY = """
    p.payment_id = p.event_id
    AND p.created_at < (SELECT applied_at FROM schema_migrations WHERE name = '002_payments.sql')
    AND NOT EXISTS (SELECT 1 FROM webhook_events e WHERE e.source = p.source AND e.event_id = p.event_id)
"""
LEGACY_PAYMENTS = f"""
    SELECT p.source, p.event_id, p.user_id, p.amount_cents, p.currency, p.created_at AS credited_at,
           s.source IS NOT NULL AS set_aside, s.event_type,
           s.refused_payment_id::text, s.refused_currency::text
    FROM payments p LEFT JOIN legacy_set_aside s ON s.source = p.source AND s.event_id = p.event_id
    WHERE {LEGACY} AND (%(source)s::text IS NULL OR p.source = %(source)s)
    ORDER BY p.created_at, p.source, p.event_id
"""
# The payment filed under the id of the event that credited it, locked (as every movement of it locks it), and
# whether anything but its credit moved money on it since: then its sender knows it by that id, and the events
# that say so keep their journal rows as they are.
FILED_UNDER_ITS_EVENT = f"""
    SELECT p.user_id, p.amount_cents, {LEGACY} AS legacy,
           EXISTS (SELECT 1 FROM webhook_events e WHERE e.source = p.source AND e.event_id = p.event_id) AS stored,
           p.refunded_cents > 0 OR EXISTS (SELECT 1 FROM movements m WHERE m.source = p.source
                                           AND m.payment_id = p.payment_id) AS moved
    FROM payments p WHERE p.source = %(source)s AND p.payment_id = %(event_id)s AND p.event_id = %(event_id)s
    FOR UPDATE
"""
# The payment's row under its new id, then its credit in the journal (found by its user's index), then the old
# row, which nothing references any more.
RENAMED = """
    INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, refunded_cents, debited_cents,
                          event_id, created_at)
    SELECT source, %(payment_id)s, user_id, amount_cents, currency, refunded_cents, debited_cents, event_id, created_at
    FROM payments WHERE source = %(source)s AND payment_id = %(event_id)s
    ON CONFLICT (source, payment_id) DO NOTHING
    RETURNING 1
"""
HOLDER = "SELECT event_id FROM payments WHERE source = %(source)s AND payment_id = %(payment_id)s"
MOVE = [
    "UPDATE ledger_journal SET payment_id = %(payment_id)s"
    " WHERE user_id = %(user_id)s AND source = %(source)s AND payment_id = %(event_id)s AND kind = 'credit'",
    "DELETE FROM payments WHERE source = %(source)s AND payment_id = %(event_id)s",
]
# apply_event's problem for a movement of a payment it does not know (money.sql).
WAITING = """
    SELECT source, event_id, event_type, last_error, created_at FROM webhook_events
    WHERE status = 'failed' AND last_error LIKE 'unknown payment %%'
      AND (%(source)s::text IS NULL OR source = %(source)s)
      AND (%(payment_id)s::text IS NULL OR last_error = 'unknown payment ' || %(payment_id)s)
    ORDER BY created_at, id
"""
UNSETTLED = """
    SELECT s.source, s.event_id, true AS set_aside, s.event_type, s.refused_payment_id::text,
           s.refused_currency::text, s.payment_id, s.currency, j.user_id, j.amount_cents, j.created_at AS credited_at
    FROM legacy_set_aside s JOIN ledger_journal j USING (source, event_id)
    WHERE s.settled_at IS NULL ORDER BY j.id FOR UPDATE OF s
"""
SETTLED = "UPDATE legacy_set_aside SET settled_at = now() WHERE source = %s AND event_id = %s"
FILED_IN = """
    UPDATE payments SET currency = %(currency)s WHERE source = %(source)s AND payment_id = %(event_id)s
    AND event_id = %(event_id)s
"""
CURRENCY = "SELECT currency FROM payments WHERE source = %s AND payment_id = %s"


class Named(NamedTuple):
    user_id: uuid.UUID
    amount_cents: int
    replayed: list[tuple[str, str, Result | None]]  # the failed events that waited for the new id, replayed


class Settled(NamedTuple):
    line: str  # what was done with one row an upgrade set aside, and what is left to do
    source: str
    payment_id: str | None  # the id its credit is filed under now, when that is not its event's


def legacy_payments(pool: Pool, source: str | None) -> tuple[list[NamedRow], list[NamedRow]]:
    """The legacy payments, oldest first, and the failed events that wait for a payment the ledger does not know."""
    with transaction(pool, read_only=True) as conn:
        cursor = conn.cursor(row_factory=namedtuple_row)
        payments = cursor.execute(LEGACY_PAYMENTS, {"source": source}).fetchall()
        waiting = cursor.execute(WAITING, {"source": source, "payment_id": None}).fetchall()
    return payments, waiting


def why(row: NamedRow) -> str:
    """Why a legacy payment (a row of LEGACY_PAYMENTS or UNSETTLED) is filed under its event's id."""
    if not row.set_aside:
        return "its event is no longer stored"
    if row.event_type is None:
        return "its event was purged before the upgrade"
    labels = (RULES.get(row.event_type) or RULES[PAYMENT_SUCCEEDED]).labels
    reasons = [f"{labels.payment_id} {_shown(row.refused_payment_id)} is not a payment id of 1 to {MAX_ID_CHARS} "
               "characters" if row.refused_payment_id is not None else "",
               f"{labels.currency} {_shown(row.refused_currency)} is not a currency code"
               if row.refused_currency is not None else ""]
    return "; ".join(reason for reason in reasons if reason)


def name_payment(pool: Pool, source: str, event_id: str, payment_id: str, policy: Policy) -> Named:
    """File the legacy payment credited by event_id under payment_id, in one transaction, then replay the failed
    events that waited for payment_id. Raises NamingError, changing nothing, when it is not legacy or the id is
    taken or not an id."""
    if not 1 <= len(payment_id) <= MAX_ID_CHARS or "\x00" in payment_id or not _encodable(payment_id):
        raise NamingError(f"PAYMENT_ID must be 1 to {MAX_ID_CHARS} characters that PostgreSQL can store")
    if payment_id == event_id:
        raise NamingError(f"payment {event_id!r} is filed under that id already")
    keys = {"source": source, "event_id": event_id, "payment_id": payment_id}
    with transaction(pool) as conn:
        cursor: psycopg.Cursor[NamedRow] = conn.cursor(row_factory=namedtuple_row)
        payment = cursor.execute(FILED_UNDER_ITS_EVENT, keys).fetchone()
        if payment is None:
            raise NamingError(f"no payment of source {source!r} is filed under the id of event {event_id!r}")
        if payment.stored:
            raise NamingError(f"event {event_id!r} of source {source!r} is stored, and its bytes name payment "
                              f"{event_id!r}: only a payment whose event is gone can be named")
        if not payment.legacy:
            raise NamingError(f"payment {event_id!r} of source {source!r} was credited by a release that files a "
                              "payment without data.paymentId under its event's id: it is not a legacy payment")
        _file_under(conn, keys, payment)
    return Named(payment.user_id, payment.amount_cents, replay_waiting(pool, source, payment_id, policy))


def settle(pool: Pool) -> list[Settled]:
    """File each credit an upgrade set aside, once, under the valid payment id and currency its event named."""
    settled = []
    with transaction(pool) as conn:
        cursor: psycopg.Cursor[NamedRow] = conn.cursor(row_factory=namedtuple_row)
        for row in cursor.execute(UNSETTLED).fetchall():
            keys = {"source": row.source, "event_id": row.event_id, "payment_id": row.payment_id,
                    "currency": row.currency}
            filed, refused = row.event_id, None
            if row.payment_id not in (None, row.event_id):
                try:
                    _file_under(conn, keys, cursor.execute(FILED_UNDER_ITS_EVENT, keys).fetchone())
                    filed = row.payment_id
                except NamingError as exc:
                    refused = f"not filed as {row.payment_id!r}: {exc}"
                    if isinstance(exc, TakenError):
                        refused += "; if both events are that one payment, its user was credited twice"
            if row.currency is not None:  # a valid currency beside a refused id: its event id's payment
                conn.execute(FILED_IN, keys)
            currency = conn.execute(CURRENCY, [row.source, filed]).fetchone()
            conn.execute(SETTLED, [row.source, row.event_id])
            settled.append(Settled(_settled_line(row, filed, currency and currency[0], refused), row.source,
                                   None if filed == row.event_id else filed))
    return settled


def replay_waiting(pool: Pool, source: str, payment_id: str, policy: Policy) -> list[tuple[str, str, Result | None]]:
    """Replay the failed events that a payment unknown then, payment_id, stopped; their (source, event id, Result)."""
    with transaction(pool, read_only=True) as conn:
        keys = conn.execute(WAITING, {"source": source, "payment_id": payment_id}).fetchall()
    return [(source, event_id, replay(pool, source, event_id, policy)) for source, event_id, *_ in keys]


def name_of(source: str, event_id: str) -> str:
    """An event as the CLI's lines name it: its id, after its source's name unless it is the default source's."""
    return event_id if source == DEFAULT_SOURCE else f"{source}/{event_id}"


def naming_command(source: str, event_id: str) -> str:
    """The command that names the payment event_id credited, for an operator to complete."""
    option = "" if source == DEFAULT_SOURCE else f" --source {source}"
    return f"flask ledger name-payment {event_id} PAYMENT_ID{option}"


def _file_under(conn: psycopg.Connection[Any], keys: dict[str, Any], payment: NamedRow | None) -> None:
    """Move payment (FILED_UNDER_ITS_EVENT's row of keys, locked) to keys' payment id, in conn's transaction.

    NamingError, before anything is written, when something else moved money on it or the new id is taken.
    """
    if payment is None:
        raise NamingError(f"no payment of source {keys['source']!r} is filed under the id of event "
                          f"{keys['event_id']!r}")
    if payment.moved:
        raise NamingError(f"payment {keys['event_id']!r} of source {keys['source']!r} has refunds or disputes "
                          "under that id, so its sender knows it by it: it is not renamed")
    if conn.execute(RENAMED, keys).fetchone() is None:
        holder = conn.execute(HOLDER, keys).fetchone()
        raise TakenError(f"payment {keys['payment_id']!r} of source {keys['source']!r} exists already, credited "
                         f"by event {holder and holder[0]!r}")
    for statement in MOVE:
        conn.execute(statement, {**keys, "user_id": payment.user_id})


def _settled_line(row: NamedRow, filed: str, currency: str | None, refused: str | None) -> str:
    """One line: the row's event, why it was set aside, where its money is filed now, and what is left to do."""
    credited: datetime = row.credited_at
    where = f"payment {filed!r}" + (", its event id" if filed == row.event_id else "")
    if row.refused_currency is not None:
        where += f", in {currency}, the ledger's currency"
    if refused:
        todo = refused
    elif filed == row.event_id and (row.event_type is None or row.refused_payment_id is not None):
        todo = ("if its provider refunds it by another id (a Stripe PaymentIntent), find that id and run: "
                + naming_command(row.source, row.event_id))
    else:
        todo = "nothing to do"
    return (f"{name_of(row.source, row.event_id)}: {why(row)}: {row.amount_cents} cents to {row.user_id} on "
            f"{credited.astimezone(UTC):%Y-%m-%d} stay credited, as {where}; {todo}")


def _shown(text: str) -> str:
    """A refused value as its event had it (JSON text), a long string cut."""
    value = json.loads(text)
    if isinstance(value, str) and len(value) > 32:
        return f'{json.dumps(value[:24], ensure_ascii=False)[:-1]}..." ({len(value)} characters)'
    return json.dumps(value, ensure_ascii=False)


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
