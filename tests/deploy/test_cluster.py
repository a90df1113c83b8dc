"""scripts/cluster.py (`make cluster`) as a user runs it: it prints a signed
curl that answers processed then duplicate through haproxy, and Ctrl-C
(SIGINT) stops every server it started."""

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from devservers import ROOT, free_port, wait_until

from ..helpers import read_banner, send

pytestmark = pytest.mark.deploy

# Starting 11 servers takes ~10 s on 2 cores; a busy CI machine gets 6x that.
START_TIMEOUT_S = 60
DEMO_USER = "00000000-0000-4000-8000-000000000001"


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_make_cluster_serves_the_printed_curl_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "scripts/cluster.py"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err, text=True, env={**_env(), "PORT": str(port)})
    try:
        try:
            banner = read_banner(proc, START_TIMEOUT_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stderr.read_text()}") from None
        base = f"http://127.0.0.1:{port}"
        assert f"haproxy      {base}" in banner
        body = re.search(r"^BODY='(.*)'$", banner, re.M)[1].encode()
        curl = next(line for line in banner.splitlines() if line.startswith("curl "))
        assert f" {base}/api/webhooks " in curl
        headers = dict(h.split(": ", 1) for h in re.findall(r"-H '([^']*)'", curl))
        assert send(base, body, headers)[:2] == (200, {"status": "processed", "event_id": "evt_demo_1"})
        assert send(base, body, headers)[:2] == (200, {"status": "duplicate", "event_id": "evt_demo_1"})
        # The printed psql command's URL goes through PgBouncer and shows the credit.
        database_url = re.search(r"^psql (postgresql://\S+) -c", banner, re.M)[1]
        with psycopg.connect(database_url, autocommit=True) as conn:
            assert conn.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s",
                                [DEMO_USER]).fetchone() == (1000,)
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        status = proc.wait(60)
    log = stderr.read_text()
    assert status == 128 + signal.SIGINT, log
    base_dir = re.search(r" in (/\S+webhook-ledger-cluster\.\S+)$", log, re.M)[1]
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", banner)]
    ports += [int(p) for p in re.search(r"ports ([\d ]+)", banner)[1].split()]
    assert len(set(ports)) == 1 + 3 + 2 + 6, ports  # haproxy, hosts, PgBouncer and PostgreSQL, Redis nodes
    wait_until(lambda: not any(_answers(p) for p in ports), timeout=10, what="every port closed")
    left = subprocess.run(["pgrep", "-af", base_dir], capture_output=True, text=True).stdout
    assert left == "", left
    assert not Path(base_dir).exists()


def _env():
    # The demo secret and the servers' own URLs: nothing from the test's environment leaks in.
    return {name: value for name, value in os.environ.items()
            if not name.startswith(("WEBHOOK_", "DATABASE_URL", "REDIS_"))}
