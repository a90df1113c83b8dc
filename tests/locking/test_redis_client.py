"""app/locking/redis_client.py on real redis-servers: a Redis that answers with an
error (an ACL without EVALSHA, OOM, MOVED, CROSSSLOT) is a fault, not an
outage. Deliveries go on, decided by PostgreSQL; the fault is logged at ERROR
at most once per interval, counted by reason, and /ready reports it."""

import logging
import shutil
import tempfile

import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from app.locking import redis_client
from app.locking.lock import done_key, lock_key
from devservers import Redis
from devservers.topology import RedisCluster
from tests.helpers import balance, payment, send

# One worker of `make test` (pytest-xdist) starts the Redis Cluster, once for the module.
pytestmark = [pytest.mark.core, pytest.mark.xdist_group("redis-cluster")]

# The ACL user the app logs in as in the NOPERM test; its password must never be logged.
APP_USER, APP_PASSWORD = "ledger", "redis-s3cret-pw"


@pytest.fixture
def own_redis():
    server = Redis().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _capture_app_logs(caplog):
    caplog.set_level(logging.INFO, logger="app")


def _faults(client, reason):
    """webhook_ledger_redis_faults_total{reason} as scraped from the app's /metrics."""
    wanted = f'webhook_ledger_redis_faults_total{{reason="{reason}"}} '
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith(wanted)]
    return float(lines[0].split()[-1]) if lines else 0.0


def _errors(caplog, reason):
    return [r for r in caplog.records if r.levelno == logging.ERROR and f"redis fault {reason} " in r.getMessage()]


def test_an_acl_without_evalsha_is_a_noperm_fault_logged_once(make_app, config, db, own_redis, caplog):
    admin = redis.Redis.from_url(own_redis.url)
    admin.acl_setuser(APP_USER, enabled=True, passwords=[f"+{APP_PASSWORD}"], keys=["*"],
                      commands=["+@all", "-eval", "-evalsha", "-script"])
    url = f"redis://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{own_redis.port}/0"
    client = make_app({**config, "REDIS_URL": url}).test_client()

    events = [payment(f"evt_noperm_{n}", cents=10) for n in range(5)]
    assert [send(client, e).json["status"] for e in events] == ["processed"] * 5
    assert send(client, events[0]).json["status"] == "duplicate"  # PostgreSQL decided
    assert balance(db) == 1050

    (logged,) = _errors(caplog, "NOPERM")  # six faults, one ERROR line
    assert "no permissions to run the 'evalsha' command" in logged.getMessage()
    assert _faults(client, "NOPERM") == 6
    ready = client.get("/ready")
    assert (ready.status_code, ready.json) == (200, {"status": "ok", "postgres": "ok", "redis": "degraded",
                                                     "redis_reason": "NOPERM"})
    deliveries = [r for r in caplog.records if r.getMessage() == "delivery"]
    assert {r.redis for r in deliveries} == {"degraded"} and {r.redis_fault for r in deliveries} == {"NOPERM"}
    assert not [r for r in caplog.records if r.levelno == logging.WARNING and "redis" in r.getMessage()]
    assert APP_PASSWORD not in caplog.text and "evt_noperm" not in "".join(r.getMessage() for r in _errors(
        caplog, "NOPERM"))


def _delivered_twice_to_a_redis_out_of_memory(make_app, config, own_redis):
    """One event delivered twice while every write to Redis is refused (OOM); the client and the two answers."""
    admin = redis.Redis.from_url(own_redis.url)
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write is refused: OOM
    event = payment("evt_oom", cents=7)
    return client, [send(client, event) for _ in range(2)]


def test_deliveries_go_on_while_redis_is_out_of_memory(make_app, config, db, own_redis):
    _, answers = _delivered_twice_to_a_redis_out_of_memory(make_app, config, own_redis)
    assert [answer.json["status"] for answer in answers] == ["processed", "duplicate"]
    assert balance(db) == 1007


def test_out_of_memory_is_a_fault(make_app, config, db, own_redis, caplog):
    client, _ = _delivered_twice_to_a_redis_out_of_memory(make_app, config, own_redis)
    assert len(_errors(caplog, "OOM")) == 1
    assert _faults(client, "OOM") == 2
    assert client.get("/ready").json["redis_reason"] == "OOM"  # the probe's 1 ms lock is a write too


def test_a_fault_is_reported_again_after_the_interval_with_its_count(make_app, config, db, own_redis, caplog,
                                                                    monkeypatch):
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    redis.Redis.from_url(own_redis.url).config_set("maxmemory", 1)
    monkeypatch.setattr(redis_client, "FAULT_INTERVAL", 0.0)  # every fault is past the interval
    for n in range(3):
        assert send(client, payment(f"evt_oom_{n}")).status == 200
    assert len(_errors(caplog, "OOM")) == 3
    monkeypatch.setattr(redis_client, "FAULT_INTERVAL", 3600.0)
    for n in range(4):
        send(client, payment(f"evt_oom_more_{n}"))
    assert len(_errors(caplog, "OOM")) == 3  # none past the interval now
    monkeypatch.setattr(redis_client, "FAULT_INTERVAL", 0.0)
    send(client, payment("evt_oom_last"))
    assert "seen 5 times since its last report" in _errors(caplog, "OOM")[-1].getMessage()


def test_ready_is_ok_again_once_a_fault_is_older_than_the_interval(make_app, config, db, own_redis, monkeypatch):
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    admin = redis.Redis.from_url(own_redis.url)
    admin.config_set("maxmemory", 1)
    send(client, payment("evt_oom_then_fixed"))
    admin.config_set("maxmemory", 0)  # fixed
    assert client.get("/ready").json["redis_reason"] == "OOM"  # seen less than a minute ago
    monkeypatch.setattr(redis_client, "FAULT_INTERVAL", 0.0)
    assert client.get("/ready").json == {"status": "ok", "postgres": "ok", "redis": "ok"}


def _delivered_with_redis_gone(make_app, config, own_redis):
    """A delivery after the app's Redis stopped; the client."""
    client = make_app({**config, "REDIS_URL": own_redis.url}).test_client()
    own_redis.stop()
    assert send(client, payment("evt_redis_gone")).json["status"] == "processed"
    return client


def test_unreachable_redis_stays_a_warning(make_app, config, db, own_redis, caplog):
    client = _delivered_with_redis_gone(make_app, config, own_redis)
    assert [r.levelname for r in caplog.records if "redis" in r.getMessage()] == ["WARNING"]
    assert "redis unavailable, event 'evt_redis_gone' proceeds unlocked" in caplog.text
    assert "webhook_ledger_redis_faults_total{" not in client.get("/metrics").text


def test_unreachable_redis_makes_ready_degraded(make_app, config, db, own_redis):
    client = _delivered_with_redis_gone(make_app, config, own_redis)
    assert client.get("/ready").json == {"status": "ok", "postgres": "ok", "redis": "degraded",
                                         "redis_reason": "unavailable"}


def test_a_flushed_script_cache_is_reloaded_not_a_fault(client, db, redis_client, caplog):
    """NOSCRIPT after a restart or a failover: the script is loaded again, the delivery keeps its lock."""
    assert send(client, payment("evt_before_flush")).json["status"] == "processed"
    redis_client.script_flush()
    event = payment("evt_after_flush")
    assert send(client, event).json["status"] == "processed"
    assert redis_client.exists(done_key("evt_after_flush"))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_cluster_that_is_down_at_start_only_degrades(make_app, config, db):
    """The cluster client asks for the slot map as it is made: made at first use, not in create_app."""
    client = make_app({**config, "REDIS_CLUSTER": "true", "REDIS_URL": "redis://127.0.0.1:1"}).test_client()
    assert send(client, payment("evt_no_cluster")).json["status"] == "processed"
    assert client.get("/ready").json["redis_reason"] == "unavailable"


@pytest.mark.unit
@pytest.mark.parametrize("exc, reason", [
    (redis.exceptions.ConnectionError("Error 111 connecting"), "unavailable"),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), "unavailable"),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "unavailable"),
    (redis.exceptions.NoPermissionError("this user has no permissions", status_code="NOPERM"), "NOPERM"),
    (redis.exceptions.AuthenticationError("invalid username-password pair", status_code="WRONGPASS"), "WRONGPASS"),
    (redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
     "WRONGTYPE"),
    (redis.exceptions.ResponseError("not an error code"), "ResponseError"),
    (redis.exceptions.ClusterError("TTL exhausted."), "ClusterError"),
    (redis.exceptions.RedisClusterException("EVALSHA - all keys must map to the same key slot"), "CROSSSLOT"),
])
def test_failures_are_told_apart(exc, reason):
    assert redis_client.reason_of(exc) == reason


# -- on a real Redis Cluster (3 primaries, no replicas: failover is tests/deploy/test_topology.py's) --

@pytest.fixture(scope="module")
def cluster():
    base = tempfile.mkdtemp(prefix="webhook-ledger-redis-cluster-")
    nodes = RedisCluster(base, primaries=3, replicas=0).start()
    yield nodes
    nodes.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cluster_client(cluster):
    client = ClusterClient.from_url(cluster.url)
    client.flushall()
    yield client
    client.close()


def test_deliveries_on_a_cluster_lock_and_mark_done_in_their_slot(make_app, config, db, cluster, cluster_client):
    app = make_app({**config, "REDIS_CLUSTER": "true", "REDIS_URL": cluster.url})
    client = app.test_client()
    events = [payment(f"evt_cluster_{n}", cents=1) for n in range(12)]
    assert [send(client, e).json["status"] for e in events] == ["processed"] * 12
    served_by = {cluster.primary_of(done_key(e["id"])) for e in events}
    assert len(served_by) == 3  # the markers are spread over every primary
    assert all(cluster_client.exists(done_key(e["id"])) for e in events)
    app.extensions["db_pool"].close()  # a re-delivery now needs Redis alone
    assert [send(client, e).json["status"] for e in events] == ["duplicate"] * 12
    assert client.get("/ready").json["redis"] == "ok"


def test_a_plain_client_against_a_cluster_is_a_moved_fault(make_app, config, db, cluster, caplog):
    """REDIS_CLUSTER forgotten: the node answers MOVED for the slots it does not serve."""
    event_id = next(f"evt_moved_{n}" for n in range(100)
                    if cluster.primary_of(lock_key(f"evt_moved_{n}")) != cluster.nodes[0].port)
    client = make_app({**config, "REDIS_URL": cluster.url}).test_client()
    assert send(client, payment(event_id)).json["status"] == "processed"
    assert len(_errors(caplog, "MOVED")) == 1
    assert _faults(client, "MOVED") == 1
    assert client.get("/ready").json["redis"] == "degraded"


def test_an_id_beginning_with_a_brace_keeps_its_two_keys_in_one_slot(make_app, config, db, cluster, cluster_client):
    """The hash tag starts with the source's name (app/locking/lock.py): no id splits an event's keys, no CROSSSLOT."""
    client = make_app({**config, "REDIS_URL": cluster.url, "REDIS_CLUSTER": "true"}).test_client()
    event = payment("}odd{id}", cents=3)
    assert send(client, event).json["status"] == "processed"
    assert (_faults(client, "CROSSSLOT"), _faults(client, "MOVED")) == (0, 0)
    assert cluster_client.exists(done_key(event["id"]))  # the marker was written: the script ran
    assert send(client, event).json["status"] == "duplicate"
    assert balance(db) == 1003


def test_forget_done_on_a_cluster_empties_every_primary(make_app, config, db, cluster, cluster_client):
    app = make_app({**config, "REDIS_CLUSTER": "true", "REDIS_URL": cluster.url})
    client = app.test_client()
    events = [payment(f"evt_forget_{n}", cents=1) for n in range(12)]
    for event in events:
        assert send(client, event).json["status"] == "processed"
    assert len({cluster.primary_of(done_key(e["id"])) for e in events}) == 3
    cluster_client.set(lock_key("evt_in_flight"), "token", px=60000)
    result = app.test_cli_runner().invoke(args=["redis", "forget-done"])
    assert result.output.startswith("forgot 12 done markers"), result.output
    assert list(cluster_client.scan_iter(match="done:*")) == []  # scans every primary
    assert cluster_client.exists(lock_key("evt_in_flight"))
    app.extensions["db_pool"].close()  # Redis alone would answer "duplicate"; PostgreSQL cannot answer now
    assert send(client, events[0]).status == 503


def test_the_acl_that_docs_operations_md_names_is_enough(make_app, config, db, own_redis, caplog):
    redis.Redis.from_url(own_redis.url).execute_command(
        "ACL", "SETUSER", APP_USER, "on", f">{APP_PASSWORD}", "resetkeys", "~lock:webhook:*", "~done:webhook:*",
        "-@all", "+evalsha", "+script|load", "+get", "+set", "+del", "+scan", "+unlink")
    app = make_app({**config, "REDIS_URL": f"redis://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{own_redis.port}/0"})
    client = app.test_client()
    event = payment("evt_acl")
    assert send(client, event).json["status"] == "processed"
    assert send(client, event).json["status"] == "duplicate"
    assert [r.redis for r in caplog.records if r.getMessage() == "delivery"] == ["acquired", "done"]
    assert client.get("/ready").json["redis"] == "ok"
    assert app.test_cli_runner().invoke(args=["redis", "forget-done"]).output.startswith("forgot 1 done markers")
