"""app/receiver/logs.py and gunicorn.conf.py's logconfig_dict: JSON lines, the request id."""

import json
import os
import re
import threading

import pytest

from devservers import Gunicorn
from tests.helpers import SECRET, UNKNOWN_USER, encode, http_get, payment, send, signed_headers

pytestmark = pytest.mark.core


def _echoed(client, sent):
    """The X-Request-ID of the answer to a delivery sent with X-Request-ID: sent."""
    body = encode(payment())
    return send(client, body, {**signed_headers(body), "X-Request-ID": sent}).headers["X-Request-ID"]


@pytest.mark.parametrize("sent", ["req-42", "0f9c2a4e-1b7d-4c51-9a0e-2d6f3b8c7a15", "trace:abc.DEF_1", "x" * 128])
def test_a_safe_request_id_is_echoed(client, db, sent):
    assert _echoed(client, sent) == sent


@pytest.mark.parametrize("sent", ["x" * 129, "has space", "quote\"", ""])
def test_an_unsafe_request_id_is_replaced(client, db, sent):
    assert re.fullmatch(r"[0-9a-f]{32}", _echoed(client, sent))


def test_request_id_is_generated_for_every_answer(client):
    ids = {client.get("/health").headers["X-Request-ID"], client.get("/nowhere").headers["X-Request-ID"],
           send(client, b"{}", {}).headers["X-Request-ID"]}
    assert len(ids) == 3


def _lines(path):
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # raises on any line that is not JSON


def test_gunicorn_logs_are_json_lines_without_secret_signature_or_body(gunicorn, db, tmp_path):
    server = gunicorn(workers=2, threads=2)
    marker = "BODY-MARKER-must-not-be-logged"
    bodies = [encode(payment("evt_logged", cents=7, note=marker)),    # processed
              encode(payment("evt_logged", cents=7, note=marker)),    # duplicate
              encode(payment("evt_logged", cents=8, note=marker)),    # payload_mismatch
              encode(payment(user=UNKNOWN_USER, note=marker)),        # failed
              b'{"id": "evt_broken", "note": "' + marker.encode() + b'"',  # invalid_json
              ]
    signatures = []
    for i, body in enumerate(bodies):
        headers = {**signed_headers(body), "X-Request-ID": f"req-{i}"}
        signatures.append(headers["X-Signature"])
        status, _, answer_headers = send(server.base, body, headers)
        assert status < 500 and answer_headers["X-Request-ID"] == f"req-{i}"
    forged = encode(payment(note=marker))
    forged_signature = signed_headers(forged, secret="not-the-secret")["X-Signature"]
    forged_headers = {"Content-Type": "application/json", "X-Signature": forged_signature}
    assert send(server.base, forged, forged_headers).status == 401
    assert http_get(server.base, "/ready")[0] == 200
    server.stop()  # flushes everything, including the shutdown lines

    log_path = tmp_path / "gunicorn-0.log"
    lines = _lines(log_path)
    raw = log_path.read_text()
    for secret_or_body in [SECRET, marker, forged_signature, *signatures]:
        assert secret_or_body not in raw

    deliveries = [line for line in lines if line.get("message") == "delivery"]
    assert [(d["request_id"], d["event_id"], d["outcome"], d["status"]) for d in deliveries[:5]] == [
        ("req-0", "evt_logged", "processed", 200),
        ("req-1", "evt_logged", "duplicate", 200),
        ("req-2", "evt_logged", "payload_mismatch", 409),
        ("req-3", deliveries[3]["event_id"], "failed", 422),
        ("req-4", None, "rejected", 400),
    ]
    assert deliveries[4]["reason"] == "invalid_json"
    assert (deliveries[5]["outcome"], deliveries[5]["reason"]) == ("rejected", "invalid_signature")
    for delivery in deliveries:
        assert delivery["level"] == "INFO" and delivery["logger"] == "app.receiver.webhooks"
        assert isinstance(delivery["latency_ms"], float) and delivery["timestamp"]
        assert "event_type" in delivery
        # What gunicorn's access line carried, now that it is off by default.
        assert (delivery["method"], delivery["path"], delivery["remote_addr"]) == ("POST", "/api/webhooks", "127.0.0.1")
        assert isinstance(delivery["bytes"], int) and delivery["bytes"] > 0
    loggers = {line["logger"] for line in lines}
    assert {"gunicorn.error", "app.receiver.webhooks"} <= loggers
    assert "gunicorn.access" not in loggers


def test_access_log_is_on_with_access_log_true(gunicorn, db, tmp_path):
    server = gunicorn(workers=1, threads=1, ACCESS_LOG="true")
    assert http_get(server.base, "/ready")[0] == 200
    server.stop()
    access = [line["message"] for line in _lines(tmp_path / "gunicorn-0.log") if line["logger"] == "gunicorn.access"]
    assert any('"GET /ready HTTP/1.1" 200' in message for message in access)


@pytest.mark.unit
def test_a_terminal_gets_human_lines_from_the_same_records():
    import io
    import logging

    from app.serving.logformat import HumanFormatter, formatter_for

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    record = logging.LogRecord("app.receiver.webhooks", logging.INFO, __file__, 1, "delivery", None, None)
    record.event_id, record.outcome, record.reason = "evt_1", "processed", None
    assert isinstance(formatter_for(Terminal()), HumanFormatter)
    line = formatter_for(Terminal()).format(record)
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO  app\.receiver\.webhooks: delivery event_id=evt_1 outcome=processed",
                        line)
    assert json.loads(formatter_for(io.StringIO()).format(record))["outcome"] == "processed"


# -- a terminal: the human lines, which a sender must not be able to forge or colour ----------

class Terminal:
    """A pseudo-terminal for a server's output: what `make run` or `docker run -t` shows."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed
                return
            if not data:
                return
            self.output += data

    def lines(self):
        return bytes(self.output).decode().replace("\r\n", "\n").splitlines()

    def close(self):
        os.close(self.slave)
        self.reader.join(5)
        os.close(self.master)


FORGED = "12:00:00 INFO  app.receiver.webhooks: delivery event_id=evt_x outcome=processed"


def test_a_terminal_s_lines_escape_what_a_sender_controls(config, db):
    terminal = Terminal()
    server = Gunicorn(config, workers=1, threads=2, log_path=terminal.path).start()
    try:
        event_id = f"evt_inject\n{FORGED}\x1b[31m\x9b31m"
        body = encode(payment(event_id))
        assert send(server.base, body).status == 200
        assert send(server.base, b"{}", {"Content-Type": "application/json"},
                    source=f"nosuch%0A{FORGED}%1B[32m".replace(" ", "%20")).status == 404
    finally:
        server.stop()
        terminal.close()
    lines = terminal.lines()
    text = "\n".join(lines)
    assert "\x1b" not in text and "\x9b" not in text
    assert not any(line.startswith(FORGED[:30]) for line in lines), text
    deliveries = [line for line in lines if " app.receiver.webhooks: delivery " in line]
    assert len(deliveries) == 2, text
    assert r'event_id="evt_inject\n12:00:00 INFO  app.receiver.webhooks: delivery event_id=evt_x' in deliveries[0]
    assert r'\u001b[31m\u009b31m"' in deliveries[0]
    assert "nosuch" not in deliveries[1]  # a name no source has is never logged
