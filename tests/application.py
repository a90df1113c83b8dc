"""What the application's tests share: money.sql's application functions called as an application calls them
(named arguments, one statement, one row back), and a payment's refund and dispute applied through apply_event
in SQL, on a connection whose transaction the test holds."""

import hashlib

from psycopg.rows import namedtuple_row

from app.store.ledger import DELIVERY


def call(conn, function, **arguments):
    """SELECT * FROM function(p_name => value, ...): its one row, as a named tuple."""
    named = ", ".join(f"p_{name} => %({name})s" for name in arguments)
    return conn.cursor(row_factory=namedtuple_row).execute(
        f"SELECT * FROM {function}({named})", arguments).fetchone()


def hold(conn, user, cents, reference, expires_in="1 hour", **options):
    """place_hold(...), expiring expires_in (an interval) from now unless options say p_expires_at."""
    if "expires_at" not in options:
        (options["expires_at"],) = conn.execute("SELECT now() + %s::interval", [expires_in]).fetchone()
    return call(conn, "place_hold", user=user, cents=cents, reference=reference, **options)


def available(conn, user):
    return call(conn, "available_balance", user=user)


_ROW = "ROW(" + ", ".join(f"%({name})s::{type_}" for name, type_ in DELIVERY) + ")::ledger_delivery"


def delivery(event_id, kind, payment, amount, user=None, movement=None, state=None):
    """A ledger_delivery's fields, as app/store/ledger.py builds them from a provider's event."""
    body = f'{{"id": "{event_id}", "amount": {amount}}}'.encode()
    return {"source": "default", "event_id": event_id, "type": "t", "body": body,
            "sha256": hashlib.sha256(body).digest(), "effect": hashlib.sha256(body + kind.encode()).digest(),
            "problem": None, "kind": kind, "payment": payment, "user_id": user, "amount": amount, "currency": "usd",
            "movement": movement, "state": state, "ledger_currency": "usd", "test_events": False,
            "origin": "delivery", "customer": None, "user_key": "user_id", "no_user": "refuse", "account": None,
            "app_key": None}


def apply_event(conn, fields):
    """apply_event(the delivery), as the receiver calls it: its row (outcome, problem, change, balance_after)."""
    return conn.cursor(row_factory=namedtuple_row).execute(f"SELECT * FROM apply_event({_ROW})", fields).fetchone()


def credit(conn, event_id, user, cents, payment):
    return apply_event(conn, delivery(event_id, "credit", payment, cents, user=user))


def refund(conn, event_id, payment, cents, refund_id):
    return apply_event(conn, delivery(event_id, "refund", payment, cents, movement=refund_id, state="applied"))


def dispute(conn, event_id, payment, cents, dispute_id, state="applied"):
    return apply_event(conn, delivery(event_id, "dispute", payment, cents, movement=dispute_id, state=state))
