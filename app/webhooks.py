"""The HTTP surface: POST /api/webhooks, GET /health, GET /ready."""

import hashlib
import logging
import time

import psycopg
from flask import Blueprint, current_app, g, request

from . import ledger, lock, signature
from .db import get_pool
from .errors import ApiError
from .events import InvalidEvent, InvalidJSON, parse

log = logging.getLogger(__name__)
bp = Blueprint("webhooks", __name__)


@bp.post("/api/webhooks")
def receive():
    """Verify, parse, lock, apply in one transaction, release; see DESIGN.md."""
    g.delivery = {"started": time.perf_counter()}
    if not _is_json(request.mimetype):
        raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")
    body = request.get_data(cache=False)  # raises 413 past MAX_CONTENT_LENGTH

    config = current_app.config
    scheme = config["WEBHOOK_SIGNATURE_SCHEME"]
    try:
        g.delivery["secret"] = signature.verify(
            scheme, body, request.headers, config["WEBHOOK_SECRET"], config["WEBHOOK_TOLERANCE_SECONDS"]
        )
    except signature.SignatureError as exc:
        raise ApiError(401, "invalid_signature", str(exc)) from None

    try:
        event = parse(body, scheme, request.headers)
    except InvalidJSON as exc:
        raise ApiError(400, "invalid_json", str(exc)) from None
    except InvalidEvent as exc:
        raise ApiError(400, "invalid_event", str(exc)) from None
    g.delivery.update(event=event.id, type=event.type)

    body_sha256 = hashlib.sha256(body).digest()
    event_lock = lock.EventLock(current_app.extensions["redis_scripts"], event.id, body_sha256,
                                config["LOCK_TTL_MS"], config["REDIS_DONE_TTL_SECONDS"] * 1000)
    g.delivery["redis"] = state = event_lock.acquire()
    if state == lock.DONE:
        # These bytes were committed before (the marker is set only after
        # COMMIT): a duplicate, answered without touching PostgreSQL.
        g.delivery["outcome"] = ledger.DUPLICATE
        return {"status": ledger.DUPLICATE, "event_id": event.id}
    if state == lock.HELD_ELSEWHERE:
        raise ApiError(
            409, "in_progress", "another delivery of this event is being processed; retry later",
            retry_after=True, status="in_progress", event_id=event.id,
        )
    status = None
    try:
        status, problem = ledger.apply_event(get_pool(current_app), event, body_sha256)
    except InvalidJSON as exc:
        raise ApiError(400, "invalid_json", str(exc)) from None
    finally:
        if state == lock.ACQUIRED:
            event_lock.release(committed=status in (ledger.PROCESSED, ledger.DUPLICATE))

    if status == ledger.FAILED:
        raise ApiError(422, "unprocessable", problem, event_id=event.id)
    if status == ledger.MISMATCH:
        raise ApiError(409, "payload_mismatch", "this event id was delivered before with a different body",
                       event_id=event.id)
    g.delivery["outcome"] = status
    return {"status": status, "event_id": event.id}


def _is_json(mimetype):
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


# A delivery's answer -> (outcome, reason) for the log line and the metrics.
# Rejections (400, 401, 413, 415) keep their error code as the reason.
_OUTCOMES = {
    "in_progress": ("in_progress", ""),
    "payload_mismatch": ("payload_mismatch", ""),
    "unprocessable": ("failed", ""),
    "unavailable": ("unavailable", ""),
    "internal": ("error", ""),
}


@bp.after_app_request
def _record_delivery(response):
    """One log line and the metrics per delivery; never the body, the signature or the secret."""
    delivery = g.pop("delivery", None)
    if delivery is None:
        return response
    seconds = time.perf_counter() - delivery["started"]
    if delivery.get("outcome"):
        outcome, reason = delivery["outcome"], ""
    else:
        error = (response.get_json(silent=True) or {}).get("error", "unknown")
        outcome, reason = _OUTCOMES.get(error, ("rejected", error))
    current_app.extensions["metrics"].observe_delivery(outcome, reason, seconds, delivery.get("redis"))
    log.info("delivery", extra={
        "event_id": delivery.get("event"), "event_type": delivery.get("type"), "outcome": outcome,
        "reason": reason or None, "status": response.status_code, "latency_ms": round(seconds * 1000, 1),
        "secret_index": delivery.get("secret"), "redis": delivery.get("redis"),
    })
    return response


@bp.get("/health")
def health():
    """Liveness: touches no dependency."""
    return {"status": "ok"}


@bp.get("/ready")
def ready():
    """Readiness: PostgreSQL must answer; Redis is reported, not required."""
    redis_state = "ok" if lock.redis_ok(current_app.extensions["redis"]) else "degraded"
    try:
        with get_pool(current_app).connection() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        body = {"status": "unavailable", "postgres": "unavailable", "redis": redis_state}
        return body, 503, {"Retry-After": str(current_app.config["RETRY_AFTER_SECONDS"])}
    return {"status": "ok", "postgres": "ok", "redis": redis_state}
