"""gunicorn settings for production; every value can be overridden on the
command line or through GUNICORN_CMD_ARGS."""

import os

bind = os.environ.get("BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
# One process per core this process may run on (a container's CPU set, not
# the host's); threads overlap each delivery's waits on PostgreSQL and Redis.
# The database pool has one connection per thread (PG_POOL_SIZE).
workers = int(os.environ.get("WEB_CONCURRENCY", len(os.sched_getaffinity(0))))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", os.environ.get("PG_POOL_SIZE", "4")))
# Outermost timeout: above LOCK_TTL_MS (10 s), itself above the pool acquire
# (3 s), statement (2 s) and lock wait (1 s) timeouts, so an inner one
# always fails first with a clean 503 instead of a killed worker.
timeout = 30
graceful_timeout = 20
keepalive = 5
accesslog = "-"
errorlog = "-"
# The app opens its database pool lazily in each worker, after the fork.
preload_app = False
# gunicorn 27's control socket defaults to one path per user, shared by every
# gunicorn on the host (tests, bench, `make run`); this service does not use it.
control_socket_disable = True
