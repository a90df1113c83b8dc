"""Crashes and outages: worker killed mid-transaction, lock expiry, Redis and
PostgreSQL down. Real servers throughout; each test owns what it breaks."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import pytest

from app import __version__
from app.locking.lock import lock_key
from app.store.db import apply_schema
from app.store.deadline import MARGIN_MS
from devservers import ROOT, Postgres, Redis, wait_until

from .helpers import (
    ALICE,
    EVERY_SCHEME_AND_A_NAMED_SOURCE,
    OPENING,
    Answer,
    assert_ledger_consistent,
    balance,
    burst,
    encode,
    event_rows,
    http_get,
    payment,
    send,
)

pytestmark = pytest.mark.core


def _app_backends_waiting(conn):
    """pids of the app's backends blocked on a lock, with the gunicorn worker pid of each."""
    rows = conn.execute("""SELECT pid, application_name FROM pg_stat_activity
                           WHERE application_name LIKE 'webhook-ledger:%%' AND wait_event_type = 'Lock'""")
    return [(pid, int(name.split(":")[1])) for pid, name in rows]


class RowLock:
    """Holds ALICE's balance row, so a delivery blocks inside its transaction."""

    def __init__(self, conn_info):
        self.conn = psycopg.connect(conn_info, autocommit=False)

    def __enter__(self):
        self.conn.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        return self

    def __exit__(self, *exc):
        self.conn.rollback()
        self.conn.close()


def _in_thread(fn, *args, **kwargs):
    result = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


# -- a lock that expires while its delivery is still inside the transaction --

@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_twin_after_lock_expiry_still_credits_once(gunicorn, db, config, redis_client, sign, source):
    # A long lock wait keeps the first delivery in its transaction well past the TTL.
    server = gunicorn(workers=2, threads=2, LOCK_TTL_MS=300, PG_LOCK_TIMEOUT_MS=10000,
                      PG_STATEMENT_TIMEOUT_MS=15000, PG_POOL_TIMEOUT_MS=5000)
    body = encode(payment("evt_slow", cents=40))
    with RowLock(config["DATABASE_URL"]):
        first, first_result = _in_thread(send, server.base, body, sign(body), source=source)
        wait_until(lambda: len(_app_backends_waiting(db)) == 1, what="first delivery blocked")
        wait_until(lambda: not redis_client.exists(lock_key("evt_slow", source)), what="lock expiry")
        second, second_result = _in_thread(send, server.base, body, sign(body), source=source)
        # The twin took the expired lock and now waits on the first's insert.
        wait_until(lambda: len(_app_backends_waiting(db)) == 2, what="second delivery blocked")
        assert redis_client.exists(lock_key("evt_slow", source))
    first.join(30), second.join(30)
    answers = sorted((r["value"][0], r["value"][1]["status"]) for r in (first_result, second_result))
    assert answers == [(200, "duplicate"), (200, "processed")]
    assert balance(db) == 1040
    assert_ledger_consistent(db)


@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_expired_lock_holder_does_not_release_the_new_owners_lock(gunicorn, db, config, redis_client, sign, source):
    server = gunicorn(workers=1, threads=2, LOCK_TTL_MS=300, PG_LOCK_TIMEOUT_MS=10000,
                      PG_STATEMENT_TIMEOUT_MS=15000, PG_POOL_TIMEOUT_MS=5000)
    key = lock_key("evt_owner", source)
    body = encode(payment("evt_owner", cents=60))
    with RowLock(config["DATABASE_URL"]):
        first, result = _in_thread(send, server.base, body, sign(body), source=source)
        wait_until(lambda: len(_app_backends_waiting(db)) == 1, what="delivery blocked")
        wait_until(lambda: not redis_client.exists(key), what="lock expiry")
        # Another delivery (played by the test) now owns the lock.
        assert redis_client.set(key, "new-owner", nx=True, px=30000)
    first.join(30)
    assert result["value"][0] == 200 and result["value"][1]["status"] == "processed"
    assert redis_client.get(key) == b"new-owner"
    assert balance(db) == 1060


# -- a gunicorn worker killed mid-transaction ---------------------------------

@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_a_delivery_whose_worker_is_killed_inside_its_transaction_is_processed_once_on_retry(gunicorn, db, config,
                                                                                           sign, source):
    server = gunicorn(workers=1, threads=2, LOCK_TTL_MS=1000)
    body = encode(payment("evt_crash", cents=333))
    with RowLock(config["DATABASE_URL"]):
        thread, result = _in_thread(send, server.base, body, sign(body), source=source)
        wait_until(lambda: len(_app_backends_waiting(db)) == 1, what="delivery inside its transaction")
        (backend_pid, worker_pid), = _app_backends_waiting(db)
        assert worker_pid in server.worker_pids()
        # The INSERT is done, the credit waits on the row lock: kill the worker now.
        os.kill(worker_pid, signal.SIGKILL)
        thread.join(30)
        # The delivery's statements were sent in one go: PostgreSQL rolls them
        # back when it sees its client gone (client_connection_check_interval,
        # 500 ms) or, at the latest, when the lock wait times out (1 s).
        wait_until(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                      [backend_pid]).fetchone()[0] == 0, what="backend gone")
    assert "error" in result or result["value"][0] >= 500  # the sender saw no 2xx
    assert event_rows(db) == 0
    assert balance(db) == 1000

    # The provider retries; the dead worker's lock expires after LOCK_TTL_MS.
    wait_until(lambda: server.worker_pids(), what="replacement worker")
    answers = []
    wait_until(lambda: answers.append(send(server.base, body, sign(body), source=source)) or answers[-1].status != 409,
               timeout=10, interval=0.2, what="lock expiry")
    assert answers[-1][:2] == (200, {"status": "processed", "event_id": "evt_crash"})
    assert send(server.base, body, sign(body), source=source).json["status"] == "duplicate"
    assert balance(db) == 1333
    assert event_rows(db, source) == 1
    assert_ledger_consistent(db)


# -- Redis down, hung, flushed, restarted -------------------------------------

@pytest.fixture
def own_redis():
    server = Redis().start()
    yield server
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGCONT)
    server.stop()


def _timed(fn, *args, **kwargs):
    started = time.monotonic()
    value = fn(*args, **kwargs)
    return value, time.monotonic() - started


def test_redis_stopped_postgres_alone_deduplicates(make_app, config, db, own_redis):
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    own_redis.stop()
    event = payment("evt_no_redis", cents=5)
    first, first_s = _timed(send, client, event)
    second, second_s = _timed(send, client, event)
    assert first.json["status"] == "processed"
    assert second.json["status"] == "duplicate"
    assert balance(db) == 1005
    # Not a benchmark: redis-py's default retry policy would stall each
    # delivery for seconds; ours makes one attempt and degrades.
    assert max(first_s, second_s) < 2.0, (first_s, second_s)
    ready = client.get("/ready")
    assert (ready.status_code, ready.json["redis"]) == (200, "degraded")


def test_redis_hung_degrades_within_its_socket_timeout(make_app, config, db, own_redis):
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    assert send(client, payment()).json["status"] == "processed"  # connection now pooled
    own_redis.proc.send_signal(signal.SIGSTOP)
    event = payment("evt_hung_redis")
    answer, seconds = _timed(send, client, event)
    assert answer.json["status"] == "processed"
    assert seconds < 2.0, seconds  # one REDIS_TIMEOUT_MS (250 ms) per command, not a stall
    assert send(client, event).json["status"] == "duplicate"


@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_concurrent_twins_with_redis_down_credit_once(gunicorn, db, own_redis, sign, source):
    server = gunicorn(workers=2, threads=4, REDIS_URL=own_redis.url)
    own_redis.stop()
    body = encode(payment("evt_burst_no_redis", cents=70))
    answers = burst([server.base], body, sign(body), twins=30, source=source)
    outcomes = sorted(body["status"] for _, body, _ in answers)
    assert outcomes == ["duplicate"] * 29 + ["processed"]
    assert balance(db) == 1070
    assert event_rows(db, source) == 1


def test_redis_flushed_redelivery_is_duplicate(client, db, redis_client):
    event = payment("evt_flush")
    assert send(client, event).json["status"] == "processed"
    redis_client.flushall()
    assert send(client, event).json["status"] == "duplicate"
    assert balance(db) == 1250


def test_redis_restarted_locks_resume(make_app, config, db, own_redis):
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    own_redis.stop()
    assert send(client, payment()).json["status"] == "processed"
    own_redis.start()  # the same port again
    event = payment("evt_after_restart")
    import redis as redis_lib

    watcher = redis_lib.Redis.from_url(own_redis.url)
    watcher.set(lock_key(event["id"]), "twin", px=10000)
    assert send(client, event).status == 409  # the lock is honoured again
    watcher.delete(lock_key(event["id"]))
    assert send(client, event).json["status"] == "processed"
    assert client.get("/ready").json["redis"] == "ok"


# -- PostgreSQL down and back -------------------------------------------------

@pytest.fixture
def own_postgres():
    base = tempfile.mkdtemp(prefix="webhook-ledger-pg-own-")
    server = Postgres(base).init().start()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        apply_schema(conn)
        for user, cents in OPENING.items():
            conn.execute("INSERT INTO user_balances VALUES (%s, %s)", [user, cents])
    yield server
    server.stop("immediate")
    shutil.rmtree(base, ignore_errors=True)


@EVERY_SCHEME_AND_A_NAMED_SOURCE
def test_postgres_down_is_503_quickly_then_processes_once_when_back(gunicorn, own_postgres, redis_client, sign, source):
    server = gunicorn(workers=1, threads=2, DATABASE_URL=own_postgres.url())
    body = encode(payment("evt_pg_outage", cents=10))
    assert http_get(server.base, "/ready")[0] == 200
    own_postgres.stop()

    (status, answer, headers), seconds = _timed(send, server.base, body, sign(body), source=source)
    assert (status, answer["error"]) == (503, "unavailable")
    assert int(headers["Retry-After"]) >= 1
    assert seconds < 10, seconds  # within the pool timeout, before a sender's timeout
    assert http_get(server.base, "/ready")[0] == 503
    assert http_get(server.base, "/health") == (200, {"status": "ok", "version": __version__})
    # Every answer while down was a 503 and released its lock.
    assert not redis_client.exists(lock_key("evt_pg_outage", source))

    own_postgres.start()
    answers = []
    wait_until(lambda: answers.append(send(server.base, body, sign(body), source=source)) or answers[-1].status == 200,
               timeout=20, interval=0.2, what="recovery")
    assert {a[0] for a in answers[:-1]} <= {503}
    assert answers[-1][1]["status"] == "processed"
    assert send(server.base, body, sign(body), source=source).json["status"] == "duplicate"
    with psycopg.connect(own_postgres.url()) as conn:
        assert balance(conn) == 1010
        assert event_rows(conn, source) == 1
        assert_ledger_consistent(conn)


def _delivered_while_its_row_is_held(client, db, config, redis_client, event):
    """event delivered while ALICE's balance row is held elsewhere, past PG_LOCK_TIMEOUT_MS. Its answer, how long
    that took, and what it left while the row was still held: its event rows, and whether its Redis lock remained."""
    with RowLock(config["DATABASE_URL"]):
        response, seconds = _timed(send, client, event)
        left = (event_rows(db), redis_client.exists(lock_key(event["id"])))
    return response, seconds, left


def test_postgres_slow_is_503_after_the_lock_timeout(client, db, config, redis_client):
    """A row held elsewhere past PG_LOCK_TIMEOUT_MS: a clean 503, not a hung sender."""
    response, seconds, _ = _delivered_while_its_row_is_held(client, db, config, redis_client, payment("evt_pg_slow"))
    assert (response.status, response.json["error"]) == (503, "unavailable")
    assert int(response.headers["Retry-After"]) >= 1
    assert seconds < 10, seconds  # the lock timeout (1 s), well before a sender's timeout


def test_a_delivery_503d_by_the_lock_timeout_commits_nothing(client, db, config, redis_client):
    """Nothing written, its lock released: the provider's retry, once the row is free, processes it once."""
    event = payment("evt_pg_slow", cents=20)
    _, _, left = _delivered_while_its_row_is_held(client, db, config, redis_client, event)
    assert left == (0, 0)  # no event row, no lock left
    assert send(client, event).json["status"] == "processed"
    assert balance(db) == 1020


# -- PostgreSQL frozen: the server answers nothing, its kernel still ACKs -----

@pytest.fixture
def freeze(own_postgres):
    """Stop every process of own_postgres with SIGSTOP, as a hung storage layer stops them; thawed after.

    Returns a function that freezes it, and thaws it when called with thaw=True.
    Each backend is a session of its own: the postmaster first, then each child.
    """
    frozen = []

    def freeze_or_thaw(thaw=False):
        if thaw:
            for pid in frozen:
                # The postmaster first: it reaps a child that was exiting as it froze, which is then gone.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            frozen.clear()
            return
        postmaster = int((own_postgres.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)
        frozen.append(postmaster)
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        for pid in map(int, children):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)

    yield freeze_or_thaw
    freeze_or_thaw(thaw=True)


# Small timeouts, so that the test is short; the bound is derived from them.
FROZEN_TIMEOUTS = {"PG_LOCK_TIMEOUT_MS": 500, "PG_STATEMENT_TIMEOUT_MS": 1000, "PG_POOL_TIMEOUT_MS": 1500}
# The pool's wait, then one round trip's deadline (a pooler's queue, bounded as the pool's wait, the
# statement, deadline.MARGIN_MS), then slack for a shared host.
FROZEN_BOUND_S = (1500 + 1500 + 1000 + MARGIN_MS) / 1000 + 1.5


def _frozen_settings(config, own_postgres):
    return {**config, **FROZEN_TIMEOUTS, "DATABASE_URL": own_postgres.url(), "PG_POOL_SIZE": 2}


def _client_of_a_frozen_postgres(make_app, config, own_postgres, freeze):
    """An app that credited 1 cent and pooled its connections (their sockets idle), then own_postgres frozen."""
    client = make_app(_frozen_settings(config, own_postgres)).test_client()
    assert send(client, payment("evt_before_the_freeze", cents=1)).json["status"] == "processed"
    assert client.get("/ready").status_code == 200
    freeze()
    return client


def _answered_within_the_bound(ask):
    """ask()'s answer and how long it took, failing at once if it hangs past FROZEN_BOUND_S."""
    thread, result = _in_thread(_timed, ask)
    thread.join(FROZEN_BOUND_S + 5)
    assert not thread.is_alive(), "no answer: the request hangs on the frozen server"
    return result["value"]


def test_frozen_postgres_is_503_within_a_bound(make_app, config, own_postgres, redis_client, freeze):
    client = _client_of_a_frozen_postgres(make_app, config, own_postgres, freeze)
    frozen_event = payment("evt_while_frozen", cents=10)
    for ask in [lambda: send(client, frozen_event)] * 3 + [lambda: Answer.of(client.get("/ready"))] * 2:
        response, seconds = _answered_within_the_bound(ask)
        assert (response.status, response.json.get("error") or response.json["status"]) in [
            (503, "unavailable")], response.json
        assert "Retry-After" in response.headers
        assert seconds < FROZEN_BOUND_S, seconds


def test_a_delivery_503d_by_a_frozen_postgres_is_credited_once_after_the_thaw(make_app, config, own_postgres,
                                                                              redis_client, freeze):
    """Its statements may have been committed after its 503 (they were sent); the provider's retry finds it."""
    client = _client_of_a_frozen_postgres(make_app, config, own_postgres, freeze)
    frozen_event = payment("evt_while_frozen", cents=10)
    assert _answered_within_the_bound(lambda: send(client, frozen_event))[0].status == 503
    freeze(thaw=True)
    answers = []
    wait_until(lambda: answers.append(send(client, frozen_event)) or answers[-1].status == 200,
               timeout=20, interval=0.2, what="recovery")
    assert answers[-1].json["status"] in ("processed", "duplicate")
    with psycopg.connect(own_postgres.url()) as conn:
        assert balance(conn) == 1011
        assert_ledger_consistent(conn)


def test_the_cli_on_a_frozen_postgres_fails_within_a_bound_in_one_line(config, own_postgres, freeze):
    env = {"PATH": os.environ["PATH"], **{name: str(value) for name, value in _frozen_settings(config,
                                                                                             own_postgres).items()}}
    freeze()
    for command in (["events", "list"], ["ledger", "verify"], ["init-db"]):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", *command], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=FROZEN_BOUND_S + 30)
        assert time.monotonic() - started < FROZEN_BOUND_S + 5  # the interpreter's start on a shared host
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr.startswith("Error: database unavailable: ") and done.stderr.count("\n") == 1, done
        assert own_postgres.url().split("@")[0] not in done.stderr
