"""A delivery's record: what its log line and its metrics need, and nothing else.
Begun for every request under /api/webhooks, filled by the view's steps (and errors.py), read after the answer."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flask import Flask, Response, current_app, g, request

from ..store.outcome import Outcome

if TYPE_CHECKING:
    from ..intake.events import Effect, Event
    from ..locking.lock import EventLock, LockState
    from ..store.ledger import Change, Result
    from .fetch import Fetched

# Named for the endpoint whose deliveries it logs (operators filter on it).
log = logging.getLogger("app.receiver.webhooks")


@dataclass
class Delivery:
    source: str | None  # a configured source's name; None until the view finds one
    started: float = field(default_factory=time.perf_counter)
    secret_index: int | None = None  # which of the rotated secrets verified it
    event: Event | None = None  # as delivered
    fetched: Fetched | None = None  # the event as its provider's API has it (a fetching source), or as delivered
    effect: Effect | None = None
    payload_sha256: bytes | None = None  # of the bytes received
    lock: EventLock | None = None
    result: Result | None = None  # what the ledger (or the done marker) answered
    outcome: Outcome | None = None
    reason: str | None = None  # a rejection's error code

    @property
    def event_id(self) -> str | None:
        return None if self.event is None else self.event.id

    @property
    def event_type(self) -> str | None:
        return None if self.event is None else self.event.type

    @property
    def payment_id(self) -> str | None:
        """The payment whose money the event moves."""
        return None if self.effect is None else self.effect.payment_id

    @property
    def movement(self) -> str | None:
        """A refund or dispute, its id and what the event says: "refund re_1 reversed"."""
        effect = self.effect
        if effect is None or not effect.movement_id:
            return None
        return f"{effect.kind} {effect.movement_id} {effect.state}"

    @property
    def lock_state(self) -> LockState | None:
        """What taking the lock found; logged as `redis`."""
        return None if self.lock is None else self.lock.state

    @property
    def redis_fault(self) -> str | None:
        """A Redis fault's reason (redis_client.py), if the lock met one."""
        return None if self.lock is None else self.lock.fault

    @property
    def change(self) -> Change | None:
        """The ledger.Change the delivery made."""
        return None if self.result is None else self.result.change

    @property
    def balance_after(self) -> int | None:
        """The user's balance after that change."""
        return None if self.result is None else self.result.balance_after

    @property
    def contradicted(self) -> bool:
        """The provider's record moved other money than the notification said (the record decided)."""
        return self.fetched is not None and self.fetched.contradicts

    @property
    def reserialised(self) -> bool:
        """The same effect arrived in other bytes than the stored ones (a provider re-serialising)."""
        stored = None if self.result is None else self.result.stored_sha256
        return None not in (self.payload_sha256, stored) and self.payload_sha256 != stored


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
        # By its key, not metrics.of: metrics reads a Delivery's fields, and the two would import each other.
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
        assert delivery.payload_sha256 is not None and delivery.result and delivery.result.stored_sha256
        # The same effect in other bytes: both hashes, so that the two bodies can be told apart.
        # The log field keeps its name, body_sha256: operators' queries read it (docs/design.md, Names kept).
        fields.update(body_sha256=delivery.payload_sha256.hex(), stored_sha256=delivery.result.stored_sha256.hex())
    log.info("delivery", extra=fields)
