"""app/receiver/errors.py: database errors classified. Transient ones (nothing committed,
a retry succeeds) answer 503 with Retry-After; any other is a bug or a
misconfiguration: 500, its class and SQLSTATE logged, nothing else said."""

import logging
import threading

import psycopg
import psycopg_pool
import pytest
from psycopg import errors

from tests.helpers import ALICE, balance, event_rows, payment, raw_exchange, scrape, send

pytestmark = pytest.mark.core

TRANSIENT = [
    psycopg.OperationalError("connection to server at 127.0.0.1 failed: Connection refused"),
    psycopg_pool.PoolTimeout("couldn't get a connection after 3.00 sec"),
    errors.AdminShutdown("terminating connection due to administrator command"),
    errors.CannotConnectNow("the database system is starting up"),
    errors.ProtocolViolation("server conn crashed?"),  # PgBouncer's own errors are SQLSTATE 08P01
    errors.QueryCanceled("canceling statement due to statement timeout"),
    errors.LockNotAvailable("canceling statement due to lock timeout"),
    errors.SerializationFailure("could not serialize access due to concurrent update"),
    errors.DeadlockDetected("deadlock detected"),
    errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    errors.IdleInTransactionSessionTimeout("terminating connection due to idle-in-transaction timeout"),
]
BUGS = [
    psycopg.ProgrammingError("syntax error"),
    errors.UndefinedTable('relation "webhook_events" does not exist'),
    errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist'),
    errors.InFailedSqlTransaction("current transaction is aborted"),
    psycopg.InterfaceError("the connection is closed"),
    psycopg.IntegrityError("duplicate key value violates unique constraint"),
]


def _raising(make_app, config, exc):
    app = make_app(config)
    app.add_url_rule("/raise", "raise", lambda: (_ for _ in ()).throw(exc))  # the real handlers, a chosen error
    return app.test_client().get("/raise")


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda exc: type(exc).__name__)
def test_transient_database_errors_answer_503_with_retry_after(make_app, config, exc, caplog):
    response = _raising(make_app, config, exc)
    assert (response.status_code, response.json["error"]) == (503, "unavailable")
    assert int(response.headers["Retry-After"]) >= 1
    assert f"database unavailable: {type(exc).__name__}" in caplog.text


@pytest.mark.parametrize("exc", BUGS, ids=lambda exc: type(exc).__name__)
def test_other_database_errors_answer_500_naming_only_their_class(make_app, config, exc, caplog):
    response = _raising(make_app, config, exc)
    assert (response.status_code, response.json) == (500, {"error": "internal"})
    assert f"internal error: {type(exc).__name__}" in caplog.text
    assert str(exc) not in caplog.text  # a database message can quote a row's values


# -- the same, from the real PostgreSQL ----------------------------------------

def _send_without_the_journal(client, db):
    db.execute("DROP TABLE ledger_journal CASCADE")  # and the views that read it
    return send(client, payment("evt_no_table"))


def test_a_missing_table_is_a_500(client, db):
    response = _send_without_the_journal(client, db)
    assert (response.status, response.json) == (500, {"error": "internal"})


def test_a_missing_table_is_logged_with_its_class_and_sqlstate(client, db, caplog):
    _send_without_the_journal(client, db)
    assert "internal error: UndefinedTable (SQLSTATE 42P01) at " in caplog.text


def test_a_missing_table_rolls_the_delivery_back(client, db):
    _send_without_the_journal(client, db)
    assert event_rows(db) == 0


def test_a_statement_timeout_is_a_503_that_commits_nothing(make_app, config, db, caplog):
    """statement_timeout below lock_timeout: the wait ends as QueryCanceled, not LockNotAvailable."""
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 5000, "PG_STATEMENT_TIMEOUT_MS": 300}).test_client()
    with psycopg.connect(config["DATABASE_URL"]) as blocker:
        blocker.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        response = send(client, payment("evt_statement_timeout"))
    assert (response.status, response.json["error"]) == (503, "unavailable")
    assert "database unavailable: QueryCanceled (SQLSTATE 57014)" in caplog.text
    assert event_rows(db) == 0
    assert send(client, payment("evt_statement_timeout")).json["status"] == "processed"


def _terminated_mid_transaction(make_app, config, db):
    """A delivery whose backend is terminated while it waits on a row lock, inside its transaction: the client,
    the event and the delivery's answer."""
    client = make_app({**config, "PG_LOCK_TIMEOUT_MS": 10000, "PG_STATEMENT_TIMEOUT_MS": 15000,
                       "PG_POOL_TIMEOUT_MS": 5000}).test_client()
    event, answer = payment("evt_terminated", cents=30), {}
    with psycopg.connect(config["DATABASE_URL"]) as blocker:
        blocker.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        thread = threading.Thread(target=lambda: answer.update(r=send(client, event)))
        thread.start()
        waiting = []
        for _ in range(100):  # the delivery now waits on the row lock, inside its transaction
            waiting = db.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'webhook-ledger:%%'"
                                 " AND wait_event_type = 'Lock'").fetchall()
            if waiting:
                break
            thread.join(0.05)
        assert len(waiting) == 1
        db.execute("SELECT pg_terminate_backend(%s)", waiting[0])
        thread.join(10)
    return client, event, answer["r"]


def test_a_backend_terminated_mid_transaction_is_a_503(make_app, config, db):
    _, _, response = _terminated_mid_transaction(make_app, config, db)
    assert (response.status, response.json["error"]) == (503, "unavailable")


def test_a_backend_terminated_mid_transaction_is_logged_with_the_servers_reason(make_app, config, db, caplog):
    _terminated_mid_transaction(make_app, config, db)
    # The delivery is one simple query: the server's own reason is what psycopg reports.
    assert "database unavailable: AdminShutdown (SQLSTATE 57P01)" in caplog.text


def test_a_backend_terminated_mid_transaction_commits_nothing(make_app, config, db):
    _terminated_mid_transaction(make_app, config, db)
    assert event_rows(db) == 0


def test_the_retry_of_a_delivery_whose_backend_was_terminated_processes_it(make_app, config, db):
    client, event, _ = _terminated_mid_transaction(make_app, config, db)
    assert send(client, event).json["status"] == "processed"
    assert balance(db) == 1030


@pytest.fixture(autouse=True)
def _capture_app_logs(caplog):
    caplog.set_level(logging.WARNING, logger="app")


# -- a malformed chunked body, read by the real server as the view asks for it ---------

def _chunked(body_bytes):
    return (b"POST /api/webhooks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"X-Signature: 00\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body_bytes)


@pytest.mark.parametrize("body", [
    b"zz\r\n{}\r\n0\r\n\r\n",         # a chunk size that is not hexadecimal
    b"2\r\n{}XX0\r\n\r\n",            # a chunk without its CRLF terminator
    b"2;\x01\r\n{}\r\n0\r\n\r\n",     # a bad chunk extension
], ids=["bad-size", "missing-terminator", "bad-extension"])
def test_a_malformed_chunked_body_is_a_400_not_a_500(gunicorn, db, body):
    server = gunicorn(workers=1, threads=2)
    status, answer = raw_exchange(server.base, _chunked(body))
    assert (status, answer["error"]) == (400, "bad_request"), answer
    assert "chunked" in answer["message"]
    assert event_rows(db) == 0
    scraped = scrape(server.base)
    assert scraped[("webhook_ledger_deliveries_total",
                    (("outcome", "rejected"), ("reason", "bad_request"), ("source", "default")))] == 1
    assert not any(name == "webhook_ledger_deliveries_total" and ("outcome", "error") in labels
                   for name, labels in scraped)
