"""One JSON error shape for every answer that is not a success.

Views raise; the handlers here turn every exception into
`{"error": <code>, "message": <text>}`. A PostgreSQL outage becomes 503
here and nowhere else. No stack trace or secret ever reaches a body.
"""

import logging

import psycopg
from flask import current_app, jsonify
from werkzeug.exceptions import HTTPException

from .ledger import RetryLater

log = logging.getLogger(__name__)

# Werkzeug's own exceptions, by status, in this API's vocabulary.
_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}


class ApiError(HTTPException):
    """An answer of DESIGN.md's table: status, error code, message."""

    def __init__(self, code, error, message, retry_after=False, **extra):
        super().__init__(message)
        self.code, self.error, self.retry_after, self.extra = code, error, retry_after, extra


def init_app(app):
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(psycopg.OperationalError, _database_unavailable)
    app.register_error_handler(RetryLater, _database_unavailable)
    app.register_error_handler(Exception, _internal_error)


def _answer(status, body, retry_after=False):
    response = jsonify(body)
    response.status_code = status
    if retry_after:
        response.headers["Retry-After"] = str(current_app.config["RETRY_AFTER_SECONDS"])
    return response


def _http_error(exc):
    if isinstance(exc, ApiError):
        return _answer(exc.code, {"error": exc.error, "message": exc.description, **exc.extra}, exc.retry_after)
    error = _CODES.get(exc.code, "http_error")
    return _answer(exc.code, {"error": error, "message": exc.description}, exc.code == 503)


def _database_unavailable(exc):
    # Connection refused, pool timeout, statement or lock timeout: nothing
    # was committed, and the sender's retry will find the event new.
    log.warning("database unavailable: %s", type(exc).__name__)
    return _answer(503, {"error": "unavailable", "message": "the database is unavailable; retry later"}, True)


def _internal_error(exc):
    # The type and the innermost frame locate the bug without printing a
    # traceback whose locals could hold the body or the secret.
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}" if frame else "?"
    log.error("internal error: %s at %s", type(exc).__name__, where)
    return _answer(500, {"error": "internal"})
