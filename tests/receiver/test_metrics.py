"""app/receiver/metrics.py: GET /metrics in one process (Flask client) and across
gunicorn workers (multiprocess mode, child_exit, the directory wiped at start)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.locking.lock import lock_key
from devservers import ROOT, wait_until
from tests.helpers import SECRET, UNKNOWN_USER, encode, http_get, payment, samples, send, signed_headers

pytestmark = pytest.mark.core


def deliveries(scraped, outcome, reason="", source="default"):
    labels = (("outcome", outcome), ("reason", reason), ("source", source))
    return scraped.get(("webhook_ledger_deliveries_total", labels), 0)


def latency_count(scraped):
    return sum(v for (name, _), v in scraped.items() if name == "webhook_ledger_delivery_duration_seconds_count")


# -- one process ------------------------------------------------------------------

def test_each_outcome_is_counted(client, db, redis_client):
    send(client, payment("evt_1"))
    send(client, payment("evt_1"))
    send(client, payment("evt_1", cents=1))                     # payload_mismatch
    send(client, payment(user=UNKNOWN_USER))                    # failed (422)
    redis_client.set(lock_key("evt_busy"), "twin", px=10000)
    send(client, payment("evt_busy"))                           # in_progress
    send(client, payment(), secret="wrong")                     # rejected
    send(client, b"{", signed_headers(b"{"))                    # rejected (400)
    send(client, b"{}", {"Content-Type": "text/plain"})         # rejected (415)
    client.get("/health")                                       # not a delivery

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    scraped = samples(response.text)
    assert {outcome: deliveries(scraped, outcome) for outcome in
            ("processed", "duplicate", "payload_mismatch", "failed", "in_progress")} == \
        {"processed": 1, "duplicate": 1, "payload_mismatch": 1, "failed": 1, "in_progress": 1}
    assert deliveries(scraped, "rejected", "invalid_signature") == 1
    assert deliveries(scraped, "rejected", "invalid_json") == 1
    assert deliveries(scraped, "rejected", "unsupported_media_type") == 1
    assert latency_count(scraped) == 8
    assert scraped[("webhook_ledger_redis_degraded_deliveries_total", ())] == 0
    assert scraped[("webhook_ledger_db_pool_max_connections", ())] == 4
    assert scraped[("webhook_ledger_db_pool_waiting_requests", ())] == 0
    assert 1 <= scraped[("webhook_ledger_db_pool_connections", ())] <= 4


def test_unavailable_and_redis_degraded_are_counted(make_app, config, db):
    app = make_app({**config, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
                    "REDIS_URL": "redis://127.0.0.1:1/0", "PG_POOL_TIMEOUT_MS": 300})
    client = app.test_client()
    assert send(client, payment()).status == 503
    scraped = samples(client.get("/metrics").text)
    assert deliveries(scraped, "unavailable") == 1
    assert scraped[("webhook_ledger_redis_degraded_deliveries_total", ())] == 1


# -- across gunicorn workers ----------------------------------------------------------

def _scrape(base):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        return samples(response.read().decode())


def _scrape_ok(base):
    try:
        return _scrape(base) is not None
    except urllib.error.HTTPError:
        return False


def _delivery_pids(log_path):
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return {line["pid"] for line in lines if line.get("message") == "delivery"}


def _one_round(base, redis_client, n):
    """Send one known mix of deliveries at once; return how many of each were sent."""
    def post(event, secret=SECRET):
        body = encode(event)
        return send(base, body, secret=secret)

    redis_client.set(lock_key(f"evt_busy_{n}"), "twin", px=60000)
    sends = [lambda: post(payment(f"evt_{n}_a")), lambda: post(payment(f"evt_{n}_b", cents=2)),
             lambda: post(payment(user=UNKNOWN_USER)), lambda: post(payment(f"evt_busy_{n}")),
             lambda: post(payment(), secret="wrong")]
    barrier = threading.Barrier(len(sends))

    def run(send):
        barrier.wait()
        return send()

    with ThreadPoolExecutor(len(sends)) as pool:
        statuses = sorted(status for status, _, _ in pool.map(run, sends))
    assert statuses == [200, 200, 401, 409, 422]
    # Then a duplicate and a mismatch of this round's first event.
    assert post(payment(f"evt_{n}_a")).json["status"] == "duplicate"
    assert post(payment(f"evt_{n}_a", cents=3)).json["error"] == "payload_mismatch"
    return {"processed": 2, "failed": 1, "in_progress": 1, "rejected": 1, "duplicate": 1, "payload_mismatch": 1}


def test_totals_add_up_across_workers_whichever_answers_the_scrape(gunicorn, db, redis_client, tmp_path):
    server = gunicorn(workers=2, threads=2)
    log_path = tmp_path / "gunicorn-0.log"
    sent, rounds = {}, 0
    # Rounds until the log shows two workers served deliveries.
    while rounds < 30 and len(_delivery_pids(log_path)) < 2:
        for outcome, count in _one_round(server.base, redis_client, rounds).items():
            sent[outcome] = sent.get(outcome, 0) + count
        rounds += 1
    assert len(_delivery_pids(log_path)) >= 2, "every delivery went to one worker"

    for _ in range(6):
        scraped = _scrape(server.base)
        for outcome, count in sent.items():
            reason = "invalid_signature" if outcome == "rejected" else ""
            assert deliveries(scraped, outcome, reason) == count, (outcome, scraped)
        assert latency_count(scraped) == sum(sent.values())
        assert scraped[("webhook_ledger_db_pool_max_connections", ())] in (4, 8)  # per live worker, 2 at most


def test_the_metrics_directory_is_wiped_at_start(gunicorn, db, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"left over from an earlier run")
    gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    assert not (metrics_dir / "counter_999999.db").exists()


def test_a_dead_worker_leaves_its_counts_but_not_its_live_gauges(gunicorn, db, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    body = encode(payment())
    assert send(server.base, body).status == 200
    assert deliveries(_scrape(server.base), "processed") == 1
    live = {int(p.stem.rsplit("_", 1)[1]) for p in metrics_dir.glob("gauge_livesum_*.db")}
    assert live and live <= set(server.worker_pids())

    victim = live.pop()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not (metrics_dir / f"gauge_livesum_{victim}.db").exists(), what="child_exit hook")
    wait_until(lambda: len(server.worker_pids()) == 2, what="replacement worker")
    assert deliveries(_scrape(server.base), "processed") == 1  # a dead worker's counts still count


def test_a_worker_boots_after_a_cleaner_removed_the_metrics_folder(gunicorn, db, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    body = encode(payment())
    assert send(server.base, body).status == 200

    shutil.rmtree(metrics_dir)  # what a /tmp cleaner does
    assert _scrape(server.base) is not None  # the workers running now still answer a scrape
    for victim in server.worker_pids():  # each worker in turn is replaced
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda victim=victim: server.proc.poll() is not None or
                   (len(server.worker_pids()) == 2 and victim not in server.worker_pids()),
                   what="a replacement worker, or the master's exit")
        assert server.proc.poll() is None, "gunicorn's master stopped: the new worker failed to boot"

    assert metrics_dir.is_dir()
    body = encode(payment())
    assert send(server.base, body).status == 200
    assert http_get(server.base, "/health")[0] == 200
    for _ in range(4):  # whichever worker answers the scrape
        assert deliveries(_scrape(server.base), "processed") >= 1
    assert server.proc.poll() is None


def test_an_empty_file_left_by_a_worker_killed_at_boot_stops_no_scrape(gunicorn, db, tmp_path):
    """prometheus-client creates a worker's file and sizes it after: a worker killed in between leaves it empty,
    and every scrape failed on it (prometheus/client_python#1199) until gunicorn was restarted."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGSTOP)
    (metrics_dir / f"summary_{victim}.db").touch()  # what it would leave, killed between the two
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(server.worker_pids()) == 2 and victim not in server.worker_pids(), what="a new worker")
    # The new worker may itself be between creating and sizing its files for a moment (the same upstream
    # window): wait for its first good scrape. Before the fix no scrape ever succeeded again.
    wait_until(lambda: _scrape_ok(server.base), timeout=10, what="a scrape that succeeds")
    for _ in range(4):  # whichever worker answers the scrape
        assert _scrape(server.base) is not None


# -- what `flask` commands apply: counted by the service's next scrape -------------

def _flask(env, *args):
    return subprocess.run([sys.executable, "-m", "flask", "--app", "app", *args], cwd=ROOT,
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60)


def _credited(scraped):
    return scraped.get(("webhook_ledger_payments_credited_total", (("source", "default"),)), 0)


def test_credits_a_replay_makes_reach_metrics_once(gunicorn, config, db, tmp_path):
    metrics_dir = tmp_path / "metrics"
    server = gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    for number in range(3):
        body = encode(payment(f"evt_cli_{number}", user=UNKNOWN_USER, cents=100))
        assert send(server.base, body).status == 422
    assert _credited(_scrape(server.base)) == 0
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])

    shell = {**config, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}  # the service's folder
    done = _flask(shell, "events", "replay", "--all-failed")
    assert done.returncode == 0 and done.stderr == "", done
    assert done.stdout.endswith("replayed 3 failed events: 3 completed, 0 still failed\n")
    assert [path.name for path in metrics_dir.glob("commands-*.json")] != []  # left for the next scrape

    assert _credited(_scrape(server.base)) == 3
    assert _credited(_scrape(server.base)) == 3  # once, whichever worker answers
    assert list(metrics_dir.glob("commands-*")) == []
    deliveries_total = sum(v for (name, _), v in _scrape(server.base).items()
                           if name == "webhook_ledger_deliveries_total")
    assert deliveries_total == 3  # a replay is no delivery: only the three 422s


def test_a_read_only_command_leaves_nothing_in_the_metrics_folder(gunicorn, config, db, tmp_path):
    metrics_dir = tmp_path / "metrics"
    server = gunicorn(workers=1, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    _scrape(server.base)
    before = sorted(path.name for path in metrics_dir.iterdir())
    done = _flask({"DATABASE_URL": config["DATABASE_URL"], "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
                  "events", "list")
    assert (done.returncode, done.stdout) == (0, "no events\n"), done
    assert sorted(path.name for path in metrics_dir.iterdir()) == before


def test_a_replay_says_in_one_line_when_its_counts_cannot_reach_metrics(client, config, db, tmp_path):
    assert send(client, payment("evt_cli", user=UNKNOWN_USER)).status == 422
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    missing = tmp_path / "not-there"
    done = _flask({**config, "PROMETHEUS_MULTIPROC_DIR": str(missing)}, "events", "replay", "evt_cli")
    assert (done.returncode, done.stdout) == (0, "evt_cli: processed; now completed\n"), done
    assert done.stderr == (f"metrics: what this command applied is not counted in /metrics: "
                           f"PROMETHEUS_MULTIPROC_DIR {missing} is not a folder (is the service running?)\n")
