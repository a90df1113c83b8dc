"""Structured logs: one line per record, each carrying the request id (the line per delivery is delivery.py's).
Formatted by app/serving/logformat.py, to stdout under gunicorn, to stderr elsewhere (docs/operations.md, "Logs")."""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, g, has_request_context, request

from ..serving.logformat import formatter_for

REQUEST_ID_HEADER = "X-Request-ID"
# What a proxy or the provider may send: a UUID, a trace id, a delivery id.
# Anything longer or with other characters is replaced, never logged.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def init_app(app: Flask) -> None:
    _install_record_factory()
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter_for(sys.stderr))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    app.before_request(_take_request_id)
    app.after_request(_echo_request_id)


def request_id(header: str | None) -> str:
    """Return header if it is a safe request id, else a new random one."""
    if header and _SAFE_REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def _take_request_id() -> None:
    g.request_id = request_id(request.headers.get(REQUEST_ID_HEADER))


def _echo_request_id(response: Response) -> Response:
    if "request_id" in g:
        response.headers[REQUEST_ID_HEADER] = g.request_id
    return response


class _RecordFactory:
    """Stamps the current request's id on every log record made while serving it."""

    def __init__(self, base: Callable[..., logging.LogRecord]) -> None:
        self.base = base

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        if has_request_context() and "request_id" in g:
            record.request_id = g.request_id
        return record


def _install_record_factory() -> None:
    """Install _RecordFactory once per process, whatever number of apps are made."""
    base = logging.getLogRecordFactory()
    if not isinstance(base, _RecordFactory):
        logging.setLogRecordFactory(_RecordFactory(base))
