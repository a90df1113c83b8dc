"""One JSON error shape for every answer that is not a success (docs/design.md, "Answers").
Views raise and ANSWERS maps each exception to its answer; a PostgreSQL outage becomes 503 here and nowhere else."""

import logging
from collections.abc import Mapping
from typing import NamedTuple

import psycopg
from flask import Flask, Response, current_app, jsonify
from gunicorn.http.errors import ParseException as MalformedRequest  # type: ignore[import-untyped]  # no hints
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge, RequestTimeout

from ..core.errors import BudgetSpentError, ProviderUnavailableError
from ..intake.events import InvalidEventError, InvalidJSONError, UnprocessableError
from ..intake.signature import SignatureError
from ..locking.lock import InProgressError
from ..settings.config import Settings
from ..store.ledger import PayloadMismatchError, PaymentMismatchError
from ..store.outcome import Outcome
from .delivery import current_delivery
from .release import NotAtReleaseError, OtherCurrencyError
from .webhooks import UnknownSourceError, too_large

log = logging.getLogger(__name__)


class Answer(NamedTuple):
    status: int
    error: str
    outcome: Outcome
    message: str | None = None  # None: the exception's own message, written to be shown
    retry_after: bool = False
    names_event: bool = False  # the body carries the event's id (the sender learns which event it refers to)
    extra: dict[str, str] | None = None  # more fields of the body
    logged: bool = True  # False: its cause is logged once per process when it begins and ends, not per answer


_UNAVAILABLE = Answer(503, "unavailable", Outcome.UNAVAILABLE, "the database is unavailable; retry later", True)

# Domain exception -> its answer. Looked up along the exception's class
# hierarchy, so a subclass answers as its base does.
ANSWERS: dict[type[Exception], Answer] = {
    SignatureError: Answer(401, "invalid_signature", Outcome.REJECTED),
    InvalidJSONError: Answer(400, "invalid_json", Outcome.REJECTED),
    InvalidEventError: Answer(400, "invalid_event", Outcome.REJECTED),
    UnprocessableError: Answer(422, "unprocessable", Outcome.FAILED, names_event=True),
    PayloadMismatchError: Answer(409, "payload_mismatch", Outcome.PAYLOAD_MISMATCH, names_event=True),
    PaymentMismatchError: Answer(409, "payment_mismatch", Outcome.PAYMENT_MISMATCH, names_event=True),
    InProgressError: Answer(409, "in_progress", Outcome.IN_PROGRESS, retry_after=True, names_event=True,
                       extra={"status": "in_progress"}),
    # gunicorn reads a chunked body as the view asks for it, so its framing
    # errors (a chunk size that is not hexadecimal, a chunk without its CRLF,
    # a bad extension or trailer) reach the app: the sender's fault, not a bug.
    MalformedRequest: Answer(400, "bad_request", Outcome.REJECTED, "malformed chunked request body"),
    # The body is the code alone (docs/design.md, Answers): nothing about what is configured.
    UnknownSourceError: Answer(404, "unknown_source", Outcome.REJECTED, message=""),
    # Transient: nothing was committed, and the sender's retry will find the event as it was.
    # psycopg's OperationalError and its subclasses: connection refused or
    # lost (a server or PgBouncer restarting, AdminShutdown, CannotConnectNow,
    # a pooler's own errors, SQLSTATE class 08), PoolTimeout (no connection
    # within PG_POOL_TIMEOUT_MS), QueryCanceled (statement_timeout),
    # LockNotAvailable (lock_timeout), SerializationFailure (among them, an event's
    # row purged under its delivery: money.sql's apply_event) and DeadlockDetected.
    psycopg.OperationalError: _UNAVAILABLE,
    # A failover's moment on a standby, or our own transaction idle past its
    # limit (the worker stalled): both end in a rollback, and a retry succeeds.
    psycopg.errors.ReadOnlySqlTransaction: _UNAVAILABLE,
    psycopg.errors.IdleInTransactionSessionTimeout: _UNAVAILABLE,
    # The database's schema or money rule is not this release's (release.py, logged there): the provider's
    # retry succeeds once the operator has run `flask init-db`. The reason is for the operator, not the sender.
    NotAtReleaseError: Answer(503, "unavailable", Outcome.UNAVAILABLE,
                              "the database is not at this release; retry later", retry_after=True, logged=False),
    # LEDGER_CURRENCY is not the currency the ledger records (release.py, logged there).
    OtherCurrencyError: Answer(503, "unavailable", Outcome.UNAVAILABLE,
                               "the service's settings do not fit its database; retry later", retry_after=True,
                               logged=False),
    # A provider's API (or PayPal's certificate host) had no free slot, timed
    # out, was unreachable, answered 429 or 5xx, or refused our credentials
    # (ProviderRefusedError, counted: the alert WebhookLedgerProviderRefusesCredentials;
    # the sender is not told of our configuration) (app/providers/): nothing
    # was written, and the provider retries.
    ProviderUnavailableError: Answer(503, "unavailable", Outcome.UNAVAILABLE,
                                     "the provider's API is unavailable; retry later", retry_after=True),
    # PayPal's certificate host's budget for unverified requests spent (app/providers/paypal/certificates.py, which
    # logs it once per interval: an unsigned flood must not write a line per request).
    BudgetSpentError: Answer(503, "unavailable", Outcome.UNAVAILABLE, "the provider's API is unavailable; retry later",
                             retry_after=True, logged=False),
    # Any other psycopg.Error (ProgrammingError, InterfaceError, ...) is a bug
    # or a misconfiguration: 500, its class and SQLSTATE logged (_internal_error).
}

# SQLSTATEs of a 500 that have a known cause outside the code, told in its log line.
HINTS = {
    # psycopg prepared a statement on a server connection that PgBouncer (before
    # 1.21, in transaction mode) then gave to another client, or the reverse.
    "26000": "prepared statements through a transaction pooler: set PG_PREPARE_THRESHOLD=off",
    "42P05": "prepared statements through a transaction pooler: set PG_PREPARE_THRESHOLD=off",
}

# Werkzeug's own exceptions (routing, 413, 415), by status, in this API's vocabulary.
_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "too_large",
    415: "unsupported_media_type",
}


def init_app(app: Flask) -> None:
    app.register_error_handler(HTTPException, _http_error)
    for exception in ANSWERS:
        app.register_error_handler(exception, _domain_error)
    app.register_error_handler(Exception, _internal_error)


def _answer(status: int, body: Mapping[str, object], retry_after: bool = False) -> Response:
    response = jsonify(body)
    response.status_code = status
    if retry_after:
        response.headers["Retry-After"] = str(Settings.of(current_app).retry_after_seconds)
    return response


def _domain_error(exc: Exception) -> Response:
    answer = next(ANSWERS[cls] for cls in type(exc).__mro__ if cls in ANSWERS)
    if answer is _UNAVAILABLE:
        log.warning("database unavailable: %s%s", type(exc).__name__, _sqlstate(exc))
    elif answer.status == 503 and answer.logged:
        log.warning("unavailable: %s", exc)  # our own message: names no value of the request
    body = {"error": answer.error, **(answer.extra or {})}
    message = str(exc) if answer.message is None else answer.message
    if message:
        body["message"] = message
    delivery = current_delivery()
    if delivery is not None:
        delivery.outcome = answer.outcome
        delivery.reason = answer.error if answer.outcome == Outcome.REJECTED else None
        if answer.names_event and delivery.event_id is not None:
            body["event_id"] = delivery.event_id
    return _answer(answer.status, body, answer.retry_after)


def _http_error(exc: HTTPException) -> Response:
    if isinstance(exc, ClientDisconnected) and isinstance(exc.__context__, TimeoutError):
        # Werkzeug's word for a body read that failed: here, because the body did not arrive
        # within the server's deadline (app/serving/gunicorn_worker.py). The connection is closed after.
        exc = RequestTimeout("the request body did not arrive in time")
    if isinstance(exc, RequestEntityTooLarge):  # Flask's (a Content-Length) says it as webhooks.py's (chunked)
        exc = RequestEntityTooLarge(too_large(Settings.of(current_app).max_body_bytes))
    assert exc.code is not None  # Flask answers a code-less HTTPException itself, without a handler
    error = _CODES.get(exc.code, "http_error")
    delivery = current_delivery()
    if delivery is not None:
        delivery.outcome, delivery.reason = Outcome.REJECTED, error
    return _answer(exc.code, {"error": error, "message": exc.description}, exc.code == 503)


def _internal_error(exc: Exception) -> Response:
    # The type and the innermost frame locate the bug without printing a
    # traceback whose locals could hold the body or the secret.
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame else "?"
    hint = HINTS.get(getattr(exc, "sqlstate", None) or "")
    log.error("internal error: %s%s at %s%s", type(exc).__name__, _sqlstate(exc), where, f" ({hint})" if hint else "")
    return _answer(500, {"error": "internal"})


def _sqlstate(exc: Exception) -> str:
    # The code only: a database message can quote the values of the row.
    code = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
    return f" (SQLSTATE {code})" if code else ""
