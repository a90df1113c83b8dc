"""Throwaway servers for the tests: a private PostgreSQL cluster, redis-server
and gunicorn, each on a free loopback port, each stopped by its owner."""

import http.client
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout=15.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def pg_bindir():
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not versions:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
    return versions[-1]


class Postgres:
    """A private cluster under base_dir; run as `postgres` when we are root."""

    def __init__(self, base_dir):
        self.dir = Path(base_dir)
        self.data = self.dir / "data"
        self.port = free_port()
        self.host, self.user, self.password, self.options = "127.0.0.1", "postgres", "", ""
        self.bindir = pg_bindir()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args, **kw):
        return subprocess.run(self._as + list(args), check=True, capture_output=True, **kw)

    def init(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
        return self

    def start(self):
        # fsync stays on: the crash tests rely on COMMIT meaning durable.
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
                " -c max_connections=200 -c shared_buffers=64MB")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts,
                  "-l", str(self.dir / "log"), "-w", "-t", "30", "start")
        return self

    def stop(self, mode="fast"):
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        except subprocess.CalledProcessError:
            pass

    def url(self, dbname="postgres"):
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
    """The real server, with the committed gunicorn.conf.py."""

    def __init__(self, env, workers=2, threads=4, log_path=None):
        self.port = free_port()
        self.env = {**os.environ, **env, "PORT": str(self.port),
                    "WEB_CONCURRENCY": str(workers), "GUNICORN_THREADS": str(threads)}
        self.log_path = log_path
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "wsgi:app"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
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
        return f"http://127.0.0.1:{self.port}"

    def worker_pids(self):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def _request(base, method, path, body=None, headers=None, timeout=30):
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null"), dict(response.getheaders())
    finally:
        conn.close()


def http_post(base, body, headers, timeout=30):
    """POST body; return (status, parsed JSON body, headers). Raises on connection errors."""
    return _request(base, "POST", "/api/webhooks", body, headers, timeout)


def http_get(base, path, timeout=10):
    """GET path; return (status, parsed JSON body)."""
    return _request(base, "GET", path, timeout=timeout)[:2]
