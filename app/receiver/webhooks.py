"""The HTTP surface: POST /api/webhooks, GET /health, GET /ready."""

import hashlib
from collections.abc import Mapping

import psycopg
from flask import Blueprint, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge, UnsupportedMediaType

from ..intake import signature
from ..intake.events import DEFAULT_SOURCE, parse
from ..locking import lock
from ..locking.lock import Locks
from ..settings.config import Settings
from ..settings.sources import Source
from ..store import ledger
from ..store.db import get_pool
from ..store.outcome import Outcome
from ..version import __version__
from . import fetch, pace
from .delivery import current_delivery
from .release import ReleaseCheck

bp = Blueprint("webhooks", __name__)


class UnknownSourceError(LookupError):
    """No source of that name is configured: answered 404."""


# The default source's route passes None, not its name: with its name as the
# default, Werkzeug would answer /api/webhooks/default with a redirect there.
# A trailing slash names the same source: a provider configured with one would
# otherwise fail every delivery (a redirect is not followed by providers), and
# the source's secret verifies it all the same. POST only, OPTIONS included:
# any other method is a 405, logged and counted like every answer here.
@bp.post("/api/webhooks", defaults={"name": None}, strict_slashes=False, provide_automatic_options=False)
@bp.post("/api/webhooks/<name>", strict_slashes=False, provide_automatic_options=False)
def receive(name: str | None) -> tuple[dict[str, str], int]:
    """Verify, parse, fetch (a fetching source), lock, apply in one statement, answer (docs/design.md). Errors raise."""
    settings, delivery = Settings.of(current_app), current_delivery()
    assert delivery is not None  # every request under delivery.PREFIX is one
    source = _source(settings, name)  # before anything is read: an unknown source costs a dict lookup
    delivery.source = source.name
    body = _raw_json_body(settings.max_body_bytes)
    calls = fetch.of(current_app)
    delivery.secret_index = signature.verify(source.scheme, body, request.headers, source.secrets, source.tolerance,
                                             certificates=calls.certificates.get(source.scheme))
    delivery.event = parse(body, source.scheme, request.headers, source.event_source)
    payload_sha256 = delivery.payload_sha256 = hashlib.sha256(body).digest()
    step = pace.fetch_or_wait(current_app, source, delivery.event, payload_sha256, settings.policy)
    if step.answered is not None:  # a duplicate, or accepted to wait for the provider: nothing fetched
        delivery.outcome = step.answered
        return {"status": step.answered, "event_id": delivery.event.id}, ANSWERED[step.answered]
    fetched = delivery.fetched = step.fetched
    assert fetched is not None
    event, effect = fetched.event, fetched.effect
    delivery.effect = effect  # what the money is decided by: the provider's record, for a fetching source
    delivery.lock = Locks.of(current_app).event_lock(event, effect, payload_sha256)
    ends_wait = fetched.body is not None  # a fetched event may have waited too (accepted by a twin meanwhile)

    def apply() -> ledger.Result:
        # 503, nothing written, while the database is not at this release: a clock comparison per delivery,
        # a query once the process's answer is RECHECK_SECONDS old (release.py).
        ReleaseCheck.of(current_app).require(current_app)
        return ledger.apply_event(get_pool(current_app), event, effect, payload_sha256, settings.policy,
                                  fetched=fetched.body, ends_wait=ends_wait)

    delivery.result = delivery.lock.apply_once(apply)
    delivery.outcome = delivery.result.raise_for_outcome().outcome
    return {"status": delivery.outcome, "event_id": event.id}, 200


# 202 for accepted: recorded, its processing not done (RFC 9110, 15.3.3); every provider here stops retrying on any
# 2xx (Stripe, PayPal, Razorpay: docs/providers/).
ANSWERED = {Outcome.DUPLICATE: 200, Outcome.ACCEPTED: 202}


def _source(settings: Settings, name: str | None) -> Source:
    # "default" is reserved for POST /api/webhooks: it names no source on /api/webhooks/<name>.
    source = None if name == DEFAULT_SOURCE else settings.sources.get(name or DEFAULT_SOURCE)
    if source is None:
        raise UnknownSourceError("no such source")
    return source


def _raw_json_body(limit: int) -> bytes:
    if not _is_json(request.mimetype):
        raise UnsupportedMediaType("Content-Type must be application/json")
    # A chunked body has no Content-Length for Flask's 413: Werkzeug cuts it
    # silently at MAX_CONTENT_LENGTH, one byte past the limit (create_app).
    body = request.get_data(cache=False)
    if len(body) > limit:
        raise RequestEntityTooLarge(too_large(limit))
    return body


def too_large(limit: int) -> str:
    """The 413's message, one for a body with a Content-Length and a chunked one."""
    return f"the body is larger than {limit} bytes (MAX_BODY_BYTES)"


def _is_json(mimetype: str) -> bool:
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


@bp.get("/health")
def health() -> dict[str, str]:
    """Liveness, and the release answering: touches no dependency."""
    return {"status": "ok", "version": __version__}


@bp.get("/ready")
def ready() -> Mapping[str, str] | tuple[Mapping[str, str], int, Mapping[str, str]]:
    """Readiness: PostgreSQL must answer, at this release; Redis is reported (with why it is degraded), not required."""
    link = lock.redis_of(current_app)
    assert link is not None  # the service reads REDIS_URL
    # Why Redis cannot be used now, or the fault that deliveries met lately
    # (OOM, say, refuses only writes, which the probe may not make).
    redis_reason = lock.probe(link) or link.recent_fault()
    body = {"redis": "degraded", "redis_reason": redis_reason} if redis_reason else {"redis": "ok"}
    if redis_reason and fetch.of(current_app).budgets:
        # Each process keeps its share of the providers' budgets (app/providers/budget.py) until Redis is back.
        body["provider_budget"] = "per_process"
    retry_after = {"Retry-After": str(Settings.of(current_app).retry_after_seconds)}
    check = ReleaseCheck.of(current_app)
    try:
        reason = check.ask(current_app)  # asked afresh: the deliveries' answer is renewed too
    except psycopg.OperationalError:
        return {"status": "unavailable", "postgres": "unavailable", **body}, 503, retry_after
    if reason is not None:
        return {"status": "unavailable", "postgres": check.state, "postgres_reason": reason, **body}, 503, retry_after
    return {"status": "ok", "postgres": "ok", **body}
