# webhook-ledger: gunicorn serving the Flask app (see docs/deploying.md, "With Docker").
#   docker build -t webhook-ledger .
#   docker run --rm -p 8000:8000 -e DATABASE_URL=... -e REDIS_URL=... -e WEBHOOK_SECRET=... webhook-ledger
#   docker run --rm -e DATABASE_URL=... -e REDIS_URL=... -e WEBHOOK_SECRET=... webhook-ledger flask --app app init-db
# tests/deploy/test_image.py builds it with podman on a Debian-made Python base
# (BASE_IMAGE) and runs it against throwaway PostgreSQL and Redis.

# Any image with Python 3.11+, pip and useradd, pip and python on PATH.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="webhook-ledger" org.opencontainers.image.version="1.0.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, the exact versions and hashes of requirements.lock
# (`make lock`), so that this layer is rebuilt when they change, not on every
# code change, and two builds install the same bytes. The app runs from /app
# (not installed as a package), so app/store/schema.py finds /app/schema.sql and
# /app/migrations through the links in app/.
# PIP_CERT: a CA bundle for pip on a network that re-signs TLS; mount it for
# the build only (`--volume /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro
# --build-arg PIP_CERT=/run/host-ca.crt` with podman); unset, pip's own is used.
ARG PIP_CERT
COPY requirements.lock ./
# pip check: the build fails if the lock lacks a dependency of this Python's.
RUN pip install --require-hashes --no-deps -r requirements.lock && pip check

# Not root, and no home directory: nothing writes one (gunicorn.conf.py
# disables gunicorn's control socket; prometheus-client's files go to a
# temporary directory).
RUN useradd --no-create-home --home-dir /nonexistent --uid 10001 --shell /usr/sbin/nologin app

COPY app/ ./app/
COPY wsgi.py gunicorn.conf.py schema.sql money.sql ./
COPY migrations/ ./migrations/

USER app

# gunicorn.conf.py binds $BIND (else 127.0.0.1:$PORT, unreachable from
# outside the container). Workers default to the number of cores the kernel
# reports, which in a container may be the host's: set WEB_CONCURRENCY to the
# container's CPU limit. gunicorn's graceful_timeout is 20 s, so stop with
# `docker stop -t 30` (the default 10 s ends in-flight deliveries with SIGKILL;
# that is safe, nothing is answered before commit, but it wastes their work).
ENV BIND=0.0.0.0:8000
EXPOSE 8000

# Liveness on /health (touches no dependency), without curl in the image.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('BIND', ':8000').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2)"]

CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
