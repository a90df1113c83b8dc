"""Production's shape (devservers.topology, as `make cluster` runs it):
haproxy in front of 3 gunicorn hosts, PgBouncer in transaction mode in front
of PostgreSQL, and a Redis Cluster of 3 primaries and 3 replicas.

Each test sends a storm of events, each with its twins at once, spread over
haproxy and each host directly, while one part fails; then it plays the
provider, retrying every event not yet answered 2xx. After that, every event
is credited exactly once, nothing answered 500, and the ledger balances. The
storm's answers are printed (pytest -s) for the record."""

import http.client
import json
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import psycopg
import pytest
import redis

from app.locking.lock import done_key, lock_key
from app.store.db import apply_schema
from devservers import wait_until
from devservers.topology import APP_USER, DB_NAME, Topology

from ..helpers import ALICE, BOB, OPENING, SECRET, assert_ledger_consistent, balance, encode, payment, signed_headers

# One worker of `make test` (pytest-xdist) starts the topology, once for the module.
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("topology")]

# What every host runs with besides the topology's URLs.
ENV = {
    "WEBHOOK_SECRET": SECRET,
    # Above PG_POOL_TIMEOUT_MS (3 s), as the timeouts' nesting asks, and well
    # under the default 10 s so that the locks of a killed host expire within
    # the provider's retries of one test.
    "LOCK_TTL_MS": "4000",
}
LOCK_TIMEOUT_S = 1.0  # PG_LOCK_TIMEOUT_MS's default, which the hosts run with
STATEMENT_TIMEOUT_S = 2.0  # PG_STATEMENT_TIMEOUT_MS's default
# A storm: 100 events x 6 twins. Each event's twins are sent together, one
# to each of haproxy and the 3 hosts (and 2 more round the ring), by 24
# senders, so ~4 events are contended on every host at any moment; 1-4 s
# on 2 cores, long enough for a fault to land in the middle.
EVENTS, TWINS, SENDERS = 100, 6, 24
FAULT_AT = 0.25  # the fault starts once this share of the storm is answered
# The provider's retries: every 250 ms (Retry-After says 1 s; a test has no
# day to wait), for at most 30 s, above the 4 s lock TTL of a killed host.
RETRY_PAUSE_S, RETRY_FOR_S = 0.25, 30.0
# How long the host-kill test lets its own delivery wait on a held row before
# the kill: far past a delivery's few ms, well under the 1 s lock timeout.
IN_TRANSACTION_S = 0.3
HTTP_TIMEOUT_S = 40  # above haproxy's `timeout server` (35 s): its answer, not ours
# What a storm may be answered while something fails, besides 200. No 500, ever.
TRANSIENT = {"409 in_progress", "503 unavailable"}
# What the provider retries: "come back later" and gateway failures; not a 500 or a 4xx.
RETRIED = ("409 ", "502 ", "503 ", "504 ", "connection error", "cut answer")


class Answer(NamedTuple):
    event_id: str
    target: str  # the base URL it was sent to
    outcome: str  # "200 processed", "409 in_progress", "connection error", ...
    sent: float
    answered: float


def post(base, event):
    """Deliver event once to base; return its outcome as status and answer."""
    body = encode(event)
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=HTTP_TIMEOUT_S)
    try:
        conn.request("POST", "/api/webhooks", body=body, headers=signed_headers(body))
        response = conn.getresponse()
    except (OSError, http.client.HTTPException):
        conn.close()
        return "connection error"  # refused, reset, or closed without an answer
    try:
        status, raw = response.status, response.read()
    except (OSError, http.client.HTTPException):
        # gunicorn writes an answer's head and its body in two writes: a host killed between them leaves
        # a status line and no body, which haproxy relays as it came (it cannot resend a started answer).
        return "cut answer"
    finally:
        conn.close()
    try:
        answer = json.loads(raw)
    except ValueError:
        return f"{status} not JSON"  # e.g. haproxy's own error page
    return f"{status} {answer.get('status') or answer.get('error')}"


def storm(targets, events, fault=None):
    """TWINS of each event at once over targets; fault() runs once FAULT_AT of them are answered.
    Return the answers and the fault's (start, end)."""
    deliveries = [(event, targets[(i + k) % len(targets)]) for i, event in enumerate(events) for k in range(TWINS)]
    answers, window, errors = [], [], []
    enough = threading.Event()

    def send(delivery):
        event, target = delivery
        sent = time.monotonic()
        answers.append(Answer(event["id"], target, post(target, event), sent, time.monotonic()))
        if len(answers) >= FAULT_AT * len(deliveries):
            enough.set()

    def break_something():
        enough.wait()
        window.append(time.monotonic())
        try:
            fault()
        except Exception as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        window.append(time.monotonic())

    breaker = threading.Thread(target=break_something) if fault else None
    if breaker:
        breaker.start()
    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(send, deliveries))
    if breaker:
        enough.set()
        breaker.join()
        if errors:
            raise errors[0]
        start, end = window
        # Mid-storm: answered before it began, and still sending after it ended.
        assert any(a.answered < start for a in answers) and any(a.sent > end for a in answers), \
            f"the fault ({end - start:.2f} s) did not land inside the storm"
    return answers, (tuple(window) or None)


def retry_until_acknowledged(base, events, answers):
    """The provider: each event that has no 2xx yet is sent again through haproxy until it gets one."""
    acknowledged = {a.event_id for a in answers if a.outcome.startswith("200 ")}
    retries = []

    def retry(event):
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            sent = time.monotonic()
            retries.append(Answer(event["id"], base, post(base, event), sent, time.monotonic()))
            if not retries[-1].outcome.startswith(RETRIED):
                return  # acknowledged, or an answer that a retry will not change (the test fails on it)
            time.sleep(RETRY_PAUSE_S)

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(retry, [e for e in events if e["id"] not in acknowledged]))
    return retries


def assert_exactly_once(db, events, opening, answers, retries, allowed=TRANSIENT):
    """Every event acknowledged, processed at most once, stored once and credited once; nothing else answered."""
    everything = answers + retries
    unexpected = Counter(a.outcome for a in everything if not a.outcome.startswith("200 ") and a.outcome not in allowed)
    assert not unexpected, unexpected
    acknowledged = {a.event_id for a in everything if a.outcome.startswith("200 ")}
    assert acknowledged == {e["id"] for e in events}, "events never acknowledged"
    processed = Counter(a.event_id for a in everything if a.outcome == "200 processed")
    assert max(processed.values(), default=0) <= 1, processed.most_common(3)
    rows = dict(db.execute("SELECT event_id, status FROM webhook_events WHERE event_id = ANY(%s)",
                           [[e["id"] for e in events]]).fetchall())
    assert rows == {e["id"]: "completed" for e in events}
    for user, before in opening.items():
        credits = sum(e["data"]["amountCents"] for e in events if e["data"]["userId"] == str(user))
        assert balance(db, user) == before + credits, user
    assert_ledger_consistent(db)


def report(name, answers, retries, window=None):
    """The record the closing note quotes: how the storm and the provider's retries were answered."""
    took = max(a.answered for a in answers) - min(a.sent for a in answers)
    fault = f", the fault {window[1] - window[0]:.2f} s of it" if window else ""
    print(f"\n[topology] {name}: storm ({took:.2f} s{fault}) {dict(Counter(a.outcome for a in answers).most_common())}"  # noqa: T201
          f"; retries {dict(Counter(a.outcome for a in retries).most_common())}")


def make_events(tag, seed):
    rng = random.Random(seed)  # the same storm on every run
    return [payment(f"evt_{tag}_{i}", user=rng.choice([ALICE, BOB]), cents=rng.randint(1, 5000))
            for i in range(EVENTS)]


# -- the topology, once for the module ----------------------------------------

def _prepare(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        apply_schema(conn)
        for user, cents in OPENING.items():
            conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s)", [user, cents])


@pytest.fixture(scope="module")
def topology():
    # Not pytest's tmp_path: PostgreSQL's and PgBouncer's user must reach it, and root's is 0700.
    base = tempfile.mkdtemp(prefix="webhook-ledger-topology-")
    started = time.monotonic()
    topology = Topology(base, ENV, workers=2, threads=4)
    try:
        topology.start(_prepare)
        print(f"\n[topology] started in {time.monotonic() - started:.1f} s")  # noqa: T201
        yield topology
    finally:
        topology.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def db(topology):
    """PostgreSQL itself, not through PgBouncer, as its superuser: the ledger's checks."""
    with psycopg.connect(topology.pg.url(DB_NAME), autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def cluster_client(topology):
    client = redis.RedisCluster.from_url(topology.redis.url, decode_responses=True)
    yield client
    client.close()


def targets(topology):
    """haproxy and every host directly, as the twins of one event arrive."""
    return [topology.base] + [host.base for host in topology.hosts]


def transactions(topology):
    """How many transactions PgBouncer has passed to the ledger's database so far."""
    return sum(s["total_xact_count"] for s in topology.pgbouncer.show("STATS") if s["database"] == DB_NAME)


def waiting_on_locks(db):
    """How many of the app's transactions wait for a row lock now."""
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
                      [APP_USER]).fetchone()[0]


class RowHeld:
    """A user's balance row locked from outside the app, until at least one delivery waits on it
    inside its transaction (and then for the block's duration, well under the lock timeout)."""

    def __init__(self, topology, db, user):
        self.conninfo, self.db, self.user = topology.pg.url(DB_NAME), db, user

    def __enter__(self):
        self.holder = psycopg.connect(self.conninfo)
        self.holder.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [self.user])
        wait_until(lambda: waiting_on_locks(self.db) > 0, timeout=5, what="a delivery inside its transaction")
        return self

    def __exit__(self, *exc):
        self.holder.rollback()
        self.holder.close()


def openings(db):
    return {user: balance(db, user) for user in OPENING}


# -- the storms -----------------------------------------------------------------

def test_storm_over_three_hosts_credits_each_event_once(topology, db, cluster_client):
    events, opening = make_events("storm", 1), openings(db)
    routed = topology.haproxy.sessions()
    xacts_before = transactions(topology)

    answers, _ = storm(targets(topology), events)
    retries = retry_until_acknowledged(topology.base, events, answers)
    report("no fault", answers, retries)
    assert_exactly_once(db, events, opening, answers, retries, allowed={"409 in_progress"})

    # haproxy spread its share over all 3 hosts, and the ledger's transactions went through PgBouncer.
    assert all(topology.haproxy.sessions()[name] > before for name, before in routed.items()), routed
    assert transactions(topology) - xacts_before >= len(events)
    # The Redis Cluster served every event: each one's done marker is there, no lock is left.
    assert all(cluster_client.exists(done_key(e["id"])) for e in events)
    assert not any(cluster_client.exists(lock_key(e["id"])) for e in events)


@pytest.fixture
def host2_back(topology):
    """The killed host is started again on its port, and haproxy sees it UP, for the next test."""
    yield 1
    if topology.hosts[1].proc.poll() is not None:
        topology.start_host(1)
    wait_until(lambda: topology.haproxy.states()["host2"] == "UP", timeout=10, what="haproxy: host2 UP again")


def test_host_killed_mid_storm_credits_each_event_once(topology, db, host2_back):
    events, opening = make_events("host_killed", 2), openings(db)
    victim = host2_back
    host2 = topology.hosts[victim].base
    # One more event, sent straight to host2 while ALICE's row is held: it dies inside its transaction.
    inside = payment("evt_host_killed_inside", user=ALICE, cents=11)
    resent_before = topology.haproxy.resent()
    cut = []

    def kill_with_a_transaction_open():
        with RowHeld(topology, db, ALICE):
            sender = threading.Thread(target=lambda: cut.append(post(host2, inside)))
            sender.start()
            time.sleep(IN_TRANSACTION_S)
            assert sender.is_alive(), cut
            topology.kill_host(victim)
        sender.join(HTTP_TIMEOUT_S)

    answers, window = storm(targets(topology), events, kill_with_a_transaction_open)
    events.append(inside)
    retries = retry_until_acknowledged(topology.base, events, answers)
    resent, redispatched = (after - before for after, before in zip(topology.haproxy.resent(), resent_before,
                                                                    strict=True))
    report(f"host2 SIGKILLed (master and workers); haproxy resent {resent}, {redispatched} to another host",
           answers, retries, window)
    assert cut == ["connection error"]
    # Twins sent straight to the dead host cannot be answered; the provider retries them.
    # An answer cut by the kill between its head and its body is retried by the provider too.
    assert_exactly_once(db, events, opening, answers, retries,
                        allowed=TRANSIENT | {"connection error", "cut answer"})
    # Only those: haproxy sent its own requests for host2 to the live hosts, and its checks took host2 out.
    names = {topology.base: "haproxy", **{h.base: f"host{i + 1}" for i, h in enumerate(topology.hosts)}}
    refused = Counter(names[a.target] for a in answers if a.outcome == "connection error")
    assert set(refused) == {"host2"}, refused
    cut_short = Counter(names[a.target] for a in answers if a.outcome == "cut answer")
    assert set(cut_short) <= {"haproxy", "host2"}, cut_short
    wait_until(lambda: topology.haproxy.states()["host2"] == "DOWN", timeout=5, what="haproxy: host2 DOWN")


def test_pgbouncer_restarted_mid_storm_credits_each_event_once(topology, db):
    events, opening = make_events("pgbouncer_restart", 3), openings(db)

    def restart_with_transactions_open():
        # ALICE's row held, so that some deliveries are surely inside their transactions when it goes.
        with RowHeld(topology, db, ALICE):
            topology.pgbouncer.restart()

    answers, window = storm(targets(topology), events, restart_with_transactions_open)
    retries = retry_until_acknowledged(topology.base, events, answers)
    report("PgBouncer restarted (SIGTERM: every connection cut)", answers, retries, window)
    assert_exactly_once(db, events, opening, answers, retries)
    # The deliveries cut inside their transactions answered 503, and their retries processed them.
    assert Counter(a.outcome for a in answers)["503 unavailable"] > 0


def test_redis_primary_failed_over_mid_storm_credits_each_event_once(topology, db, cluster_client):
    events, opening = make_events("redis_failover", 4), openings(db)
    primary = topology.redis.primary_of(lock_key(events[0]["id"]))
    replica = topology.redis.replica_of(primary)

    answers, window = storm(targets(topology), events, lambda: topology.redis.failover(replica))
    retries = retry_until_acknowledged(topology.base, events, answers)
    report(f"Redis primary {primary} failed over to {replica}", answers, retries, window)
    assert_exactly_once(db, events, opening, answers, retries)

    topology.redis.wait_healthy()  # the old primary now follows the new one
    assert topology.redis.primary_of(lock_key(events[0]["id"])) == replica
    # The hosts follow the new primary: one more delivery of each is a duplicate,
    # and its done marker is written there.
    again = Counter(post(topology.base, event) for event in events)
    assert again == {"200 duplicate": len(events)}, again
    assert all(cluster_client.exists(done_key(e["id"])) for e in events)


def test_lock_wait_through_pgbouncer_is_503_after_the_lock_timeout(topology, db):
    """A row held elsewhere: the lock timeout, set inside the transaction, holds through PgBouncer."""
    event, opening = payment("evt_topology_lock_wait", cents=7), openings(db)
    with psycopg.connect(topology.pg.url(DB_NAME)) as holder:
        holder.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [ALICE])
        started = time.monotonic()
        outcome = post(topology.base, event)
        seconds = time.monotonic() - started
    print(f"\n[topology] lock wait through PgBouncer: {outcome} after {seconds:.2f} s")  # noqa: T201
    assert outcome == "503 unavailable"
    # About the lock timeout: not sooner, and before the statement timeout would have answered.
    assert LOCK_TIMEOUT_S * 0.9 <= seconds < STATEMENT_TIMEOUT_S, seconds
    assert db.execute("SELECT count(*) FROM webhook_events WHERE event_id = %s", [event["id"]]).fetchone()[0] == 0
    assert post(topology.base, event) == "200 processed"
    assert balance(db, ALICE) == opening[ALICE] + 7
    assert_ledger_consistent(db)
