"""A bare host (no proxy in front) under connections that send nothing, half a request head, or a head and part of
its body: gunicorn_worker.py reads heads and bodies in the worker's main loop, so they hold no thread, and /health
and a signed delivery still answer.
The time each took is printed (`pytest -s`); docs/deploying.md gives the figures."""

import json
import socket
import time
import uuid

import pytest

from tests.helpers import encode, http_get, payment, send, signed_headers

pytestmark = pytest.mark.core

WORKERS, THREADS = 2, 4
# The legitimate client's patience: longer than any one of gunicorn's own waits, so that "no answer" is a freeze.
PATIENCE_S = 15.0
HALF_HEAD = b"POST /api/webhooks HTTP/1.1\r\nHost: ledger\r\nContent-Type: application/json\r\n"


def _open(port, count, first_bytes):
    """count connections to port from 127.0.0.2 and up (other addresses than the client's), each sending first_bytes."""
    sockets = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.0.{2 + i % 250}", 0))
        if first_bytes:
            sock.sendall(first_bytes)
        sockets.append(sock)
    return sockets


def _timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@pytest.mark.parametrize("count", [64, 256])
@pytest.mark.parametrize("kind", ["idle", "half-sent"])
def test_idle_and_half_sent_connections_hold_no_thread(gunicorn, db, count, kind):
    server = gunicorn(workers=WORKERS, threads=THREADS)
    sockets = _open(server.port, count, b"" if kind == "idle" else HALF_HEAD)
    try:
        time.sleep(0.5)  # each accepted by a worker
        (status, _), health_s = _timed(lambda: http_get(server.base, "/health", timeout=PATIENCE_S))
        event = payment(f"evt_idle_{uuid.uuid4().hex}")
        answer, delivery_s = _timed(lambda: send(server.base, encode(event), timeout=PATIENCE_S))
        print(f"\n[idle connections] {count} {kind}, {WORKERS} x {THREADS} host: /health {health_s:.3f} s,"  # noqa: T201
              f" a delivery {delivery_s:.3f} s")
        assert status == 200
        assert answer[:2] == (200, {"status": "processed", "event_id": event["id"]})
    finally:
        for sock in sockets:
            sock.close()


def test_a_kept_alive_connection_that_stalls_inside_its_next_head_holds_no_thread(gunicorn, db):
    """One thread: a request answered, then half of the next head on the same connection; /health still answers
    well before REQUEST_READ_TIMEOUT_SECONDS (10 s), and the stalled head is answered 408 at its deadline."""
    server = gunicorn(workers=1, threads=1)
    [sock] = _open(server.port, 1, b"GET /health HTTP/1.1\r\nHost: ledger\r\n\r\n")
    try:
        answer = b""
        while not answer.endswith(b"}\n"):  # the whole answer (its body ends so), the connection kept alive
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(HALF_HEAD)
        time.sleep(0.5)
        assert http_get(server.base, "/health", timeout=5)[0] == 200  # the stalled head holds no thread
        sock.settimeout(PATIENCE_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 408")
    finally:
        sock.close()


# Senders that send a whole head, then stall inside the body it announces: by its length, by its chunks, or
# waiting for the 100 Continue it asked for before sending any (the loop sends it; they send nothing more).
STALLED_BODIES = {
    "content-length": b"Content-Length: 100\r\n\r\n{\"id\"",
    "chunked": b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"id\"\r\n",
    "expect-100-continue": b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n",
}


@pytest.mark.parametrize("kind", STALLED_BODIES)
def test_senders_stalling_inside_their_bodies_hold_no_thread(gunicorn, db, kind):
    """Each request would hold a thread until its deadline, longer than the client's patience: /health and a
    delivery answer while 64 of them stall, their bodies read by the worker's main loop."""
    server = gunicorn(workers=WORKERS, threads=THREADS, REQUEST_READ_TIMEOUT_SECONDS=3 * PATIENCE_S)
    sockets = _open(server.port, 64, HALF_HEAD + b"X-Signature: 00\r\n" + STALLED_BODIES[kind])
    try:
        time.sleep(0.5)  # each accepted by a worker
        (status, _), health_s = _timed(lambda: http_get(server.base, "/health", timeout=PATIENCE_S))
        event = payment(f"evt_stalled_{uuid.uuid4().hex}")
        answer, delivery_s = _timed(lambda: send(server.base, encode(event), timeout=PATIENCE_S))
        print(f"\n[stalled bodies] 64 {kind}, {WORKERS} x {THREADS} host: /health {health_s:.3f} s,"  # noqa: T201
              f" a delivery {delivery_s:.3f} s")
        assert status == 200
        assert answer[:2] == (200, {"status": "processed", "event_id": event["id"]})
        if kind == "expect-100-continue":
            sockets[0].settimeout(PATIENCE_S)
            assert sockets[0].recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"  # what it waits for
    finally:
        for sock in sockets:
            sock.close()


def test_a_sender_that_waits_for_100_continue_is_told_to_go_on_and_its_delivery_applies(gunicorn, db):
    server = gunicorn(workers=1, threads=1)
    event = payment(f"evt_continue_{uuid.uuid4().hex}")
    body = encode(event)
    head = "".join(f"{name}: {value}\r\n" for name, value in signed_headers(body).items())
    [sock] = _open(server.port, 1, (f"POST /api/webhooks HTTP/1.1\r\nHost: ledger\r\n{head}"
                                     f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode())
    try:
        sock.settimeout(PATIENCE_S)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = b""
        while b"\r\n\r\n{" not in answer or not answer.endswith(b"}\n"):
            answer += sock.recv(65536)
        final = answer.split(b"HTTP/1.1 100 Continue\r\n\r\n")[-1]  # gunicorn may send its own 100 too
        assert final.startswith(b"HTTP/1.1 200")
        assert json.loads(final.split(b"\r\n\r\n", 1)[1]) == {"status": "processed", "event_id": event["id"]}
    finally:
        sock.close()
