"""What psycopg and psycopg_pool do not promise and the app leans on: Connection.wait takes `timeout=` and a
timed-out wait raises the private psycopg.errors._WaitTimeout (app/store/deadline.py); ConnectionPool._connect(timeout)
(app/store/db.py's Pool). These fail, naming what changed, when a release changes one."""

import inspect
import socket
import time

import psycopg
import pytest
from psycopg import errors
from psycopg.pq import ConnStatus
from psycopg.waiting import Wait

from app.store import deadline

pytestmark = pytest.mark.unit

# Long enough for a busy machine to see the wait start; short enough to keep `make check` fast.
TIMEOUT_S = 0.2


class SilentPGconn:
    """What Connection.wait reads of its pgconn: a socket, here one end of a pair that nothing ever writes to."""

    def __init__(self):
        self.peer, self.end = socket.socketpair()
        self.finished = False

    @property
    def socket(self):
        return self.end.fileno()

    @property
    def status(self):
        return ConnStatus.BAD if self.finished else ConnStatus.OK

    def finish(self):
        self.finished = True

    def close(self):
        self.finished = True
        self.peer.close()
        self.end.close()


@pytest.fixture
def pgconn():
    pgconn = SilentPGconn()
    yield pgconn
    pgconn.close()


def never_ready():
    """A psycopg generator that waits for its socket to be readable, forever."""
    while True:
        yield Wait.R


def test_connection_wait_still_takes_a_timeout():
    parameters = inspect.signature(psycopg.Connection.wait).parameters
    assert "timeout" in parameters, (
        f"psycopg {psycopg.__version__}: Connection.wait no longer takes timeout= (it takes {list(parameters)}); "
        "app/store/deadline.py passes it to bound every wait for PostgreSQL")


def test_the_private_wait_timeout_still_exists():
    assert hasattr(errors, "_WaitTimeout"), (
        f"psycopg {psycopg.__version__}: psycopg.errors._WaitTimeout is gone; app/store/deadline.py catches it")


def test_the_private_wait_timeout_is_still_an_operational_error():
    wait_timeout = getattr(errors, "_WaitTimeout", None)  # its absence is the test above's failure
    assert wait_timeout is None or issubclass(wait_timeout, psycopg.OperationalError), (
        f"psycopg {psycopg.__version__}: _WaitTimeout is no longer an OperationalError")


def test_a_wait_that_never_becomes_ready_raises_the_private_wait_timeout_on_time(pgconn):
    """psycopg's own Connection.wait, with the wait function it picked here, on a socket that never answers."""
    conn = psycopg.Connection(pgconn)
    started = time.monotonic()
    try:
        conn.wait(never_ready(), timeout=TIMEOUT_S)
    except errors._WaitTimeout:
        pass
    except Exception as exc:
        raise AssertionError(f"psycopg {psycopg.__version__}: a timed-out Connection.wait raised "
                             f"{type(exc).__module__}.{type(exc).__qualname__}, not errors._WaitTimeout; "
                             "app/store/deadline.py catches _WaitTimeout") from exc
    else:
        raise AssertionError(f"psycopg {psycopg.__version__}: Connection.wait returned from a generator "
                             "that never became ready")
    finally:
        pgconn.finish()  # as app/store/deadline.py does: mid-exchange, the connection is not used again
    waited = time.monotonic() - started
    assert TIMEOUT_S <= waited < TIMEOUT_S + 5, f"waited {waited:.2f} s for a timeout of {TIMEOUT_S} s"


def _wait_past_the_deadline(pgconn):
    """A deadline.Connection's wait on a socket that never answers, past its deadline of TIMEOUT_S."""
    conn = deadline.Connection(pgconn)
    conn.deadline = TIMEOUT_S
    conn.wait(never_ready())


def test_the_deadline_connection_raises_not_answering(pgconn):
    with pytest.raises(deadline.NotAnsweringError, match=f"did not answer within {TIMEOUT_S:g} s"):
        _wait_past_the_deadline(pgconn)


def test_the_deadline_connection_closes_itself_when_it_raises(pgconn):
    with pytest.raises(psycopg.OperationalError):
        _wait_past_the_deadline(pgconn)
    assert pgconn.finished, "the connection is left open mid-exchange"


def test_the_pools_private_connect_is_the_one_app_store_db_overrides():
    """db.Pool keeps the last connection failure by overriding ConnectionPool._connect(timeout): a psycopg_pool
    release that renames it or its parameter would silently drop the cause from a PoolTimeout's message."""
    from psycopg_pool import ConnectionPool

    assert list(inspect.signature(ConnectionPool._connect).parameters) == ["self", "timeout"]
