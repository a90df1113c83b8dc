"""gunicorn_worker.py: a request must arrive within REQUEST_READ_TIMEOUT_SECONDS
of its first byte, so that slow senders cannot hold every thread of a host
that is not behind a buffering proxy (the Docker image, `make run`)."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from devservers import ROOT, free_port

from .helpers import encode, http_get, payment, read_answer, scrape, send, signed_headers

pytestmark = pytest.mark.core

BUDGET = 2  # REQUEST_READ_TIMEOUT_SECONDS for these tests; the default is 10
MARGIN = 1.5  # scheduling on a shared machine
THREADS = 4
WAVES = 3  # stalled connections per thread


def _connect(base):
    parts = urlsplit(base)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=WAVES * BUDGET + MARGIN)
    return sock


def _headers(length):
    return (f"POST /api/webhooks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"X-Signature: 00\r\nContent-Length: {length}\r\n\r\n").encode()


def test_stalled_senders_are_cut_at_the_deadline_and_health_keeps_answering(gunicorn, db, tmp_path):
    server = gunicorn(workers=1, threads=THREADS, REQUEST_READ_TIMEOUT_SECONDS=BUDGET)
    started = time.monotonic()
    body_stalls, header_stalls = [], []
    for _ in range(2 * THREADS):
        sock = _connect(server.base)
        sock.sendall(_headers(100) + b'{"id"')  # headers and a few bytes of the body, then nothing
        body_stalls.append(sock)
    for _ in range(THREADS):
        sock = _connect(server.base)
        sock.sendall(b"POST /api/webhooks HTTP/1.1\r\nHost: test\r\n")  # half the headers, then nothing
        header_stalls.append(sock)
    time.sleep(0.5)  # every thread now holds one of them, and the others wait for a thread

    # Each holds a thread for BUDGET at most, in 3 rounds of THREADS: then /health is served.
    status = http_get(server.base, "/health", timeout=WAVES * BUDGET + MARGIN)[0]  # raises if it is not
    assert status == 200 and time.monotonic() - started < WAVES * BUDGET + MARGIN
    with ThreadPoolExecutor(len(body_stalls + header_stalls)) as pool:
        answers = list(pool.map(read_answer, body_stalls + header_stalls))  # until the server closes
    assert time.monotonic() - started < WAVES * BUDGET + MARGIN
    for status, answer in answers:  # each told why, then the connection closed
        assert status == 408 and answer["error"] == "request_timeout", answer
    body = encode(payment())
    assert send(server.base, body).status == 200

    scraped = scrape(server.base)  # the cut bodies are deliveries, counted; cut headers are not requests yet
    assert scraped[("webhook_ledger_deliveries_total",
                    (("outcome", "rejected"), ("reason", "request_timeout"), ("source", "default")))] == 2 * THREADS
    server.stop()
    log = (tmp_path / "gunicorn-0.log").read_text()
    assert "Traceback" not in log
    assert log.count("not received within 2 s: answered 408") == THREADS


def test_a_trickling_sender_is_cut_at_the_deadline_too(gunicorn, db):
    """A byte every half second never stalls long enough for a read timeout: the deadline is for the whole request."""
    server = gunicorn(workers=1, threads=1, REQUEST_READ_TIMEOUT_SECONDS=BUDGET)
    sock = _connect(server.base)
    started = time.monotonic()
    stop = threading.Event()

    def trickle():
        try:
            sock.sendall(_headers(1000))
            while not stop.wait(0.5):
                sock.sendall(b" ")
        except OSError:
            pass

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        status, answer = read_answer(sock)
    finally:
        stop.set()
        sender.join()
        sock.close()
    assert (status, answer["error"]) == (408, "request_timeout")
    assert time.monotonic() - started < BUDGET + MARGIN
    assert http_get(server.base, "/health")[0] == 200


def test_the_deadline_is_per_request_not_per_connection(gunicorn, db):
    """A kept-alive connection idle between two requests (gunicorn's keepalive is 5 s) is not cut."""
    server = gunicorn(workers=1, threads=2, REQUEST_READ_TIMEOUT_SECONDS=BUDGET)
    parts = urlsplit(server.base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    ports = set()
    try:
        for i in range(2):
            body = encode(payment(f"evt_kept_alive_{i}"))
            conn.request("POST", "/api/webhooks", body=body, headers=signed_headers(body))
            response = conn.getresponse()
            assert (response.status, json.loads(response.read())["status"]) == (200, "processed")
            ports.add(conn.sock.getsockname()[1])
            time.sleep(BUDGET + 0.5)
    finally:
        conn.close()
    assert len(ports) == 1  # one connection served both


@pytest.mark.unit
@pytest.mark.parametrize("value", ["ten", "0", "-1", "nan", "inf"])
def test_a_bad_read_timeout_stops_gunicorn_with_one_line(value):
    env = {"PATH": os.environ["PATH"], "DATABASE_URL": "postgresql://ledger@127.0.0.1:1/ledger",
           "REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SECRET": "whsec-read-timeout-test",
           "PORT": str(free_port()), "REQUEST_READ_TIMEOUT_SECONDS": value}
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "wsgi:app"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 78, lines
    named = [line for line in lines if "configuration error" in line]
    assert len(named) == 1 and "REQUEST_READ_TIMEOUT_SECONDS must be a positive number" in named[0], lines
    assert "Traceback" not in "\n".join(lines)
