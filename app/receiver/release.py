"""Whether the database is at this release (app/store/schema.py), remembered per process: deliveries wait for
`flask init-db` with a 503 instead of failing (docs/design.md, "When things break")."""

import logging
import threading
import time

from flask import Flask

from ..settings.config import Settings
from ..store.db import get_pool
from ..store.schema import other_currency, recorded_currency, why_not_at_release

log = logging.getLogger(__name__)

# How long a process trusts its last answer: after `flask init-db`, deliveries succeed again within it, and a
# process asks the database at most once per it (not once per delivery). Short next to a provider's retries.
RECHECK_SECONDS = 5.0
EXTENSION = "release_check"


class NotAtReleaseError(RuntimeError):
    """The database is not at this release: the delivery is answered 503, with Retry-After, and nothing is written."""


class OtherCurrencyError(NotAtReleaseError):
    """The ledger records another currency than LEDGER_CURRENCY: answered as NotAtReleaseError."""


class ReleaseCheck:
    """The process's last answer (None: at this release) and until when (time.monotonic()) it holds."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.error: type[NotAtReleaseError] = NotAtReleaseError  # which, when reason is not None
        self.until = 0.0  # expired: the first delivery asks
        self._asking = threading.Lock()

    @staticmethod
    def of(app: Flask) -> "ReleaseCheck":
        check: ReleaseCheck = app.extensions[EXTENSION]
        return check

    def require(self, app: Flask) -> None:
        """Raise NotAtReleaseError when the database is not at this release; ask it only once the answer expired."""
        if time.monotonic() >= self.until and self._asking.acquire(blocking=False):  # one thread asks; others wait not
            try:
                self.ask(app)
            finally:
                self._asking.release()
        if self.reason is not None:
            raise self.error(self.reason)

    @property
    def state(self) -> str:
        """The database's, as GET /ready names it."""
        if self.reason is None:
            return "ok"
        return "another_currency" if self.error is OtherCurrencyError else "not_at_this_release"

    def ask(self, app: Flask) -> str | None:
        """Ask the database now (psycopg.OperationalError when it does not answer), remember it, and return why not."""
        settings, error = Settings.of(app), NotAtReleaseError
        with get_pool(app).connection() as conn:
            reason = why_not_at_release(conn, settings.schema_path)
            recorded = recorded_currency(conn) if reason is None else settings.ledger_currency
        if recorded != settings.ledger_currency:
            error = OtherCurrencyError
            reason = (other_currency(settings.ledger_currency, recorded) if recorded
                      else "the ledger's currency is not recorded: run `flask init-db`")
        if reason != self.reason:  # one line per change, not per request
            if reason is None:
                log.warning("the database is at this release and in LEDGER_CURRENCY again: deliveries are served")
            else:
                log.warning("deliveries are answered 503 until this is fixed: %s", reason)
        self.reason, self.error, self.until = reason, error, time.monotonic() + RECHECK_SECONDS
        return reason


def init_app(app: Flask) -> None:
    app.extensions[EXTENSION] = ReleaseCheck()
