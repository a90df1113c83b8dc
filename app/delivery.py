"""A delivery's record: what its log line and its metrics need, and nothing else.

It is begun for every request under /api/webhooks, before routing; the
view fills it in as the delivery goes (event, secret, lock state,
outcome); errors.py sets the outcome of a delivery that ends in an error.
After the answer, one log line and the metrics are taken from it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum

from flask import Flask, Response, current_app, g, request

# Named for the endpoint whose deliveries it logs (operators filter on it).
log = logging.getLogger("app.webhooks")


class Outcome(StrEnum):
    """What a delivery came to: the `outcome` of its log line and metrics."""

    PROCESSED = "processed"  # effects committed by this delivery
    DUPLICATE = "duplicate"  # committed before; nothing changed
    FAILED = "failed"  # recorded as failed: the effect cannot apply (422)
    IGNORED = "ignored"  # a payment that names no user, or a movement of one, under NO_USER=ignore (200)
    PAYLOAD_MISMATCH = "payload_mismatch"  # this id was stored with a different effect (409)
    PAYMENT_MISMATCH = "payment_mismatch"  # its payment was credited with another user, amount or currency (409)
    IN_PROGRESS = "in_progress"  # a twin delivery holds the lock (409)
    UNAVAILABLE = "unavailable"  # the database did not answer; nothing committed (503)
    REJECTED = "rejected"  # refused before the ledger: 400, 401, 404, 413, 415
    ERROR = "error"  # a bug (500)


@dataclass
class Delivery:
    source: str | None  # a configured source's name; None until the view finds one
    started: float = field(default_factory=time.perf_counter)
    event_id: str | None = None
    event_type: str | None = None
    secret_index: int | None = None  # which of the rotated secrets verified it
    lock_state: StrEnum | None = None  # the lock.LockState that taking the lock found; logged as `redis`
    redis_fault: str | None = None  # a Redis fault's reason (redis_client.py), if the lock met one
    outcome: Outcome | None = None
    reason: str | None = None  # a rejection's error code
    body_sha256: bytes | None = None  # of the bytes received
    stored_sha256: bytes | None = None  # of the bytes stored for the event, when they were read
    payment_id: str | None = None  # the payment whose money the event moves
    movement: str | None = None  # a refund or dispute, its id and what the event says: "refund re_1 reversed"
    change: StrEnum | None = None  # the ledger.Change it made
    balance_after: int | None = None  # the user's balance after that change

    @property
    def reserialised(self) -> bool:
        """The same effect arrived in other bytes than the stored ones (a provider re-serialising)."""
        return None not in (self.body_sha256, self.stored_sha256) and self.body_sha256 != self.stored_sha256


# Every request under it is a delivery: logged and counted, whatever its
# answer (a 404 or 405 from routing included).
PREFIX = "/api/webhooks"


def current_delivery() -> Delivery | None:
    """The current request's delivery record, or None if it is not a delivery."""
    return g.get("delivery")


def init_app(app: Flask) -> None:
    app.before_request(_begin)
    app.after_request(_finish)


def _begin() -> None:
    # Before routing's own errors are raised: the view names the source.
    if request.path == PREFIX or request.path.startswith(PREFIX + "/"):
        g.delivery = Delivery(source=None)


def _finish(response: Response) -> Response:
    delivery = g.pop("delivery", None)
    if delivery is not None:
        seconds = time.perf_counter() - delivery.started
        delivery.outcome = delivery.outcome or Outcome.ERROR
        current_app.extensions["metrics"].observe_delivery(delivery, seconds)
        _log(delivery, response, seconds)
    return response


def _log(delivery: Delivery, response: Response, seconds: float) -> None:
    """The one line per delivery; never the body, the signature or the secret.

    It carries what gunicorn's access line does (off by default), so that one line per delivery is enough.
    """
    fields = {
        # A path that reaches no source may hold anything a sender chose (a
        # secret pasted into a URL, say): only a configured source's is logged.
        "method": request.method, "path": request.path if delivery.source else None,
        "remote_addr": request.remote_addr,
        "status": response.status_code, "bytes": response.content_length,
        "source": delivery.source, "event_id": delivery.event_id, "event_type": delivery.event_type,
        "outcome": delivery.outcome, "reason": delivery.reason, "latency_ms": round(seconds * 1000, 1),
        "secret_index": delivery.secret_index, "redis": delivery.lock_state, "redis_fault": delivery.redis_fault,
        "payment_id": delivery.payment_id, "movement": delivery.movement, "change": delivery.change,
    }
    if delivery.reserialised:
        assert delivery.body_sha256 is not None and delivery.stored_sha256 is not None  # reserialised says so
        # The same effect in other bytes: both hashes, so that the two bodies can be told apart.
        fields.update(body_sha256=delivery.body_sha256.hex(), stored_sha256=delivery.stored_sha256.hex())
    log.info("delivery", extra=fields)
