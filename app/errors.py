"""One JSON error shape for every answer that is not a success.

Views raise; the table below turns each domain exception into its answer,
`{"error": <code>, "message": <text>}` (with the event id once it is known),
and its delivery outcome. A PostgreSQL outage becomes 503 here and nowhere
else. No stack trace or secret ever reaches a body.
"""

import logging
from typing import NamedTuple

import psycopg
from flask import current_app, jsonify
from werkzeug.exceptions import HTTPException

from . import delivery
from .config import UnknownSource
from .delivery import Outcome
from .events import InvalidEvent, InvalidJSON, Unprocessable
from .ledger import PayloadMismatch, RetryLater
from .lock import InProgress
from .signature import SignatureError

log = logging.getLogger(__name__)


class Answer(NamedTuple):
    status: int
    error: str
    outcome: Outcome
    message: str | None = None  # None: the exception's own message, written to be shown
    retry_after: bool = False


_UNAVAILABLE = Answer(503, "unavailable", Outcome.UNAVAILABLE, "the database is unavailable; retry later", True)

# Domain exception -> its answer. Looked up along the exception's class
# hierarchy, so a subclass answers as its base does.
ANSWERS = {
    SignatureError: Answer(401, "invalid_signature", Outcome.REJECTED),
    InvalidJSON: Answer(400, "invalid_json", Outcome.REJECTED),
    InvalidEvent: Answer(400, "invalid_event", Outcome.REJECTED),
    Unprocessable: Answer(422, "unprocessable", Outcome.FAILED),
    PayloadMismatch: Answer(409, "payload_mismatch", Outcome.MISMATCH),
    InProgress: Answer(409, "in_progress", Outcome.IN_PROGRESS, retry_after=True),
    # DESIGN.md's body is the code alone: nothing about what is configured.
    UnknownSource: Answer(404, "unknown_source", Outcome.REJECTED, message=""),
    # Connection refused, pool timeout, statement or lock timeout, a row
    # purged under the delivery: nothing was committed, and the sender's
    # retry will find the event as it was.
    RetryLater: _UNAVAILABLE,
    psycopg.OperationalError: _UNAVAILABLE,
}

# Werkzeug's own exceptions (routing, 413, 415), by status, in this API's vocabulary.
_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


def init_app(app):
    app.register_error_handler(HTTPException, _http_error)
    for exception in ANSWERS:
        app.register_error_handler(exception, _domain_error)
    app.register_error_handler(Exception, _internal_error)


def _answer(status, body, retry_after=False):
    response = jsonify(body)
    response.status_code = status
    if retry_after:
        response.headers["Retry-After"] = str(current_app.config["RETRY_AFTER_SECONDS"])
    return response


def _domain_error(exc):
    answer = next(ANSWERS[cls] for cls in type(exc).__mro__ if cls in ANSWERS)
    if answer.status == 503:
        log.warning("database unavailable: %s", type(exc).__name__)
    body = {"error": answer.error}
    message = str(exc) if answer.message is None else answer.message
    if message:
        body["message"] = message
    record = delivery.current()
    if record is not None:
        record.outcome, record.reason = answer.outcome, answer.error if answer.outcome == Outcome.REJECTED else None
        if record.event_id is not None and answer.status in (409, 422):
            body["event_id"] = record.event_id
    if isinstance(exc, InProgress):
        body["status"] = "in_progress"
    return _answer(answer.status, body, answer.retry_after)


def _http_error(exc):
    error = _CODES.get(exc.code, "http_error")
    record = delivery.current()
    if record is not None:
        record.outcome, record.reason = Outcome.REJECTED, error
    return _answer(exc.code, {"error": error, "message": exc.description}, exc.code == 503)


def _internal_error(exc):
    # The type and the innermost frame locate the bug without printing a
    # traceback whose locals could hold the body or the secret.
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame else "?"
    log.error("internal error: %s at %s", type(exc).__name__, where)
    return _answer(500, {"error": "internal"})
