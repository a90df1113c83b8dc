"""The HTTP surface: POST /api/webhooks, GET /health, GET /ready."""

import hashlib

import psycopg
from flask import Blueprint, current_app, request
from werkzeug.exceptions import UnsupportedMediaType

from . import delivery, ledger, lock, signature
from .db import get_pool
from .delivery import Outcome
from .events import parse
from .lock import LockState

bp = Blueprint("webhooks", __name__)


@bp.post("/api/webhooks")
def receive():
    """Verify, parse, lock, apply in one transaction, answer; see DESIGN.md. Errors raise (errors.py)."""
    record = delivery.begin()
    config = current_app.config
    body = _raw_json_body()
    scheme = config["WEBHOOK_SIGNATURE_SCHEME"]
    record.secret_index = signature.verify(
        scheme, body, request.headers, config["WEBHOOK_SECRET"], config["WEBHOOK_TOLERANCE_SECONDS"])

    event = parse(body, scheme, request.headers)
    record.event_id, record.event_type = event.id, event.type

    body_sha256 = hashlib.sha256(body).digest()
    event_lock = lock.EventLock(current_app.extensions["redis"], event.id, body_sha256,
                                config["LOCK_TTL_MS"], config["REDIS_DONE_TTL_SECONDS"] * 1000)
    record.redis = event_lock.acquire()
    record.redis_fault = event_lock.fault
    if record.redis == LockState.DONE:
        # These bytes were committed before (the marker is set only after
        # COMMIT): a duplicate, answered without touching PostgreSQL.
        result = ledger.Result(Outcome.DUPLICATE)
    elif record.redis == LockState.HELD_ELSEWHERE:
        raise lock.InProgress("another delivery of this event is being processed; retry later")
    else:
        result = None
        try:
            result = ledger.apply_event(get_pool(current_app), event, body_sha256)
        finally:
            if record.redis == LockState.ACQUIRED:
                event_lock.release(committed=result is not None and result.committed)
                record.redis_fault = event_lock.fault

    record.outcome = result.raise_for_outcome().outcome
    return {"status": record.outcome, "event_id": event.id}


def _raw_json_body():
    if not _is_json(request.mimetype):
        raise UnsupportedMediaType("Content-Type must be application/json")
    return request.get_data(cache=False)  # raises 413 past MAX_CONTENT_LENGTH


def _is_json(mimetype):
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


@bp.get("/health")
def health():
    """Liveness: touches no dependency."""
    return {"status": "ok"}


@bp.get("/ready")
def ready():
    """Readiness: PostgreSQL must answer; Redis is reported (with why it is degraded), not required."""
    link = current_app.extensions["redis"]
    # Why Redis cannot be used now, or the fault that deliveries met lately
    # (OOM, say, refuses only writes, which the probe may not make).
    redis_reason = lock.probe(link) or link.recent_fault()
    body = {"redis": "degraded", "redis_reason": redis_reason} if redis_reason else {"redis": "ok"}
    try:
        with get_pool(current_app).connection() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        body = {"status": "unavailable", "postgres": "unavailable", **body}
        return body, 503, {"Retry-After": str(current_app.config["RETRY_AFTER_SECONDS"])}
    return {"status": "ok", "postgres": "ok", **body}
