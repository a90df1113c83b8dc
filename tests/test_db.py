"""app/db.py, app/schema.py, schema.sql and migrations/: init-db creates the schema, upgrades a database
created by each earlier release to the same schema, is a no-op the second time and safe from two hosts at once;
every transaction carries its timeouts (so they hold through PgBouncer), connections have
TCP keepalives, prepared statements can be switched off, and a connection that died in the pool is not handed
out."""

import gc
import hashlib
import json
import logging
import os
import resource
import shutil
import socket
import threading
from datetime import UTC
from pathlib import Path
from typing import NamedTuple

import psycopg
import pytest
import stripe
from flask import Flask
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, namedtuple_row

from app.db import DEFAULT_SCHEMA_PATH, TCP_SETTINGS, apply_schema, get_pool, transaction
from app.deadline import MARGIN_MS
from app.schema import LOCK_KEY, RECORD, RECORDS, SchemaError
from devservers import wait_until

from .helpers import (
    ALICE,
    BOB,
    OPENING,
    SECRETS,
    assert_ledger_consistent,
    balance,
    db_url,
    encode,
    event_rows,
    payment,
    send,
    sources_config,
)
from .stripe_events import charge_refunded, dispute, intent_succeeded, refund, send_stripe, stripe_signed

pytestmark = pytest.mark.core

# The schemas as they were released: before sources (76d09bb), before payments (fbc880a), and the last one
# before migrations (7dd3d34), which upgraded a database in place by re-running the whole file.
BEFORE_SOURCES = Path(__file__).parent / "data" / "schema_before_sources.sql"
BEFORE_PAYMENTS = Path(__file__).parent / "data" / "schema_before_payments.sql"
BEFORE_MIGRATIONS = Path(__file__).parent / "data" / "schema_before_migrations.sql"
# The previous release (4de879c): payments and running totals, migrations 001-003, its 13-parameter apply_event.
BEFORE_MOVEMENTS = Path(__file__).parent / "data" / "schema_before_movements.sql"
BEFORE_MOVEMENTS_HAD = ["001_sources.sql", "002_payments.sql", "003_one_catalog.sql"]


MIGRATIONS = sorted(path.name for path in (DEFAULT_SCHEMA_PATH.parent / "migrations").glob("*.sql"))
# What this release adds to a database of the previous one (001a only creates its table there: it sets aside
# what 002 would misfile, and 002 ran there already), and the lines init-db prints for them.
SINCE_MOVEMENTS = [name for name in MIGRATIONS if name not in BEFORE_MOVEMENTS_HAD]
APPLIED_SINCE_MOVEMENTS = [f"applied migration {name}" for name in SINCE_MOVEMENTS]
TABLES = ("ledger_journal", "payments", "webhook_events", "user_balances", "schema_migrations", "legacy_set_aside",
          "reconcile_watermarks", "reconcile_runs", "customer_links", "ignored_payments")


def _recorded(conn):
    return conn.execute("SELECT name, ran FROM schema_migrations ORDER BY name").fetchall()


def test_schema_applies_twice_without_error(db):
    assert apply_schema(db) == (False, [])
    assert apply_schema(db) == (False, [])
    tables = {r[0] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
    assert tables == {"user_balances", "webhook_events", "payments", "movements", "ledger_journal",
                      "schema_migrations", "payment_accounts", "webhook_events_json", "legacy_set_aside",
                      "reconcile_runs", "reconcile_watermarks", "customer_links", "ignored_payments"}
    assert db.execute("SELECT count(*) FROM user_balances").fetchone()[0] == 2  # data kept
    # An empty database got schema.sql, which includes every migration: none ran.
    assert _recorded(db) == [(name, False) for name in MIGRATIONS] and MIGRATIONS


def test_opening_balance_is_the_balance_at_insert(db):
    assert db.execute("SELECT opening_balance_cents FROM user_balances WHERE user_id = %s",
                      [ALICE]).fetchone()[0] == OPENING[ALICE]


@pytest.mark.unit
def test_schema_has_no_psql_meta_commands():
    assert not any(line.lstrip().startswith("\\") for line in DEFAULT_SCHEMA_PATH.read_text().splitlines())


INSERT_EVENT = ("INSERT INTO webhook_events (source, event_id, event_type, payload, payload_sha256)"
                " VALUES (%s, 'e', 't', '{}', sha256(''))")


def test_event_id_is_unique_by_construction(db):
    db.execute(INSERT_EVENT, ["default"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["default"])


def test_the_unique_constraint_is_on_source_and_event_id(db):
    db.execute(INSERT_EVENT, ["default"])
    db.execute(INSERT_EVENT, ["billing"])
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_EVENT, ["billing"])


def test_a_source_named_in_capitals_is_refused(db):
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(INSERT_EVENT, ["Billing"])


def _unique_keys(conn, table):
    """The column lists of table's unique indexes, other than its primary key."""
    return sorted(tuple(row[0]) for row in conn.execute("""
        SELECT array_agg(a.attname::text ORDER BY k.ord)
        FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k (attnum, ord)
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        WHERE i.indrelid = %s::regclass AND i.indisunique AND NOT i.indisprimary
        GROUP BY i.indexrelid""", [table]))


# What a schema is made of, to compare a database made by schema.sql with one that migrations upgraded.
CATALOG = {
    "columns": """SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity
                  FROM information_schema.columns WHERE table_schema = 'public'""",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                      WHERE connamespace = 'public'::regnamespace""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
}


def _catalog(conn):
    return {part: sorted(conn.execute(query).fetchall()) for part, query in CATALOG.items()}


def _differences(conn, fresh):
    """What conn's schema has that fresh (a _catalog) has not, and the other way round."""
    now = _catalog(conn)
    return [f"{which} {part}: {item}" for part in CATALOG
            for which, items in (("only upgraded", set(now[part]) - set(fresh[part])),
                                 ("only fresh", set(fresh[part]) - set(now[part])))
            for item in sorted(items, key=str)]


def _drop_schema(db):
    """Empty db of what init-db made: the views, the tables and the functions (every overload)."""
    db.execute("DROP VIEW payment_accounts, webhook_events_json")
    db.execute(f"DROP TABLE movements, {', '.join(TABLES)}")
    for (function,) in db.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE proname IN"
                                  " ('apply_event', 'adjust', 'spend', 'event_json')"
                                  " AND pronamespace = 'public'::regnamespace").fetchall():
        db.execute(f"DROP FUNCTION {function}")


def _created_by(db, release):
    """Empty db, then create the schema as an earlier release did (no schema_migrations, its own apply_event)."""
    _drop_schema(db)
    db.execute(release.read_text())


def _upgraded_from_before_sources(make_app, config, db):
    """db as the release before sources made it, with one credited event, then init-db once.
    Returns the app (with a named source), the fresh schema's catalog and what init-db printed."""
    fresh = _catalog(db)
    _created_by(db, BEFORE_SOURCES)
    body = encode(payment("evt_old", cents=5))
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1005), (%s, 0)", list(OPENING))
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256, completed_at)"
               " VALUES ('evt_old', 'payment.succeeded', 'completed', %s, %s, now())",
               [body.decode(), hashlib.sha256(body).digest()])
    db.execute("INSERT INTO ledger_credits (event_id, user_id, amount_cents) VALUES ('evt_old', %s, 5)", [ALICE])
    app = make_app(sources_config(config, {"billing": None}))
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    return app, fresh, result.output


def _source_checks(db, table):
    """How many CHECKs of table hold its source's spelling."""
    return db.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass"
                      " AND pg_get_constraintdef(oid) LIKE '%%source ~%%'", [table]).fetchone()[0]


def test_schema_upgrades_a_database_created_before_sources(make_app, config, db):
    _, fresh, output = _upgraded_from_before_sources(make_app, config, db)
    assert output.splitlines()[:len(MIGRATIONS)] == [f"applied migration {name}" for name in MIGRATIONS]
    assert _recorded(db) == [(name, True) for name in MIGRATIONS]
    assert db.execute("SELECT source, event_id, status FROM webhook_events").fetchall() == \
        [("default", "evt_old", "completed")]
    assert db.execute("SELECT source, event_id FROM ledger_journal").fetchall() == [("default", "evt_old")]
    # The journal's other key is its spends' references (migration 006).
    keys = {"webhook_events": [("source", "event_id")],
            "ledger_journal": [("reference",), ("source", "event_id")]}
    for table in ("webhook_events", "ledger_journal"):
        assert _unique_keys(db, table) == keys[table], table
        assert db.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s",
                          [table, f"{table}_event_id_key"]).fetchone()[0] == 0, table
        assert _source_checks(db, table) == 1, table
    assert _differences(db, fresh) == []


def test_schema_applies_twice_to_a_database_created_before_sources(make_app, config, db):
    app, fresh, _ = _upgraded_from_before_sources(make_app, config, db)
    result = app.test_cli_runner().invoke(args=["init-db"])  # the documented upgrade step, safe to run twice
    assert result.exit_code == 0, result.output
    assert "schema up to date" in result.output and "applied" not in result.output, result.output
    assert _recorded(db) == [(name, True) for name in MIGRATIONS]
    for table in ("webhook_events", "ledger_journal"):
        assert _source_checks(db, table) == 1, table  # applied twice, the new column's CHECK is there once
    assert _differences(db, fresh) == []


def test_after_the_upgrade_from_before_sources_an_old_event_is_the_default_sources(make_app, config, db):
    """The app on the upgraded database: the old event is the default source's, its id is free on a named source."""
    app, _, _ = _upgraded_from_before_sources(make_app, config, db)
    client = app.test_client()
    assert send(client, payment("evt_old", cents=5)).json["status"] == "duplicate"
    assert send(client, payment("evt_old", cents=5), source="billing").json["status"] == "processed"
    assert db.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [ALICE]).fetchone()[0] == 1010


def _old_effect(event_type, *fields):
    """effect_sha256 as the release before payments computed it: the type and the raw fields."""
    return hashlib.sha256(json.dumps([event_type, *fields], sort_keys=True, separators=(",", ":")).encode()).digest()


def _stored_before_payments(db, event, credited_cents=None, user=ALICE):
    """An event as the release before payments stored it, with its credit in ledger_credits."""
    body = json.dumps(event).encode()
    data = event["data"]
    if event["type"] == "payment.succeeded":
        fields = [data.get("userId"), data.get("amountCents"), data.get("currency")]
    else:
        intent = data["object"]
        fields = [intent["metadata"]["user_id"], intent["amount_received"], intent["currency"], event["livemode"]]
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, body, payload, payload_sha256,"
               " effect_sha256, completed_at) VALUES (%s, %s, 'completed', %s, %s, %s, %s, now())",
               [event["id"], event["type"], body, body.decode(), hashlib.sha256(body).digest(),
                _old_effect(event["type"], *fields)])
    if credited_cents:
        db.execute("INSERT INTO ledger_credits (event_id, user_id, amount_cents) VALUES (%s, %s, %s)",
                   [event["id"], user, credited_cents])
        db.execute("UPDATE user_balances SET balance_cents = balance_cents + %s WHERE user_id = %s",
                   [credited_cents, user])


def _intent_event(event_id, intent_id, cents, currency="usd"):
    return {"id": event_id, "type": "payment_intent.succeeded", "livemode": True,
            "data": {"object": {"id": intent_id, "amount_received": cents, "currency": currency,
                                "metadata": {"user_id": str(BOB)}}}}


def _upgraded_from_before_payments(make_app, config, db):
    """db as the release before payments made it, with four credited events (one payment credited twice), then
    init-db once. Returns the app, the fresh schema's catalog and what init-db printed."""
    fresh = _catalog(db)
    _created_by(db, BEFORE_PAYMENTS)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1000), (%s, 0)", list(OPENING))
    _stored_before_payments(db, payment("evt_own", cents=5, currency="USD", paymentId=None), 5)
    _stored_before_payments(db, _intent_event("evt_pi_1", "pi_old", 300), 300, user=BOB)
    # The old release credited a PaymentIntent once per event: a second event, a second credit.
    _stored_before_payments(db, _intent_event("evt_pi_2", "pi_twice", 40), 40, user=BOB)
    _stored_before_payments(db, _intent_event("evt_pi_3", "pi_twice", 40), 40, user=BOB)
    app = make_app({**config, "LEDGER_CURRENCY": "usd"})
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    return app, fresh, result.output


def test_schema_upgrades_a_database_created_before_payments(make_app, config, db):
    app, fresh, output = _upgraded_from_before_payments(make_app, config, db)
    assert "recomputed the effects of 4 stored events" in output, output
    assert "applied migration 002_payments.sql" in output, output
    # The release before payments had 001's changes already: recorded, not run.
    assert _recorded(db) == [("001_sources.sql", False)] + [(name, True) for name in MIGRATIONS[1:]]
    assert _differences(db, fresh) == []
    assert db.execute("SELECT payment_id, user_id, amount_cents, currency, event_id FROM payments"
                      " ORDER BY payment_id").fetchall() == [
        ("evt_own", ALICE, 5, "usd", "evt_own"), ("pi_old", BOB, 300, "usd", "evt_pi_1"),
        ("pi_twice", BOB, 40, "usd", "evt_pi_2")]
    assert db.execute("SELECT event_id, kind, payment_id FROM ledger_journal ORDER BY id").fetchall() == [
        ("evt_own", "credit", "evt_own"), ("evt_pi_1", "credit", "pi_old"), ("evt_pi_2", "credit", "pi_twice"),
        ("evt_pi_3", "credit", "pi_twice")]
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert "payment 'pi_twice': credited 2 times" in verified.output and verified.exit_code == 1


def test_schema_applies_twice_to_a_database_created_before_payments(make_app, config, db):
    app, fresh, _ = _upgraded_from_before_payments(make_app, config, db)
    result = app.test_cli_runner().invoke(args=["init-db"])  # the documented upgrade step, safe to run twice
    assert result.exit_code == 0, result.output
    assert "recomputed the effects" not in result.output, result.output
    assert "applied migration 002_payments.sql" not in result.output, result.output
    assert _recorded(db) == [("001_sources.sql", False)] + [(name, True) for name in MIGRATIONS[1:]]
    assert _differences(db, fresh) == []


def test_after_the_upgrade_from_before_payments_a_stored_event_in_other_bytes_is_a_duplicate(make_app, config, db):
    """Its effect was recomputed by init-db."""
    app, _, _ = _upgraded_from_before_payments(make_app, config, db)
    reserialised = json.dumps(payment("evt_own", cents=5, currency="USD", paymentId=None), indent=2).encode()
    assert send(app.test_client(), reserialised).json == {"status": "duplicate", "event_id": "evt_own"}


def test_after_the_upgrade_from_before_payments_another_event_for_an_old_payment_credits_nothing(
        make_app, config, db):
    _upgraded_from_before_payments(make_app, config, db)
    stripe_client = _stripe_client(make_app, config)
    assert send(stripe_client, _intent_event("evt_pi_4", "pi_old", 300)).json["status"] == "duplicate"
    assert balance(db, BOB) == 300 + 80


def test_after_the_upgrade_from_before_payments_a_refund_finds_an_old_payment(make_app, config, db):
    _upgraded_from_before_payments(make_app, config, db)
    refunded = {"id": "evt_refund", "type": "charge.refunded", "livemode": True,
                "data": {"object": {"payment_intent": "pi_old", "amount_refunded": 100, "currency": "usd"}}}
    assert send(_stripe_client(make_app, config), refunded).json["status"] == "processed"
    assert balance(db, BOB) == 300 + 80 - 100


def test_after_the_upgrade_the_runbooks_adjustment_of_a_payment_credited_twice_makes_verify_clean(
        make_app, config, db):
    _created_by(db, BEFORE_PAYMENTS)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1000), (%s, 0)", list(OPENING))
    _stored_before_payments(db, _intent_event("evt_pi_2", "pi_twice", 40), 40, user=BOB)
    _stored_before_payments(db, _intent_event("evt_pi_3", "pi_twice", 40), 40, user=BOB)
    cli = make_app(config).test_cli_runner()
    assert cli.invoke(args=["init-db"]).exit_code == 0
    assert cli.invoke(args=["ledger", "verify"]).exit_code == 1
    # docs/deploying.md, "Upgrading the schema": take the second credit back through the journal.
    adjusted = cli.invoke(args=["ledger", "adjust", str(BOB), "-40", "--payment", "pi_twice",
                                "--reason", "pi_twice credited twice by the release before payments"])
    assert adjusted.exit_code == 0, adjusted.output
    verified = cli.invoke(args=["ledger", "verify"])
    assert (verified.exit_code, verified.output) == \
        (0, "ledger consistent: 2 users, 2 stored events, 1 payments, 3 journal rows\n")
    assert balance(db, BOB) == 40


# How the previous release's app/ledger.py called apply_event: its 13 parameters, by position.
OLD_APPLY_EVENT = "SELECT * FROM apply_event(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _applied_by_the_release_before_movements(db, evt, kind=None, payment_id=None, cents=None, user=None):
    """Deliver a Stripe event as the previous release applied it: OLD_APPLY_EVENT, its effect hashed by its rule
    (effect version 2: the type, 'applies', then payment, user, amount, currency, livemode). Its kinds were
    'credit' and 'refund' (a running total); None for a type it did not know (a refund object, a dispute),
    which it stored as moving nothing. Returns apply_event's row."""
    body = stripe_signed(evt)[0]
    effect = _old_effect(evt.type, "applies", payment_id, user and str(user), cents, "usd", True) if kind \
        else _old_effect(evt.type)
    return db.execute(OLD_APPLY_EVENT, ["default", evt.id, evt.type, body, hashlib.sha256(body).digest(), effect,
                                        True, None, kind, payment_id, user, kind and cents, kind and "usd"]).fetchone()


def _created_by_the_release_before_movements(db):
    """db as that release's init-db made it: its schema.sql, its migrations recorded as included; the users."""
    _created_by(db, BEFORE_MOVEMENTS)
    db.execute(RECORDS)
    for name in BEFORE_MOVEMENTS_HAD:
        text = (DEFAULT_SCHEMA_PATH.parent / "migrations" / name).read_bytes()
        db.execute(RECORD, [name, hashlib.sha256(text).digest(), False])
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s), (%s, %s)",
               [value for user in OPENING.items() for value in user])


def _stripe_client(make_app, config):
    return make_app({**config, "WEBHOOK_SIGNATURE_SCHEME": "stripe", "WEBHOOK_SECRET": SECRETS["stripe"]}).test_client()


class UpgradedFromBeforeMovements(NamedTuple):
    app: Flask
    fresh: dict  # the fresh schema's _catalog
    balances: dict  # each user's, before the upgrade
    output: str  # what init-db printed
    paid_a: stripe.Event  # pi_a's credit, as that release applied it


def _upgraded_from_before_movements(make_app, config, db):
    """db as the release before movements made it, with its data made by its own apply_event (credits, a running
    total, a payment announced by two events), then init-db once."""
    fresh = _catalog(db)
    _created_by_the_release_before_movements(db)
    paid_a, paid_b = intent_succeeded("pi_a", user=ALICE, cents=300), intent_succeeded("pi_b", user=BOB, cents=500)
    twice = [intent_succeeded("pi_c", user=ALICE, cents=40) for _ in range(2)]
    old = [(paid_a, "credit", "pi_a", 300, ALICE), (paid_b, "credit", "pi_b", 500, BOB),
           (charge_refunded("pi_b", 200, cents=500), "refund", "pi_b", 200, None),
           *((evt, "credit", "pi_c", 40, ALICE) for evt in twice)]
    assert [_applied_by_the_release_before_movements(db, *delivery)[::3] for delivery in old] == [
        ("processed", "credit"), ("processed", "credit"), ("processed", "refund"), ("processed", "credit"),
        ("duplicate", "payment_duplicate")]
    balances = {user: balance(db, user) for user in OPENING}
    assert balances == {ALICE: 1000 + 300 + 40, BOB: 500 - 200}
    app = make_app(config)
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    return UpgradedFromBeforeMovements(app, fresh, balances, result.output, paid_a)


def test_schema_upgrades_a_database_of_the_release_before_movements(make_app, config, db):
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    assert upgraded.output == "".join(f"{line}\n" for line in [*APPLIED_SINCE_MOVEMENTS,
                                                        "recomputed the effects of 5 stored events"])
    assert _recorded(db) == [(name, name in SINCE_MOVEMENTS) for name in MIGRATIONS]
    assert _differences(db, upgraded.fresh) == []


def test_the_upgrade_from_the_release_before_movements_keeps_its_balances(make_app, config, db):
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    assert {user: balance(db, user) for user in OPENING} == upgraded.balances
    assert db.execute("SELECT payment_id, refunded_cents, debited_cents FROM payments ORDER BY payment_id"
                      ).fetchall() == [("pi_a", 0, 0), ("pi_b", 200, 200), ("pi_c", 0, 0)]
    verified = upgraded.app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0 and "ledger consistent" in verified.output, verified.output


def test_schema_applies_twice_to_a_database_of_the_release_before_movements(make_app, config, db):
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    result = upgraded.app.test_cli_runner().invoke(args=["init-db"])  # the documented upgrade step, safe to run twice
    assert (result.exit_code, result.output) == (0, "schema up to date: no migration to apply\n")
    assert _recorded(db) == [(name, name in SINCE_MOVEMENTS) for name in MIGRATIONS]


def test_after_the_upgrade_from_before_movements_an_old_event_is_a_duplicate(make_app, config, db):
    """Its effect was recomputed by init-db."""
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    assert send_stripe(_stripe_client(make_app, config), upgraded.paid_a).json["status"] == "duplicate"


def test_after_the_upgrade_from_before_movements_a_refund_object_on_an_old_payment_moves_once_per_state(
        make_app, config, db):
    """Taken once, then given back once when it failed."""
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    client = _stripe_client(make_app, config)
    for evt in (refund("re_a", "pi_a", 120), refund("re_a", "pi_a", 120, "failed")):
        assert send_stripe(client, evt).json["status"] == "processed"
        assert send_stripe(client, evt).json["status"] == "duplicate"
    assert db.execute("SELECT kind, movement_id, amount_cents FROM ledger_journal WHERE payment_id = 'pi_a'"
                      " ORDER BY id").fetchall() == [("credit", None, 300), ("refund", "re_a", -120),
                                                      ("refund_reversed", "re_a", 120)]
    assert balance(db, ALICE) == upgraded.balances[ALICE]


def _credited_by_an_old_host_during_the_upgrade(db):
    """A credit applied twice by the previous release's call, as a host of it still serving during the rolling
    upgrade applies it; the event and its two outcomes."""
    paid_d = intent_succeeded("pi_d", user=BOB, cents=70)
    return paid_d, [_applied_by_the_release_before_movements(db, paid_d, "credit", "pi_d", 70, BOB)[0]
                    for _ in range(2)]


def test_an_old_hosts_credit_during_the_upgrade_from_before_movements_is_applied_once(make_app, config, db):
    upgraded = _upgraded_from_before_movements(make_app, config, db)
    assert _credited_by_an_old_host_during_the_upgrade(db)[1] == ["processed", "duplicate"]
    assert balance(db, BOB) == upgraded.balances[BOB] + 70
    assert_ledger_consistent(db)


def test_the_init_db_after_an_old_hosts_credit_recomputes_its_effect(make_app, config, db):
    """The old host's row says which rule hashed its effect, so that the next init-db recomputes it."""
    app = _upgraded_from_before_movements(make_app, config, db).app
    paid_d, _ = _credited_by_an_old_host_during_the_upgrade(db)
    assert db.execute("SELECT effect_version FROM webhook_events WHERE event_id = %s", [paid_d.id]).fetchone() == (2,)
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert "recomputed the effects of 1 stored events" in result.output, result.output
    assert send_stripe(_stripe_client(make_app, config), paid_d).json["status"] == "duplicate"
    assert_ledger_consistent(db)


def _before_movements_with_types_it_did_not_know(db):
    """db as the release before movements made it: pi_b paid and refunded by running total, then four events of
    types it did not know, recorded as moving nothing. Returns those four."""
    _created_by_the_release_before_movements(db)
    paid = intent_succeeded("pi_b", user=BOB, cents=500)
    assert _applied_by_the_release_before_movements(db, paid, "credit", "pi_b", 500, BOB)[0] == "processed"
    assert _applied_by_the_release_before_movements(db, charge_refunded("pi_b", 200, cents=500), "refund", "pi_b",
                                                    200)[0] == "processed"
    # Types it did not know: recorded, completed, nothing moved. re_b is the refund its total counted; re_c
    # one that failed; du_b a dispute whose funds were withdrawn.
    unknown = [refund("re_b", "pi_b", 200, event_type="refund.created"), dispute("du_b", "pi_b", 150),
               refund("re_c", "pi_b", 100, event_type="refund.created"), refund("re_c", "pi_b", 100, "failed")]
    assert [_applied_by_the_release_before_movements(db, evt)[::3] for evt in unknown] == [("processed", None)] * 4
    assert balance(db, BOB) == 500 - 200
    return unknown


def _stored_late_by_an_old_host_then_init_db(app, db):
    """A refund that a host of the previous release, still serving during the rolling upgrade, stores as moving
    nothing; then init-db. The refund and what init-db printed."""
    late = refund("re_d", "pi_b", 50, event_type="refund.created")
    assert _applied_by_the_release_before_movements(db, late)[::3] == ("processed", None)
    return late, app.test_cli_runner().invoke(args=["init-db"]).output


def test_init_db_moves_once_the_refunds_and_disputes_the_release_before_movements_stored_as_moving_nothing(
        make_app, config, db):
    unknown = _before_movements_with_types_it_did_not_know(db)
    app = make_app(config)
    first = app.test_cli_runner().invoke(args=["init-db"])
    assert first.exit_code == 0, first.output
    assert first.output.splitlines() == [
        *APPLIED_SINCE_MOVEMENTS, "recomputed the effects of 6 stored events",
        "replayed 4 events an earlier release stored without moving their money:",
        *(f"  {evt.id}: processed; now completed" for evt in unknown)]
    # Due: re_b (which the total already took) + du_b; re_c came back. 200 + 150, once.
    assert balance(db, BOB) == 500 - 350
    assert db.execute("SELECT kind, movement_id, amount_cents, state FROM movements ORDER BY movement_id"
                      ).fetchall() == [("dispute", "du_b", 150, "applied"), ("refund", "re_b", 200, "applied"),
                                       ("refund", "re_c", 100, "reversed")]
    second = app.test_cli_runner().invoke(args=["init-db"])
    assert (second.exit_code, second.output) == (0, "schema up to date: no migration to apply\n")
    assert balance(db, BOB) == 500 - 350


def test_the_init_db_after_an_old_host_stored_a_refund_as_moving_nothing_moves_it(make_app, config, db):
    _before_movements_with_types_it_did_not_know(db)
    app = make_app(config)
    _init_db(app)
    late, output = _stored_late_by_an_old_host_then_init_db(app, db)
    assert output.splitlines()[-2:] == [
        "replayed 1 events an earlier release stored without moving their money:",
        f"  {late.id}: processed; now completed"], output
    assert balance(db, BOB) == 500 - 400
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output


def test_redeliveries_of_the_events_init_db_moved_for_the_release_before_movements_are_duplicates(
        make_app, config, db):
    unknown = _before_movements_with_types_it_did_not_know(db)
    app = make_app(config)
    _init_db(app)
    late, _ = _stored_late_by_an_old_host_then_init_db(app, db)
    client = _stripe_client(make_app, config)
    assert [send_stripe(client, evt).json["status"] for evt in [*unknown, late]] == ["duplicate"] * 5
    assert balance(db, BOB) == 500 - 400
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output
    assert_ledger_consistent(db)


# -- what an earlier release credited that today's rule cannot file as its event says ---------------------------

def _stored_by_the_first_release(db, event, credited_cents, user=ALICE):
    """An event as the first release stored it (its jsonb copy alone: no bytes, no source, no effect), credited."""
    text = json.dumps(event)
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256, completed_at)"
               " VALUES (%s, %s, 'completed', %s, %s, now())",
               [event["id"], event["type"], text, hashlib.sha256(text.encode()).digest()])
    db.execute("INSERT INTO ledger_credits (event_id, user_id, amount_cents) VALUES (%s, %s, %s)",
               [event["id"], user, credited_cents])
    db.execute("UPDATE user_balances SET balance_cents = balance_cents + %s WHERE user_id = %s", [credited_cents, user])


# The releases whose credits migration 002 files under a payment: the schema each made, and how each stored an
# event that it credited.
CREDITED_BY = {"first": (BEFORE_SOURCES, _stored_by_the_first_release),
               "before_payments": (BEFORE_PAYMENTS, _stored_before_payments)}


def _credited_by(db, release, *credits):
    """db as release made it, with its users and each (event, cents, user) stored and credited as it did."""
    schema, stored = CREDITED_BY[release]
    _created_by(db, schema)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s), (%s, %s)",
               [value for user in OPENING.items() for value in user])
    for event, cents, user in credits:
        stored(db, event, cents, user)


def _init_db(app):
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return result.output.splitlines()


SET_ASIDE = "set aside {} credits of an earlier release that cannot be filed as their events say; each stays credited:"


@pytest.mark.parametrize("release", CREDITED_BY)
def test_a_stripe_payment_whose_event_was_purged_before_the_upgrade_is_named_then_refunded(
        make_app, config, db, release):
    _credited_by(db, release, (_intent_event("evt_purged", "pi_purged", 300), 300, BOB))
    db.execute("DELETE FROM webhook_events WHERE event_id = 'evt_purged'")  # `flask events purge`, 35 days later
    app = make_app(config)
    credited_at = db.execute("SELECT created_at FROM ledger_credits").fetchone()[0].astimezone(UTC)
    assert _init_db(app)[-2:] == [SET_ASIDE.format(1), (
        f"  evt_purged: its event was purged before the upgrade: 300 cents to {BOB} on {credited_at:%Y-%m-%d} stay"
        " credited, as payment 'evt_purged', its event id; if its provider refunds it by another id (a Stripe"
        " PaymentIntent), find that id and run: flask ledger name-payment evt_purged PAYMENT_ID")]
    assert db.execute("SELECT payment_id, event_id FROM payments").fetchall() == [("evt_purged", "evt_purged")]

    # Its refund, by the PaymentIntent's id: a payment the ledger does not know, until it is named.
    client = _stripe_client(make_app, config)
    refunded = charge_refunded("pi_purged", 100, cents=300)
    answer = send_stripe(client, refunded)
    assert (answer.status, answer.json["message"]) == (422, "unknown payment pi_purged")
    runner = app.test_cli_runner()
    listed = runner.invoke(args=["ledger", "legacy-payments"])
    assert listed.exit_code == 0, listed.output
    assert [line.split() for line in listed.output.splitlines()] == [
        "SOURCE EVENT ID USER CENTS CURRENCY CREDITED (UTC) WHY".split(),
        ["default", "evt_purged", str(BOB), "300", "usd", f"{credited_at:%Y-%m-%d}", f"{credited_at:%H:%M:%SZ}",
         *"its event was purged before the upgrade".split()],
        ("1 payments of an earlier release are filed under their event id: name each that its provider refunds by"
         " another id: flask ledger name-payment EVENT_ID PAYMENT_ID [--source NAME]").split(),
        "failed events waiting for a payment the ledger does not know:".split(),
        "SOURCE EVENT ID TYPE RECEIVED (UTC) LAST ERROR".split(),
        ["default", refunded.id, "charge.refunded", *_utc_words(db, refunded.id), "unknown", "payment", "pi_purged"]]

    named = runner.invoke(args=["ledger", "name-payment", "evt_purged", "pi_purged"])
    assert (named.exit_code, named.output.splitlines()) == (0, [
        f"payment 'evt_purged' (300 cents to {BOB}, credited by event 'evt_purged') is now payment 'pi_purged'",
        "replayed 1 failed events that waited for payment 'pi_purged':",
        f"  {refunded.id}: processed; now completed"]), named.output
    assert balance(db, BOB) == 300 - 100
    assert db.execute("SELECT payment_id, event_id FROM payments").fetchall() == [("pi_purged", "evt_purged")]
    assert db.execute("SELECT event_id, kind, payment_id FROM ledger_journal ORDER BY id").fetchall() == [
        ("evt_purged", "credit", "pi_purged"), (refunded.id, "refund", "pi_purged")]
    # Its later movements find it, and the same refund again is a duplicate.
    assert send_stripe(client, dispute("du_purged", "pi_purged", 50)).json["status"] == "processed"
    assert send_stripe(client, refunded).json["status"] == "duplicate"
    assert balance(db, BOB) == 300 - 150
    again = runner.invoke(args=["ledger", "name-payment", "evt_purged", "pi_purged"])
    assert (again.exit_code, again.output) == (
        1, "Error: no payment of source 'default' is filed under the id of event 'evt_purged'\n")
    verified = runner.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output
    assert runner.invoke(args=["ledger", "legacy-payments"]).output == \
        "no payment of an earlier release is filed under its event id\n"


def _utc_words(db, event_id):
    received = db.execute("SELECT created_at FROM webhook_events WHERE event_id = %s", [event_id]).fetchone()[0]
    return received.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ").split()


def _payment_event(**data):
    """payment.succeeded of 5 cents to ALICE, its data's other fields as given (None: JSON null)."""
    return {"id": "evt_odd", "type": "payment.succeeded", "data": {"userId": str(ALICE), "amountCents": 5, **data}}


NOT_AN_ID = "is not a payment id of 1 to 128 characters"
NOT_A_CODE = "is not a currency code"
# What an earlier release accepted and today's rule refuses: the release, its event, why it is set aside, the payment
# and currency it is filed under. The first release read neither data.paymentId nor a currency; the release before
# payments checked the currency, not the payment id.
ODD_VALUES = [
    ("first", _payment_event(paymentId=""), f'data.paymentId "" {NOT_AN_ID}', "evt_odd", "usd"),
    ("first", _payment_event(paymentId="p" * 129), f'data.paymentId "{"p" * 24}..." (129 characters) {NOT_AN_ID}',
     "evt_odd", "usd"),
    ("first", _payment_event(paymentId=42), f"data.paymentId 42 {NOT_AN_ID}", "evt_odd", "usd"),
    ("first", _payment_event(paymentId=None), f"data.paymentId null {NOT_AN_ID}", "evt_odd", "usd"),
    ("first", _payment_event(paymentId="pay_odd", currency="US$"), f'data.currency "US$" {NOT_A_CODE}', "pay_odd",
     "usd"),
    ("first", _payment_event(paymentId="pay_odd", currency=840), f"data.currency 840 {NOT_A_CODE}", "pay_odd", "usd"),
    ("first", _payment_event(currency=None), f"data.currency null {NOT_A_CODE}", "evt_odd", "usd"),
    ("first", _payment_event(paymentId="", currency="EUR"), f'data.paymentId "" {NOT_AN_ID}', "evt_odd", "eur"),
    ("first", _payment_event(paymentId={"id": 1}, currency="$"),
     f'data.paymentId {{"id": 1}} {NOT_AN_ID}; data.currency "$" {NOT_A_CODE}', "evt_odd", "usd"),
    ("first", {**_intent_event("evt_odd", "", 5), "data": {"object": {
        "id": "", "amount_received": 5, "currency": "usd", "metadata": {"user_id": str(ALICE)}}}},
     f'data.object.id "" {NOT_AN_ID}', "evt_odd", "usd"),
    ("before_payments", _payment_event(paymentId=""), f'data.paymentId "" {NOT_AN_ID}', "evt_odd", "usd"),
    ("before_payments", _payment_event(paymentId="p" * 200, currency="USD"),
     f'data.paymentId "{"p" * 24}..." (200 characters) {NOT_AN_ID}', "evt_odd", "usd"),
]


@pytest.mark.parametrize("release, event, why, filed, currency", ODD_VALUES,
                         ids=[f"{release}-{why.split(' is not')[0]}" for release, _, why, *_ in ODD_VALUES])
def test_each_value_an_earlier_release_accepted_is_upgraded_or_set_aside_with_one_line(
        make_app, config, db, release, event, why, filed, currency):
    fresh = _catalog(db)
    _credited_by(db, release, (event, 5, ALICE))
    app = make_app(config)
    lines = _init_db(app)
    assert lines[lines.index(SET_ASIDE.format(1)) + 1:][0].startswith(f"  evt_odd: {why}: 5 cents to {ALICE} on ")
    assert lines[-2] == SET_ASIDE.format(1), lines
    assert _differences(db, fresh) == []
    # The money stays where it was: in the balance and the journal, under a payment the ledger can hold.
    assert balance(db, ALICE) == 1005
    assert db.execute("SELECT event_id, kind, payment_id, amount_cents FROM ledger_journal").fetchall() == [
        ("evt_odd", "credit", filed, 5)]
    assert db.execute("SELECT payment_id, currency, event_id FROM payments").fetchall() == [
        (filed, currency, "evt_odd")]
    # The event's row, set aside as it was stored: no rule reads it again, and its re-delivery is a duplicate.
    assert db.execute("SELECT event_type, payload = %s::jsonb FROM legacy_set_aside WHERE event_id = 'evt_odd'",
                      [json.dumps(event)]).fetchall() == [(event["type"], True)]
    assert event_rows(db) == 0
    assert send(app.test_client(), event).json == {"status": "duplicate", "event_id": "evt_odd"}
    runner = app.test_cli_runner()
    verified = runner.invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output
    listed = runner.invoke(args=["ledger", "legacy-payments"]).output
    assert (["default", "evt_odd", str(ALICE), "5"] in [line.split()[:4] for line in listed.splitlines()]) == \
        (filed == "evt_odd"), listed
    if currency == "usd":  # a refund that names the payment as it is filed takes its money back
        refunded = {"id": "evt_odd_refunded", "type": "payment.refunded",
                    "data": {"paymentId": filed, "amountRefundedCents": 2}}
        assert send(app.test_client(), refunded).json["status"] == "processed"
        assert balance(db, ALICE) == 1003
    assert _init_db(app) == ["schema up to date: no migration to apply"]


def _a_payment_credited_twice_by_the_first_release_then_init_db(make_app, config, db):
    """The first release credited both: one payment announced twice, or two that its sender named alike; the second
    event's currency is one today's rule refuses. What init-db printed."""
    _credited_by(db, "first", ({**_payment_event(paymentId="pay_same"), "id": "evt_1"}, 5, ALICE),
                 ({**_payment_event(paymentId="pay_same", currency="US$"), "id": "evt_2"}, 7, ALICE))
    return _init_db(make_app(config))


def test_a_set_aside_credit_whose_payment_id_is_taken_stays_under_its_event_id(make_app, config, db):
    _a_payment_credited_twice_by_the_first_release_then_init_db(make_app, config, db)
    assert db.execute("SELECT payment_id, event_id FROM payments ORDER BY event_id").fetchall() == [
        ("pay_same", "evt_1"), ("evt_2", "evt_2")]
    assert balance(db, ALICE) == 1000 + 5 + 7


def test_init_db_says_why_a_set_aside_credit_is_not_filed_under_its_taken_payment_id(make_app, config, db):
    lines = _a_payment_credited_twice_by_the_first_release_then_init_db(make_app, config, db)
    assert lines[-2:] == [SET_ASIDE.format(1), (
        f'  evt_2: data.currency "US$" {NOT_A_CODE}: 7 cents to {ALICE} on {lines[-1].split(" on ")[1][:10]} stay'
        " credited, as payment 'evt_2', its event id, in usd, the ledger's currency; not filed as 'pay_same': payment"
        " 'pay_same' of source 'default' exists already, credited by event 'evt_1'; if both events are that one"
        " payment, its user was credited twice")]


def _init_db_after_a_refund_waited_for_a_set_aside_credit(make_app, config, db):
    """The migrations committed, init-db stopped before it filed what they set aside, and a refund of that credit
    came meanwhile; then init-db. What it printed."""
    _credited_by(db, "first", (_payment_event(paymentId="pay_odd", currency="US$"), 5, ALICE))
    apply_schema(db)
    app = make_app(config)
    waiting = send(app.test_client(), {"id": "evt_odd_refunded", "type": "payment.refunded",
                                       "data": {"paymentId": "pay_odd", "amountRefundedCents": 2}})
    assert (waiting.status, waiting.json["message"]) == (422, "unknown payment pay_odd")
    return _init_db(app)


def test_init_db_files_a_credit_set_aside_by_migrations_that_committed_without_it(make_app, config, db):
    lines = _init_db_after_a_refund_waited_for_a_set_aside_credit(make_app, config, db)
    assert lines[0] == "schema up to date: no migration to apply"
    assert lines[1] == SET_ASIDE.format(1) and lines[2].startswith(f'  evt_odd: data.currency "US$" {NOT_A_CODE}')


def test_init_db_replays_the_refund_that_waited_for_a_set_aside_credit(make_app, config, db):
    lines = _init_db_after_a_refund_waited_for_a_set_aside_credit(make_app, config, db)
    assert lines[3:] == ["replayed 1 failed events that waited for payment 'pay_odd':",
                         "  evt_odd_refunded: processed; now completed"]
    assert balance(db, ALICE) == 1003


def test_a_payment_intent_the_first_release_credited_in_eur_is_refunded_in_eur(make_app, config, db):
    _credited_by(db, "first", (_intent_event("evt_eur", "pi_eur", 300, currency="eur"), 300, BOB))
    _init_db(make_app(config))
    assert db.execute("SELECT payment_id, currency FROM payments").fetchall() == [("pi_eur", "eur")]
    answer = send_stripe(_stripe_client(make_app, config), charge_refunded("pi_eur", 100, currency="eur", cents=300))
    assert answer.json["status"] == "processed", answer.json
    assert balance(db, BOB) == 300 - 100


@pytest.mark.parametrize("column, value", [("event_id", ""), ("event_id", "e" * 129),
                                           ("event_type", "t" * 65), ("status", "done")])
def test_schema_checks_lengths_and_statuses(db, column, value):
    row = {"event_id": "e", "event_type": "t", "status": "completed", column: value}
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256) "
                   "VALUES (%(event_id)s, %(event_type)s, %(status)s, '{}', sha256(''))", row)


INSERT_JOURNAL = ("INSERT INTO ledger_journal (kind, amount_cents, source, event_id, payment_id, movement_id,"
                  " reference, reason, actor, user_id) VALUES (%(kind)s, %(amount_cents)s, %(source)s, %(event_id)s,"
                  " %(payment_id)s, %(movement_id)s, %(reference)s, %(reason)s, %(actor)s, %(user_id)s)")
ADJUSTMENT = {"kind": "adjustment", "amount_cents": -5, "source": None, "event_id": None, "payment_id": None,
              "movement_id": None, "reference": None, "reason": "why", "actor": "who", "user_id": ALICE}
SPEND = {**ADJUSTMENT, "kind": "spend", "reason": None, "actor": None, "reference": "order-1"}


@pytest.mark.parametrize("row", [
    {**ADJUSTMENT, "amount_cents": 0},
    {**ADJUSTMENT, "reason": None},
    {**ADJUSTMENT, "reason": " \n"},
    {**ADJUSTMENT, "actor": None},
    {**ADJUSTMENT, "event_id": "evt_1", "source": "default"},
    {**ADJUSTMENT, "payment_id": "pay_1"},  # a payment is named with its source
    {**ADJUSTMENT, "reference": "order-1"},
    {**SPEND, "amount_cents": 5},
    {**SPEND, "reference": None},
    {**SPEND, "reference": "r" * 129},
    {**SPEND, "source": "default", "payment_id": "pay_1"},
    {**SPEND, "reason": "why"},
    {**ADJUSTMENT, "kind": "credit", "amount_cents": 5},  # an event's row names its event and payment
], ids=["adjustment-of-0", "adjustment-without-reason", "adjustment-with-a-blank-reason", "adjustment-by-nobody",
        "adjustment-of-an-event", "adjustment-of-a-payment-without-source", "adjustment-with-a-reference",
        "spend-that-credits", "spend-without-reference", "spend-with-a-long-reference", "spend-of-a-payment",
        "spend-with-a-reason", "credit-of-no-event"])
def test_the_journal_refuses_a_row_that_does_not_say_what_made_it(db, row):
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(INSERT_JOURNAL, row)


def test_a_spends_reference_is_unique_by_construction(db):
    db.execute(INSERT_JOURNAL, SPEND)
    db.execute(INSERT_JOURNAL, {**ADJUSTMENT, "amount_cents": 5})  # adjustments have no reference
    db.execute(INSERT_JOURNAL, {**ADJUSTMENT, "amount_cents": 5})
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(INSERT_JOURNAL, {**SPEND, "user_id": BOB})


# Every way a database reached a release from before schema_migrations: created by it, or created by an
# earlier one and upgraded in place by its schema.sql; and the migrations its schema had already. It gets the others,
# in order: 001a too on a database that had 002 (there 001a only creates its table).
HAD_SOURCES = ["001_sources.sql"]
HAD_PAYMENTS = ["001_sources.sql", "002_payments.sql"]
HISTORIES = [
    ([BEFORE_SOURCES], []),
    ([BEFORE_PAYMENTS], HAD_SOURCES),
    ([BEFORE_SOURCES, BEFORE_PAYMENTS], HAD_SOURCES),
    ([BEFORE_MIGRATIONS], HAD_PAYMENTS),
    ([BEFORE_SOURCES, BEFORE_MIGRATIONS], HAD_PAYMENTS),
    ([BEFORE_PAYMENTS, BEFORE_MIGRATIONS], HAD_PAYMENTS),
    ([BEFORE_SOURCES, BEFORE_PAYMENTS, BEFORE_MIGRATIONS], HAD_PAYMENTS),
]


@pytest.mark.parametrize("history, had", HISTORIES,
                         ids=["-".join(path.stem.removeprefix("schema_") for path in h) for h, _ in HISTORIES])
def test_a_database_of_any_earlier_release_is_recorded_at_it_then_migrated_to_the_fresh_schema(db, history, had):
    fresh = _catalog(db)
    _created_by(db, history[0])
    for release in history[1:]:
        db.execute(release.read_text())
    assert apply_schema(db) == (False, [name for name in MIGRATIONS if name not in had])
    assert _recorded(db) == [(name, name not in had) for name in MIGRATIONS]
    assert _differences(db, fresh) == []
    assert apply_schema(db) == (False, [])


def _init_db_in_an_empty_database(app, db):
    """init-db once in db emptied of every object; the fresh schema's catalog and what init-db answered."""
    fresh = _catalog(db)
    _drop_schema(db)
    db.execute("DROP FUNCTION user_balances_set_opening CASCADE")
    return fresh, app.test_cli_runner().invoke(args=["init-db"])


def _migrations_recorded(db):
    return db.cursor(row_factory=namedtuple_row).execute(
        "SELECT name, sha256, ran, applied_at FROM schema_migrations ORDER BY name").fetchall()


def test_init_db_creates_the_schema_in_an_empty_database(app, db):
    fresh, first = _init_db_in_an_empty_database(app, db)
    assert first.exit_code == 0, first.output
    assert first.output == f"created the schema from {DEFAULT_SCHEMA_PATH}\n"
    assert _differences(db, fresh) == []
    assert [(row.name, row.ran) for row in _migrations_recorded(db)] == [(name, False) for name in MIGRATIONS]


def test_init_db_a_second_time_changes_nothing(app, db):
    fresh, _ = _init_db_in_an_empty_database(app, db)
    recorded = _migrations_recorded(db)
    second = app.test_cli_runner().invoke(args=["init-db"])
    assert (second.exit_code, second.output) == (0, "schema up to date: no migration to apply\n")
    assert _migrations_recorded(db) == recorded
    assert _differences(db, fresh) == []


def test_two_init_dbs_at_once_apply_each_migration_once(db):
    """As two hosts deploying together: both wait for the advisory lock, one migrates, the other finds it done."""
    fresh = _catalog(db)
    _created_by(db, BEFORE_SOURCES)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 5)", [ALICE])
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload, payload_sha256, completed_at)"
               " VALUES ('evt_old', 'payment.succeeded', 'completed', %s, sha256(''), now())",
               [json.dumps(payment("evt_old", cents=5, paymentId=None))])
    db.execute("INSERT INTO ledger_credits (event_id, user_id, amount_cents) VALUES ('evt_old', %s, 5)", [ALICE])
    results, errors = [], []

    def init_db():
        try:
            with psycopg.connect(db_url(db), autocommit=True) as conn:
                results.append(apply_schema(conn))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with psycopg.connect(db_url(db)) as holder:  # holds init-db's lock until both wait for it
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        threads = [threading.Thread(target=init_db) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                      " AND NOT granted").fetchone()[0] == 2, timeout=10, what="two waiting init-dbs")
        holder.rollback()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert sorted(results) == [(False, []), (False, MIGRATIONS)]
    assert _recorded(db) == [(name, True) for name in MIGRATIONS]
    assert db.execute("SELECT payment_id, amount_cents FROM payments").fetchall() == [("evt_old", 5)]
    assert db.execute("SELECT event_id, kind FROM ledger_journal").fetchall() == [("evt_old", "credit")]
    assert _differences(db, fresh) == []


def _schema_copy(tmp_path):
    """schema.sql, money.sql and migrations/ in tmp_path, to change."""
    shutil.copy(DEFAULT_SCHEMA_PATH, tmp_path / "schema.sql")
    shutil.copy(DEFAULT_SCHEMA_PATH.parent / "money.sql", tmp_path / "money.sql")
    shutil.copytree(DEFAULT_SCHEMA_PATH.parent / "migrations", tmp_path / "migrations")
    return tmp_path / "schema.sql"


def _with_a_changed_migration(tmp_path):
    """A copy of the schema whose last migration was edited after its release, and with a new one after it."""
    schema = _schema_copy(tmp_path)
    changed = tmp_path / "migrations" / MIGRATIONS[-1]
    changed.write_text(changed.read_text() + "-- edited after its release\n")
    (tmp_path / "migrations" / "999_later.sql").write_text("CREATE TABLE later (id int);\n")
    return schema


def test_a_migration_changed_since_it_was_applied_stops_init_db(db, tmp_path):
    with pytest.raises(SchemaError, match=f"migrations changed since they were applied: {MIGRATIONS[-1]}"):
        apply_schema(db, _with_a_changed_migration(tmp_path))


def test_init_db_stopped_by_a_changed_migration_changes_nothing(db, tmp_path):
    with pytest.raises(SchemaError):
        apply_schema(db, _with_a_changed_migration(tmp_path))
    assert db.execute("SELECT to_regclass('later')").fetchone()[0] is None
    assert _recorded(db) == [(name, False) for name in MIGRATIONS]


def test_a_database_newer_than_the_release_stops_init_db(app, db):
    db.execute("INSERT INTO schema_migrations (name, sha256, ran) VALUES ('999_later.sql', sha256(''), true)")
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 1
    assert "the database has migrations that this release has not: 999_later.sql" in result.output


def test_a_new_migration_runs_once_in_order(db, tmp_path):
    schema = _schema_copy(tmp_path)
    (tmp_path / "migrations" / "998_first.sql").write_text("CREATE TABLE later (id int);\n")
    (tmp_path / "migrations" / "999_second.sql").write_text("INSERT INTO later VALUES (1);\n")
    assert apply_schema(db, schema) == (False, ["998_first.sql", "999_second.sql"])
    assert apply_schema(db, schema) == (False, [])
    assert db.execute("SELECT * FROM later").fetchall() == [(1,)]


# -- settings that hold through a transaction pooler (PgBouncer) --------------

def _settings(conn):
    """The session's three timeouts, by name."""
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT current_setting('lock_timeout') AS lock_timeout,"
        " current_setting('statement_timeout') AS statement_timeout,"
        " current_setting('idle_in_transaction_session_timeout') AS idle").fetchone()


def test_timeouts_hold_inside_each_transaction(app):
    pool = get_pool(app)
    with transaction(pool) as conn:
        # From PG_LOCK_TIMEOUT_MS, PG_STATEMENT_TIMEOUT_MS and LOCK_TTL_MS.
        assert _settings(conn) == {"lock_timeout": "1s", "statement_timeout": "2s", "idle": "10s"}
        assert conn.info.transaction_status == TransactionStatus.INTRANS
    with transaction(pool, read_only=True, statement_timeout=0) as conn:
        assert _settings(conn) == {"lock_timeout": "1s", "statement_timeout": "0", "idle": "10s"}
        assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
        assert conn.execute("SHOW transaction_read_only").fetchone()[0] == "on"


def test_timeouts_end_with_their_transaction(app):
    pool = get_pool(app)
    with transaction(pool):
        pass
    with pool.connection() as conn:  # the same session afterwards: nothing left behind for the next client
        assert _settings(conn) == {"lock_timeout": "0", "statement_timeout": "0", "idle": "0"}


def test_the_ledger_transaction_runs_with_the_timeouts(make_app, config, db):
    """Seen from inside the app's own transaction, by a trigger on its INSERT."""
    db.execute("""
        CREATE TABLE seen (lock_timeout text, statement_timeout text, idle text);
        CREATE FUNCTION note_settings() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO seen VALUES (current_setting('lock_timeout'), current_setting('statement_timeout'),
                                     current_setting('idle_in_transaction_session_timeout'));
            RETURN NEW; END $$;
        CREATE TRIGGER note_settings AFTER INSERT ON webhook_events FOR EACH ROW EXECUTE FUNCTION note_settings();
    """)
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 1234, "PG_STATEMENT_TIMEOUT_MS": 2345,
                       "LOCK_TTL_MS": 6789}).test_client()
    assert send(client, payment("evt_settings")).json["status"] == "processed"
    assert db.cursor(row_factory=dict_row).execute("SELECT * FROM seen").fetchall() == [
        {"lock_timeout": "1234ms", "statement_timeout": "2345ms", "idle": "6789ms"}]


def test_a_session_never_gets_the_timeouts_as_a_startup_option(app):
    """PgBouncer refuses the `options` startup parameter; the app sends none."""
    pool = get_pool(app)
    with pool.connection() as conn:
        assert "options" not in conn.info.get_parameters()
        assert conn.execute("SELECT setting FROM pg_settings WHERE name = 'lock_timeout'").fetchone()[0] == "0"


def _prepared_statements_after_deliveries(make_app, config, threshold):
    app = make_app({**config, "PG_POOL_SIZE": 1, "PG_PREPARE_THRESHOLD": threshold})
    client = app.test_client()
    pool = get_pool(app)
    for n in range(8):  # past psycopg's default threshold (5)
        assert send(client, payment(f"evt_prepare_{threshold}_{n}")).json["status"] == "processed"
        with transaction(pool) as conn:  # a parameterised statement, as the CLI's and replay's are
            conn.execute("SELECT count(*) FROM webhook_events WHERE source = %s", ["default"])
    with pool.connection() as conn:  # the pool's one connection, which ran them
        return conn.execute("SELECT name FROM pg_prepared_statements").fetchall()


def test_prepare_threshold_off_prepares_nothing(make_app, config, db):
    assert _prepared_statements_after_deliveries(make_app, config, "off") == []
    # The default prepares the repeated parameterised statement, never a delivery's (one simple query).
    assert len(_prepared_statements_after_deliveries(make_app, config, "5")) == 1


def test_every_connection_has_tcp_keepalives_and_a_user_timeout(app):
    with get_pool(app).connection() as conn:
        params = conn.info.get_parameters()
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))  # what libpq set on the socket itself
        try:
            applied = (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        finally:
            sock.close()  # the duplicate descriptor only
    assert {name: params[name] for name in TCP_SETTINGS} == {name: str(v) for name, v in TCP_SETTINGS.items()}
    assert applied == (1, 5, 2, 3, 11000)


def test_database_url_parameters_override_the_tcp_defaults(make_app, config):
    app = make_app({**config, "DATABASE_URL": config["DATABASE_URL"] + "?keepalives_idle=30&tcp_user_timeout=60000"})
    with get_pool(app).connection() as conn:
        params = conn.info.get_parameters()
    assert (params["keepalives_idle"], params["tcp_user_timeout"], params["keepalives_count"]) == ("30", "60000", "3")


def test_connections_killed_while_pooled_cost_no_503(make_app, config, db):
    """As after a server or PgBouncer restart: the pool checks a connection before handing it out."""
    app = make_app({**config, "PG_POOL_SIZE": 2})
    client = app.test_client()
    assert send(client, payment("evt_before_kill")).json["status"] == "processed"
    # With a timeout, pg_terminate_backend returns once the backend has exited (its socket closed), as after a
    # restart; without, it returns when the signal is sent, and a delivery could still catch the backend alive.
    killed = db.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                        " WHERE application_name LIKE 'webhook-ledger:%%'").fetchall()
    assert killed and all(ok for ok, in killed)
    answers = [send(client, payment(f"evt_after_kill_{n}")).status for n in range(3)]
    assert answers == [200, 200, 200]


def test_a_pooled_connection_whose_descriptor_is_past_1024_is_used(make_app, config):
    """select() cannot watch a descriptor >= 1024 (FD_SETSIZE): a host holding many connections has such ones."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 1100
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE's hard limit ({hard}) is under {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    # A socket an earlier test left to the collector, closed later, would free a low descriptor for the pool.
    gc.collect()
    filler = []  # the lowest free descriptor is always the next one: fill up to 1023
    try:
        while len(filler) < needed and (fd := os.open(os.devnull, os.O_RDONLY)) < 1024:
            filler.append(fd)
        os.close(fd)
        app = make_app({**config, "PG_POOL_SIZE": 1})
        answer = send(app.test_client(), payment("evt_high_descriptor"))
        with get_pool(app).connection() as conn:
            assert conn.pgconn.socket >= 1024
        assert (answer.status, answer.json["status"]) == (200, "processed")
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_psycopgs_log_lines_hold_no_value_of_the_database_url(make_app, config, db, caplog):
    """libpq quotes the role, database or host it failed on, and psycopg_pool logs it on every attempt."""
    url = f"postgresql://s3cret-role:s3cret-password@{db.info.host}:{db.info.port}/s3cret-database"
    app = make_app({**config, "DATABASE_URL": url, "PG_POOL_TIMEOUT_MS": 1000})
    with caplog.at_level(logging.INFO, logger="psycopg"):
        assert app.test_client().get("/ready").status_code == 503
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("psycopg")]
    assert any("error connecting" in line and "does not exist" in line for line in lines), lines
    assert [line for line in lines if "s3cret" in line or "\n" in line] == []


def test_the_client_deadline_is_a_backstop_behind_the_statement_timeout(make_app, config):
    """A running server cancels a long statement itself (a clean error); a transaction without a statement
    timeout (`flask ledger verify`'s) is not cut by the client either."""
    pool = get_pool(make_app({**config, "PG_STATEMENT_TIMEOUT_MS": 200, "PG_LOCK_TIMEOUT_MS": 100,
                              "PG_POOL_TIMEOUT_MS": 300}))
    bound = (300 + 200 + MARGIN_MS) / 1000  # a pooler's queue (PG_POOL_TIMEOUT_MS), the statement, the margin
    with pytest.raises(psycopg.errors.QueryCanceled), transaction(pool) as conn:
        conn.execute("SELECT pg_sleep(%s)", [bound + 1])
    with transaction(pool, statement_timeout=0) as conn:
        conn.execute("SELECT pg_sleep(%s)", [bound + 0.3])
    with pool.connection() as conn:
        assert conn.deadline == bound  # the pool's again


AT_007 = Path(__file__).parent / "data" / "schema_at_007.sql"  # schema.sql as the release of 007 shipped it


def _migrated_from_007(db):
    """db as the release of 007 made it, with a user, two events and a payment; then apply_schema.
    The fresh schema's catalog and what apply_schema returned."""
    fresh = _catalog(db)
    _drop_schema(db)
    db.execute("DROP TABLE IF EXISTS customer_links, ignored_payments")
    db.execute(AT_007.read_text())
    db.execute(RECORDS)
    for name in (name for name in MIGRATIONS if name < "008"):
        db.execute(RECORD, [name, hashlib.sha256((DEFAULT_SCHEMA_PATH.parent / "migrations" / name).read_bytes())
                            .digest(), False])
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 1250)", [ALICE])
    db.execute("INSERT INTO webhook_events (event_id, event_type, status, payload_sha256, effect_version, last_error)"
               " VALUES ('evt_done', 'payment.succeeded', 'completed', sha256(''), 4, NULL),"
               " ('evt_failed', 'payment.succeeded', 'failed', sha256(''), 4, 'unknown user')")
    db.execute("INSERT INTO payments (source, payment_id, user_id, amount_cents, currency, event_id)"
               " VALUES ('default', 'pay_1', %s, 250, 'usd', 'evt_done')", [ALICE])
    return fresh, apply_schema(db)


def test_a_database_at_007_is_migrated_to_the_fresh_schema(db):
    fresh, applied = _migrated_from_007(db)
    assert applied == (False, ["008_users_links.sql", "009_writer_cost.sql", "010_fetched.sql"])
    assert _differences(db, fresh) == []
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("UPDATE webhook_events SET status = 'lost' WHERE event_id = 'evt_failed'")


def test_a_database_migrated_from_007_keeps_its_rows(db):
    _migrated_from_007(db)
    assert db.execute("SELECT event_id, status, last_error FROM webhook_events ORDER BY event_id").fetchall() == \
        [("evt_done", "completed", None), ("evt_failed", "failed", "unknown user")]
    assert db.execute("SELECT user_id, customer_id FROM payments").fetchall() == [(ALICE, None)]
    assert db.execute("SELECT balance_cents, opening_balance_cents FROM user_balances").fetchall() == [(1250, 1250)]
