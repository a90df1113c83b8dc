"""A client-side bound on every wait for PostgreSQL, which a frozen server's own timeouts do not bound
(docs/design.md, "When things break")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors

if TYPE_CHECKING:
    from psycopg.abc import RV, PQGen

# Past the pooler's queue and statement_timeout: the network's share, and
# the time a running server takes to cancel a statement and say so.
MARGIN_MS = 1000


class NotAnsweringError(psycopg.OperationalError):
    """PostgreSQL did not answer within the deadline; the connection was closed."""


def seconds(queue_ms: float, statement_timeout_ms: int) -> float | None:
    """The longest a healthy server takes to answer one round trip (a pooler's queue, queue_ms, then the statement,
    then MARGIN_MS); None (no bound) when statements have none."""
    return (queue_ms + statement_timeout_ms + MARGIN_MS) / 1000 if statement_timeout_ms else None


class Connection(psycopg.Connection[Any]):
    """psycopg's connection, each of whose waits for the server ends after `deadline` seconds (None: never)."""

    deadline: float | None = None

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        # Every round trip after the connection is made comes through here
        # (execute, a pipeline's sync, commit); connect_timeout bounds the connection itself.
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.deadline
        try:
            return super().wait(gen, *args, **kwargs)
        except errors._WaitTimeout:  # psycopg's, documented by Connection.wait
            # Mid-exchange, the connection cannot be used again: closed, as
            # psycopg closes one whose cancelled query never ended.
            self.pgconn.finish()
            raise NotAnsweringError(f"PostgreSQL did not answer within {kwargs['timeout']:g} s") from None
