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
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from app.serving import gunicorn_worker as worker
from devservers import ROOT, free_port
from tests.helpers import encode, http_get, payment, read_answer, scrape, send, signed_headers

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


def _exchange(sock, data):
    """Send data on sock and read until the server closes it; return the answers' bytes."""
    sock.sendall(data)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def _answers(received):
    """[(status, headers (lower-cased names), parsed JSON body)] of the answers in received, in order."""
    answers = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        headers = {name.lower(): value for name, value in headers.items()}
        length = int(headers["content-length"])
        answers.append((int(lines[0].split(" ", 2)[1]), headers, json.loads(rest[:length])))
        received = rest[length:]
    return answers


REFUSED = {
    "header field too large": (b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
                               431, "header_fields_too_large"),
    "too many header fields": (b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-A: b\r\n" * 101 + b"\r\n",
                               431, "header_fields_too_large"),
    "request line too long": (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414, "uri_too_long"),
    "duplicate Content-Length": (b"POST /api/webhooks HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                                 b"Content-Length: 3\r\n\r\n{}", 400, "bad_request"),
    "NUL in a header": (b"GET /health HTTP/1.1\r\nHost: t\r\nX-A: a\x00b\r\n\r\n", 400, "bad_request"),
    "bare LF": (b"GET /health HTTP/1.1\nHost: t\n\n", 400, "bad_request"),
    "not HTTP": (b"HELLO\r\n\r\n", 400, "bad_request"),
    "Transfer-Encoding and Content-Length": (b"POST /api/webhooks HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n{}", 400, "bad_request"),
}


def test_gunicorns_own_refusals_are_json_with_a_request_id(gunicorn, db):
    server = gunicorn(workers=1, threads=2)
    for name, (request, status, error) in REFUSED.items():
        with _connect(server.base) as sock:
            answers = _answers(_exchange(sock, request))
        assert [(answer[0], answer[1]["content-type"], answer[2]["error"]) for answer in answers] == [
            (status, "application/json", error)], name
        assert len(answers[0][1]["x-request-id"]) == 32, name  # a new one: the head was not read as a request
    assert http_get(server.base, "/health")[0] == 200


def test_a_refusal_echoes_the_senders_request_id_found_in_the_head(gunicorn, db):
    server = gunicorn(workers=1, threads=2)
    request = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Request-ID: mine-431\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    with _connect(server.base) as sock:
        [(status, headers, body)] = _answers(_exchange(sock, request))
    assert (status, headers["x-request-id"], body["error"]) == (431, "mine-431", "header_fields_too_large")


def test_a_head_sent_in_pieces_and_pipelined_requests_are_each_answered_in_order(gunicorn, db):
    """The main loop reads a head until it is whole, on a new connection and behind a request on a kept-alive one."""
    server = gunicorn(workers=1, threads=2)
    first, second = (encode(payment(f"evt_pipelined_{i}")) for i in range(2))
    requests = [b"POST /api/webhooks HTTP/1.1\r\nHost: t\r\n"
                + b"".join(f"{name}: {value}\r\n".encode() for name, value in signed_headers(body).items())
                + b"Content-Length: %d\r\nX-Request-ID: req-%d\r\n\r\n%s" % (len(body), i, body)
                for i, body in enumerate([first, second])]
    health = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    stream = requests[0] + requests[1] + health
    with _connect(server.base) as sock:
        for start in range(0, len(stream), 7):  # 7 bytes at a time, each head split over several reads
            sock.sendall(stream[start:start + 7])
            time.sleep(0.002)
        received = _exchange(sock, b"")
    answers = _answers(received)
    assert [(status, headers["x-request-id"], body.get("status")) for status, headers, body in answers][:2] == [
        (200, "req-0", "processed"), (200, "req-1", "processed")]
    assert [(status, body["status"]) for status, _, body in answers[2:]] == [(200, "ok")]
    with _connect(server.base) as sock:  # all three at once
        answers = _answers(_exchange(sock, b"".join(requests) + health))
    assert [(status, body.get("status")) for status, _, body in answers] == [
        (200, "duplicate"), (200, "duplicate"), (200, "ok")]


def test_a_chunked_body_sent_in_pieces_is_read_whole_by_the_main_loop_and_applied(gunicorn, db):
    server = gunicorn(workers=1, threads=1)
    event = payment(f"evt_chunked_{uuid.uuid4().hex}")
    body = encode(event)
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + 9]), body[i:i + 9]) for i in range(0, len(body), 9))
    request = (b"POST /api/webhooks HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
               + b"".join(f"{name}: {value}\r\n".encode() for name, value in signed_headers(body).items())
               + b"\r\n" + chunks + b"0\r\nX-Trailer: t\r\n\r\n")
    with _connect(server.base) as sock:
        for start in range(0, len(request), 5):
            sock.sendall(request[start:start + 5])
            time.sleep(0.002)
        [(status, _, answer)] = _answers(_exchange(sock, b""))
    assert (status, answer) == (200, {"status": "processed", "event_id": event["id"]})


HEAD = b"POST /api/webhooks HTTP/1.1\r\nHost: t\r\n"


@pytest.mark.unit
@pytest.mark.parametrize("fields, expected", [
    (b"Content-Length: 100", worker.Framing(100, False, False)),
    (b"content-length: 100\r\nExpect: 100-Continue", worker.Framing(100, False, True)),
    (b"Transfer-Encoding: gzip, chunked", worker.Framing(None, True, False)),
    (b"X-Other: 1", None),  # no body to wait for
    (b"Content-Length: 0", None),
    (b"Content-Length: 2000", None),  # over the limit: the app answers 413 from the length alone
    (b"Content-Length: 2\r\nContent-Length: 3", None),  # for gunicorn's parser to refuse
    (b"Content-Length: 2\r\nTransfer-Encoding: chunked", None),
    (b"Content-Length: -1", None),
    (b"Transfer-Encoding: gzip", None),
])
def test_the_main_loop_reads_a_body_framed_by_its_length_or_its_chunks_and_no_other(fields, expected):
    assert worker.framing(HEAD + fields, 1000) == expected


@pytest.mark.unit
@pytest.mark.parametrize("body, resume", [
    (b"5\r\nhello\r\n0\r\n\r\n", None),  # whole
    (b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", None),  # whole, with a trailer
    (b"5\r\nhel", 0),  # the first chunk not whole yet
    (b"5\r\nhello\r\n3\r\nab", 10),  # the second one
    (b"5\r\nhello\r\n0\r\nX-T: 1\r\n", 10),  # the trailers not ended
    (b"5\r\nhello\r\nzz\r\n", None),  # malformed: gunicorn's parser refuses it
    (b"400\r\n", None),  # over the limit: the app answers 413
])
def test_a_chunked_body_is_scanned_until_its_last_chunk_and_trailers(body, resume):
    assert worker.chunked_end(body, 0, 0, 1000) == resume
