"""gunicorn settings for production; every value can be overridden on the
command line or through GUNICORN_CMD_ARGS."""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gunicorn import glogging


def _leaf(name):
    """app/serving/<name>.py (it imports nothing of the app), loaded by its path under a name of its own."""
    # Not imported as app.serving.<name>: the package `app` would enter the master, and a HUP's workers run old code.
    folder = Path(__file__).with_name("app")  # a checkout, or the image's /app
    if not folder.is_dir():  # an installed host: share/webhook-ledger/ holds this file, site-packages the app
        folder = Path(importlib.util.find_spec("app").submodule_search_locations[0])  # found, not imported
    spec = importlib.util.spec_from_file_location(f"webhook_ledger_{name}", folder / "serving" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_logformat, _worker = _leaf("logformat"), _leaf("gunicorn_worker")

bind = os.environ.get("BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
# One process per core this process may run on (a container's CPU set, not
# the host's); threads overlap each delivery's waits on PostgreSQL and Redis,
# one pooled connection each (PG_POOL_SIZE). No other shape did better
# (docs/performance.md).
workers = int(os.environ.get("WEB_CONCURRENCY", len(os.sched_getaffinity(0))))
# gthread, with a deadline on each request's arrival (REQUEST_READ_TIMEOUT_SECONDS):
# a sender that stalls mid-request holds a thread for that deadline at most (app/serving/gunicorn_worker.py).
worker_class = _worker.ThreadWorker
threads = int(os.environ.get("GUNICORN_THREADS", os.environ.get("PG_POOL_SIZE", "4")))
# Under gthread, a heartbeat of the worker as a whole, not a limit on a
# request: the app's own timeouts end a request (docs/deploying.md), the
# longest after 11 s (a vanished database host). 30 s is above all of them
# and above LOCK_TTL_MS (10 s).
timeout = 30
graceful_timeout = 20
keepalive = 5
# The app opens its database pool lazily in each worker, after the fork.
preload_app = False
# gunicorn 27's control socket defaults to one path per user, shared by every
# gunicorn on the host (tests, bench, `make run`); this service does not use it.
control_socket_disable = True

# -- logs: one line per record on stdout, gunicorn's and the app's ----------
# app/serving/logformat.py formats them, loaded alone: importing the app into the master
# would stop a HUP from loading new code into the new workers.
# The app logs one line per delivery (app/receiver/logs.py); gunicorn's access line
# repeated it at about a tenth of a worker's CPU (docs/performance.md), so it
# is off unless ACCESS_LOG=true, and requests that are not deliveries
# (/health, /ready, /metrics) are not logged.
accesslog = "-" if os.environ.get("ACCESS_LOG", "false").strip().lower() == "true" else None
errorlog = "-"


class AccessLogWhenAsked(glogging.Logger):
    """gunicorn writes the access line whenever logconfig_dict is set (always
    here), whatever `accesslog` says; this writes it only when accesslog is set."""

    def access(self, resp, req, environ, request_time):
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)


logger_class = AccessLogWhenAsked
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms request_id=%({x-request-id}o)s'
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"stdout": {"()": _logformat.stdout_formatter}},
    "handlers": {
        "stdout": {"class": "logging.StreamHandler", "formatter": "stdout", "stream": "ext://sys.stdout"},
    },
    "root": {"level": "INFO", "handlers": ["stdout"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
        "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
    },
}

# -- metrics: prometheus-client's multiprocess mode -------------------------
# Set here, before any worker imports prometheus_client; a private folder
# (removed on exit) when the environment names none.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="webhook-ledger-metrics-")
    _PRIVATE_METRICS_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"]
else:
    _PRIVATE_METRICS_DIR = None


# -- a configuration error stops gunicorn, master included -----------------
# sysexits.h's EX_CONFIG, as `flask` commands exit on a configuration error:
# a supervisor tells it from a crash, and restarting will not help.
EX_CONFIG = 78
# What the master runs in a child process to check the settings, and the ledger's currency (app/store/db.py).
_CHECK_SETTINGS = "from app.store.db import check_at_start; check_at_start()"


def on_starting(server):
    problem = _settings_problem() or _read_timeout_problem()
    if problem:
        # One line, naming the setting; no worker is started. Measured: left to
        # the workers (wsgi.py exits 3), 4 workers print it 4 times and
        # gunicorn 27's master dies of its own traceback with status 1.
        server.log.error("webhook-ledger: %s", problem)
        on_exit(server)
        sys.exit(EX_CONFIG)
    # Counts left by an earlier run would be added to this one's.
    for path in glob.glob(os.path.join(_metrics_dir(), "*.db")):
        os.remove(path)


def post_fork(server, worker):
    # A worker cannot boot without its metrics folder, and gunicorn's master
    # stops when one fails to: a folder a /tmp cleaner removed is made again
    # (its counts are lost: Prometheus sees a reset).
    _metrics_dir()


def _metrics_dir():
    """PROMETHEUS_MULTIPROC_DIR, made if it is missing."""
    path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _settings_problem():
    """Parse the settings as a worker will; return the configuration error's message, or None.

    In a child process, on the master's sys.path: no module of the app may enter
    the master, or the workers that a HUP forks would run its old code.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _CHECK_SETTINGS], env=env, capture_output=True, text=True)
    if done.returncode == EX_CONFIG:
        return done.stderr.strip().splitlines()[-1]  # the message is the last line (a warning may come first)
    # Anything else (no app to import, say) is left to the workers, which fail
    # the same way, and gunicorn stops.
    return None


def _read_timeout_problem():
    try:
        _worker.read_timeout(os.environ)
    except ValueError as exc:
        return f"configuration error: {exc}"
    return None


def child_exit(server, worker):
    # A dead worker's gauges must stop counting; its counters still do.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
    # prometheus-client creates a worker's file, then sizes it: a worker killed
    # in between (at boot, say) leaves an empty file that fails every later
    # scrape (prometheus/client_python#1199, open). Empty, it held no counts.
    for path in glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"*_{worker.pid}.db")):
        if os.path.getsize(path) == 0:
            os.remove(path)


def on_exit(server):
    if _PRIVATE_METRICS_DIR:
        shutil.rmtree(_PRIVATE_METRICS_DIR, ignore_errors=True)
