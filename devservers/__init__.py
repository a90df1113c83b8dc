"""Throwaway servers on loopback, for the tests, `make run` and `make bench`:
a private PostgreSQL cluster, redis-server and gunicorn, each on a free port,
each stopped by its owner; Prometheus, for the dashboard test.
devservers.topology adds haproxy, PgBouncer and a Redis Cluster, for the
topology tests and `make cluster`; devservers.peer the receiver `make bench`
compares with. The scripts' supervision is in devservers.supervise."""

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import port_for

ROOT = Path(__file__).resolve().parent.parent


# The ports free_port handed out in this process: servers chosen together
# (a Redis Cluster's nodes and bus ports) never get the same one.
_GIVEN: set[int] = set()


def free_port():
    """A port nothing uses now, outside the kernel's ephemeral range, so that no
    outgoing connection (a readiness probe's, say) takes it before its server
    binds it, and never one this process handed out already. Under pytest-xdist,
    never one another worker of the session may pick (see _worker_share)."""
    index, count = _worker_share()
    ports = {port for port in port_for.available_good_ports() if port % count == index}
    port = port_for.select_random(ports, exclude_ports=_GIVEN)
    _GIVEN.add(port)
    return port


def _worker_share():
    """(this worker's index, the number of workers) of a pytest-xdist session, else (0, 1). Each worker picks
    its ports among those equal to its index modulo the count: two workers never race to bind one port, and a
    port a test freed (a server it stopped, to see it refused) is not another worker's meanwhile. The servers
    and scripts a test starts inherit the variables, and so the share."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def wait_until(predicate, timeout=15.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def children(pid):
    """The pids of pid's children, read from /proc (no procps needed: `make run`
    runs on a machine holding only the README's prerequisites)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces: the fields after it are fixed.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def descendants(pid):
    """pid and all its descendants."""
    pids = [pid]
    for child in children(pid):
        pids += descendants(child)
    return pids


def answers_tcp(port):
    """Whether something accepts connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_group(proc, timeout):
    """SIGTERM proc's process group (a server started in a session of its own), SIGKILL it after timeout."""
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def pg_bindir():
    """The folder of pg_ctl and initdb: pg_ctl's on PATH, else the newest
    /usr/lib/postgresql/<version>/bin (Debian keeps them off PATH)."""
    found = shutil.which("pg_ctl")
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda d: [int(n) for n in d.parent.name.split(".") if n.isdigit()], reverse=True)
    for bindir in ([Path(found).resolve().parent] if found else []) + versions:
        if (bindir / "pg_ctl").exists() and (bindir / "initdb").exists():
            return bindir
    raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")


class Postgres:
    """A private cluster under base_dir; run as `postgres` when we are root.
    Its Unix socket goes to socket_dir (default base_dir): ~100 bytes at most."""

    def __init__(self, base_dir, socket_dir=None):
        self.dir = Path(base_dir)
        self.socket_dir = Path(socket_dir or base_dir)
        self.data = self.dir / "data"
        self.port = free_port()
        self.host, self.user, self.password, self.options = "127.0.0.1", "postgres", "", ""
        self.bindir = pg_bindir()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args, **kw):
        # From /: the postgres user may not be allowed into our working directory.
        return subprocess.run(self._as + list(args), check=True, capture_output=True, cwd="/", **kw)

    def init(self, reuse=False):
        """initdb; with reuse, keep the cluster that an earlier init left in data."""
        for folder in {self.dir, self.socket_dir}:
            folder.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                pw = pwd.getpwnam("postgres")
                os.chown(folder, pw.pw_uid, pw.pw_gid)
        if reuse and (self.data / "PG_VERSION").exists():
            return self
        if reuse:
            shutil.rmtree(self.data, ignore_errors=True)  # an interrupted initdb's leftovers
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
        return self

    def start(self):
        # fsync stays on: the crash tests rely on COMMIT meaning durable.
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k '{self.socket_dir}'"
                " -c max_connections=200 -c shared_buffers=64MB")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts,
                  "-l", str(self.dir / "log"), "-w", "-t", "30", "start")
        return self

    def running(self):
        """Whether a server runs on data (e.g. one left by a killed owner)."""
        status = subprocess.run(self._as + [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"],
                                capture_output=True, cwd="/")
        return status.returncode == 0

    def stop(self, mode="fast"):
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        except subprocess.CalledProcessError:
            pass

    def createdb(self, dbname):
        self._run(str(self.bindir / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user, dbname)
        return self.url(dbname)

    def url(self, dbname="postgres"):
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"


class Redis:
    """redis-server without persistence. With workdir, its pid file (redis.pid)
    and log (redis.log) are kept there; with new_session, the terminal's
    Ctrl-C does not reach it: its owner stops it. args are appended to its
    command line."""

    def __init__(self, workdir=None, new_session=False, args=()):
        self.port = free_port()
        self.workdir = Path(workdir) if workdir else None
        self.new_session = new_session
        self.args = list(args)  # more redis-server options, e.g. a cluster node's
        self.proc = None

    def start(self):
        files = ["--loglevel", "warning"]
        if self.workdir:
            files = ["--dir", str(self.workdir), "--pidfile", str(self.workdir / "redis.pid"),
                     "--logfile", str(self.workdir / "redis.log"), "--loglevel", "notice"]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", *files, *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=self.new_session,
        )
        wait_until(self._answers, what="redis-server")
        return self

    def _answers(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


class Gunicorn:
    """The real server, with the committed gunicorn.conf.py, in a session of
    its own. workers or threads None leaves them to gunicorn.conf.py; log_path
    "-" sends its output to ours (a terminal gets human-readable logs); port
    None picks a free one, and host is where /health is asked. root is the
    checkout served (another commit's tree, for the upgrade test)."""

    def __init__(self, env, workers=2, threads=4, log_path=None, port=None, host="127.0.0.1", root=ROOT):
        self.root = Path(root)
        self.port = port or free_port()
        self.host = host
        sizes = {"WEB_CONCURRENCY": workers, "GUNICORN_THREADS": threads}
        self.env = {**os.environ, **env, "PORT": str(self.port),
                    **{name: str(value) for name, value in sizes.items() if value is not None}}
        self.log_path = log_path
        self.proc = None

    def start(self):
        if self.log_path == "-":
            out = err = None
        else:
            out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            err = subprocess.STDOUT
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(self.root / "gunicorn.conf.py"), "wsgi:app"],
            cwd=self.root, env=self.env, stdout=out, stderr=err, start_new_session=True,
        )
        wait_until(self._healthy, timeout=20, what="gunicorn /health")
        return self

    def _healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"{self.base}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def base(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def worker_pids(self):
        return children(self.proc.pid)

    def settings(self):
        """workers, threads and worker_class as gunicorn.conf.py resolves them in this server's environment."""
        with tempfile.TemporaryDirectory() as metrics_dir:  # so that the config makes no folder of its own
            out = subprocess.run(
                [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--print-config", "wsgi:app"],
                cwd=ROOT, env={**self.env, "PROMETHEUS_MULTIPROC_DIR": metrics_dir},
                capture_output=True, text=True, check=True).stdout
        return dict(re.findall(r"^(workers|threads|worker_class)\s+= (.*)$", out, re.M))

    def stop(self):
        stop_group(self.proc, 20)


class Prometheus:
    """A Prometheus server (Debian's `prometheus`) scraping targets (host:port,
    /metrics) every interval, its configuration and data under workdir."""

    def __init__(self, workdir, targets, interval="1s", binary="prometheus"):
        self.dir = Path(workdir)
        self.targets = list(targets)
        self.interval = interval
        self.binary = binary
        self.port = free_port()
        self.proc = None

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": self.interval, "scrape_timeout": self.interval},
                  "scrape_configs": [{"job_name": "webhook-ledger", "static_configs": [{"targets": self.targets}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=open(self.dir / "prometheus.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._ready, timeout=30, what="prometheus /-/ready")
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: see {self.dir / 'prometheus.log'}")
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def api(self, path, **params):
        """GET /api/v1/<path> with params; return its `data`."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.load(r)
        if answer["status"] != "success":
            raise RuntimeError(f"prometheus: {answer}")
        return answer["data"]

    def query(self, expr):
        """An instant query's result: a list of {metric, value}."""
        return self.api("query", query=expr)["result"]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
