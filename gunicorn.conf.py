"""gunicorn settings for production; every value can be overridden on the
command line or through GUNICORN_CMD_ARGS."""

import glob
import os
import shutil
import tempfile

from gunicorn import glogging

bind = os.environ.get("BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
# One process per core this process may run on (a container's CPU set, not
# the host's); threads overlap each delivery's waits on PostgreSQL and Redis.
# The database pool has one connection per thread (PG_POOL_SIZE). On 2 cores,
# 2 workers x 4 threads measured best (docs/performance.md: 1x8, 2x8, 3x4
# and 4x2 were slower); re-measured after the logging and Redis changes, 4x2
# and 8x1 were not better beyond the shared machine's noise.
workers = int(os.environ.get("WEB_CONCURRENCY", len(os.sched_getaffinity(0))))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", os.environ.get("PG_POOL_SIZE", "4")))
# Outermost timeout: above LOCK_TTL_MS (10 s), itself above the pool acquire
# (3 s), statement (2 s) and lock wait (1 s) timeouts, so an inner one
# always fails first with a clean 503 instead of a killed worker.
timeout = 30
graceful_timeout = 20
keepalive = 5
# The app opens its database pool lazily in each worker, after the fork.
preload_app = False
# gunicorn 27's control socket defaults to one path per user, shared by every
# gunicorn on the host (tests, bench, `make run`); this service does not use it.
control_socket_disable = True

# -- logs: one line per record on stdout, gunicorn's and the app's ----------
# The app's loggers propagate to the root handler; gunicorn's two loggers are
# sent there too. logformat.py (not the app: importing the app into the
# master would stop a HUP from loading new code into the new workers) writes
# JSON lines, or human lines when stdout is a terminal (`make run`).
# One line per delivery is the app's (app/logs.py: method, path, status,
# bytes, latency, request id, and the event's id, type and outcome), so
# gunicorn's access line is off unless ACCESS_LOG=true: it repeated that line
# for every delivery, at about a tenth of a worker's CPU (docs/performance.md).
# With it off, requests that are not deliveries (/health, /ready, /metrics)
# are not logged.
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
    "formatters": {"stdout": {"()": "logformat.stdout_formatter"}},
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
# Every worker writes its metrics to files in this folder and a scrape merges
# them. It must be set before a worker imports prometheus_client; when the
# environment names none, a private one is made (and removed on exit).
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="webhook-ledger-metrics-")
    _PRIVATE_METRICS_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"]
else:
    _PRIVATE_METRICS_DIR = None


def on_starting(server):
    # Counts left by an earlier run would be added to this one's.
    for path in glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], "*.db")):
        os.remove(path)


def child_exit(server, worker):
    # A dead worker's gauges must stop counting; its counters still do.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _PRIVATE_METRICS_DIR:
        shutil.rmtree(_PRIVATE_METRICS_DIR, ignore_errors=True)
