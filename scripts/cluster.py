"""`make cluster`: production's shape on loopback, ready to be sent a signed
webhook through haproxy.

haproxy (deploy/haproxy.cfg) in front of 3 gunicorn hosts (gunicorn.conf.py),
PgBouncer in transaction pooling mode (deploy/pgbouncer.ini) in front of a
private PostgreSQL, and a Redis Cluster of 3 primaries and 3 replicas: the
same devservers.topology code that tests/deploy/test_topology.py starts. Everything
lives in a fresh temporary folder (its logs too), removed on exit. Ctrl-C,
SIGTERM or SIGHUP stops all of it; a host that dies is reported and the
others keep serving (haproxy routes around it).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# devservers (the throwaway servers) is test tooling, not installed with the
# app: the scripts import it from the checkout they belong to.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.settings.config import from_env
from app.store.db import apply_schema
from devservers.demo import add_demo_user, banner, check_settings
from devservers.packages import GROUPS, program
from devservers.supervise import Failed, logger, port_free, say, supervise
from devservers.topology import Topology

# 3 app hosts share this machine: gunicorn.conf.py's one worker per core on
# each would be 3x the cores; 2 workers x 4 threads each is what the
# topology tests run.
HOST_WORKERS, HOST_THREADS = 2, 4
# haproxy's, where `make run` has 8000: both can run at once.
DEFAULT_PORT = 8080
# Enough of each server's log to see why it stopped, not a screenful each.
LOG_TAIL_LINES = 5

log = logger("cluster")


def main():
    return supervise(run, log)


def run(cleanup):
    for name in GROUPS["cluster"]:
        try:
            program(name)
        except RuntimeError as exc:
            raise Failed(str(exc)) from None
    secret_from_env = check_settings(log)

    port = int(os.environ.get("PORT") or DEFAULT_PORT)
    if not port_free("127.0.0.1", port):
        raise Failed(f"port {port} is already in use (another `make cluster`?); stop that, or run with PORT=<another>")

    base = tempfile.mkdtemp(prefix="webhook-ledger-cluster.")
    cleanup.callback(shutil.rmtree, base, ignore_errors=True)
    log(f"starting PostgreSQL, PgBouncer, a Redis Cluster (6 nodes), 3 gunicorn hosts and haproxy in {base}")
    # The hosts get the settings of this environment, the topology's URLs win.
    env = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "REDIS_URL", "PORT")}
    topology = Topology(base, env, workers=HOST_WORKERS, threads=HOST_THREADS, port=port)
    cleanup.callback(stop, topology)
    started = time.monotonic()
    try:
        topology.start(prepare)
    except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError, psycopg.Error) as exc:
        raise Failed(f"the topology did not come up: {exc}\n{log_tails(base)}") from None
    log(f"up in {time.monotonic() - started:.1f} s")

    config = from_env({**os.environ, **topology.app_env})
    say(describe(topology, base))
    say(banner(topology.base, "evt_demo_1", 0, config, secret_from_env, external=False))
    reported = set()
    while True:
        time.sleep(1)
        for i, host in enumerate(topology.hosts):
            if host.proc.poll() is not None and i not in reported:
                reported.add(i)
                log(f"host{i + 1} (pid {host.proc.pid}) exited with {host.proc.returncode}; "
                    "haproxy sends its requests to the others")


def log_tails(base):
    """The end of every server's log: the folder is removed on exit."""
    tails = []
    for path in sorted(Path(base).rglob("*log")):
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            tails.append("\n".join([f"--- {path.relative_to(base)}", *lines]))
    return "\n".join(tails)


def prepare(conninfo):
    """The schema and the demo user, as the app's own role."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        apply_schema(conn)
        add_demo_user(conn)


def describe(topology, base):
    hosts = "\n".join(f"  host{i + 1}      http://127.0.0.1:{port}  (/metrics, /ready, /openapi.json here;"
                      f" log: {base}/host{i + 1}/gunicorn.log)"
                      for i, port in enumerate(topology.host_ports))
    nodes = " ".join(str(node.port) for node in topology.redis.nodes)
    return f"""
haproxy      {topology.base}  (/api/webhooks only; deploy/haproxy.cfg; log: {base}/haproxy/haproxy.log)
{hosts}
PgBouncer    127.0.0.1:{topology.pgbouncer.port}, transaction pooling (deploy/pgbouncer.ini)
PostgreSQL   127.0.0.1:{topology.pg.port}
Redis Cluster  127.0.0.1 ports {nodes}  (primaries: {' '.join(map(str, topology.redis.primaries()))})
"""


def stop(topology):
    log("stopping haproxy, the hosts, the Redis Cluster, PgBouncer and PostgreSQL")
    topology.stop()


if __name__ == "__main__":
    sys.exit(main())
