"""The fetch step at the provider's pace: a completed event is a duplicate before any fetch, and a notification the
provider cannot be asked about now is recorded and accepted (docs/design.md, "The provider's pace")."""

import logging
from typing import TYPE_CHECKING, NamedTuple

from ..core.errors import ProviderRefusedError, ProviderUnavailableError
from ..intake.events import Event, Policy, UnprocessableError
from ..locking import lock
from ..settings.sources import Source
from ..store import ledger, waiting
from ..store.db import get_pool
from ..store.outcome import Outcome
from . import fetch

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)


class Step(NamedTuple):
    """What the fetch step came to: an answer already (duplicate, accepted), or the event to apply."""

    answered: Outcome | None
    fetched: fetch.Fetched | None = None


def fetch_or_wait(app: "Flask", source: Source, event: Event, payload_sha256: bytes, policy: Policy) -> Step:
    """The event's Fetched when its provider answers now; otherwise an answer, with nothing fetched."""
    # A source that does not ask its provider about this event goes straight on. One that does: a completed event is
    # DUPLICATE and a waiting one ACCEPTED, both before any call; an event the provider cannot be asked about now is
    # recorded (committed) and ACCEPTED; one the provider has no record of is recorded bounded (no body) and
    # UnprocessableError (422).
    calls = fetch.of(app)
    if not calls.asks(source, event):
        return Step(None, calls.fetch(source, event, policy))
    if lock.is_done(app, event):
        return Step(Outcome.DUPLICATE)
    pool = get_pool(app)
    known = waiting.known(pool, event.source, event.id)
    if known == waiting.Known.COMPLETED:
        return Step(Outcome.DUPLICATE)
    if known == waiting.Known.WAITING:
        return Step(Outcome.ACCEPTED)
    try:
        fetched = calls.fetch(source, event, policy)
    except ProviderUnavailableError as exc:
        if isinstance(exc, ProviderRefusedError):  # our misconfiguration: said here, counted (the alert), not told
            log.warning("%s; event %s (source %s) waits for it", exc, event.id, source.name)
        waiting.accept(pool, event, payload_sha256, str(exc))  # why it waits: `flask events show`
        return Step(Outcome.ACCEPTED)
    if fetched.effect.sha256 == ledger.UNKNOWN_EFFECT:
        waiting.unknown(pool, event, payload_sha256, fetched.effect.problem or "the provider has no record of it")
        raise UnprocessableError(fetched.effect.problem)
    return Step(None, fetched)
