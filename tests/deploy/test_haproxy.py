"""deploy/haproxy.cfg, started as shipped in front of a real gunicorn host:
providers reach the webhooks and nothing else; /metrics, /openapi.json and the
probes stay on the hosts' own addresses, for operators and Prometheus."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from devservers.topology import HAProxy, program

from ..helpers import encode, http_request, payment, send, signed_headers

pytestmark = pytest.mark.deploy


@pytest.fixture
def haproxy(gunicorn, db):
    try:
        program("haproxy")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    host = gunicorn(workers=1, threads=2)
    base = Path(tempfile.mkdtemp(prefix="webhook-ledger-haproxy-"))
    base.chmod(0o755)  # haproxy's own user goes through it to its folder
    proxy = HAProxy(base / "haproxy", [f"127.0.0.1:{host.port}"] * 3).start()  # the file's 3 servers: one host
    yield proxy, host
    proxy.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("path", [
    "/metrics", "/openapi.json", "/ready", "/health", "/", "/metrics?x=1", "/%6Detrics", "//metrics",
    "/api/webhooks/../metrics", "/api/webhooks/%2E%2E/metrics", "/api/webhooksx",
])
def test_the_public_frontend_serves_no_metrics_document_or_probe(haproxy, path):
    proxy, host = haproxy
    status, answer, headers = http_request(proxy.base, "GET", path)
    assert status == 404 and answer["error"] == "not_found", (path, status, answer)
    assert "webhook_ledger" not in str(answer) and "openapi" not in str(answer)


def test_the_public_frontend_serves_the_webhooks(haproxy):
    proxy, _ = haproxy
    body = encode(payment())
    for path, outcome in (("/api/webhooks", "processed"), ("/api/webhooks/", "duplicate")):
        assert send(proxy.base, body, path=path)[:2] == (
            200, {"status": outcome, "event_id": json.loads(body)["id"]})
    assert send(proxy.base, body, signed_headers(body), source="nosuch")[:2] == (
        404, {"error": "unknown_source"})


def test_each_host_serves_the_document_and_the_probes_on_its_own_address(haproxy):
    """Where the operator means them to be, behind the proxy's back."""
    _, host = haproxy
    assert [http_request(host.base, "GET", path)[0] for path in ("/openapi.json", "/ready")] == [200, 200]
