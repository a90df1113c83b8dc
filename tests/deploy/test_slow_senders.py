"""Slow senders (issue 26): waves of connections that send their headers and
part of a body, then stall or trickle, re-opened as soon as they are cut,
against deploy/haproxy.cfg in front of a 3 x 4 gunicorn host, and against the
bare host. Through the proxy, `/health` (on the host's own address) and signed
deliveries keep answering within 1 s and each delivery is credited once; on the
bare host every probe and delivery is answered, its times printed
(docs/deploying.md has the figures).
Then the proxy's per-address limits, body size and lanes, one each.

The attackers bind 127.0.0.2 and up (all loopback on Linux), so the proxy's
per-address limits apply to them as shipped, and not to the legitimate
client, which connects from 127.0.0.1."""

import http.client
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from devservers.topology import HAProxy, program

from ..helpers import ALICE, OPENING, assert_ledger_consistent, balance, encode, http_get, payment, send

pytestmark = pytest.mark.deploy

# How long each run's attack lasts; the suite runs the 60 s the issue asks for.
ATTACK_SECONDS = float(os.environ.get("SLOW_SENDERS_SECONDS", "60"))
# The waves: at least 64 connections at a time, spread over 8 addresses
# (8 each, under the proxy's 50 per address: what protects here is buffering).
ATTACKER_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 10)]
PER_ADDRESS = 8
# The legitimate client's patience, and what "keeps answering" means.
PATIENCE_S, ANSWER_WITHIN_S = 15.0, 1.0
# The host of the issue: 3 workers x 4 threads, gthread.
WORKERS, THREADS = 3, 4
# Between two probes of the legitimate client (each of /health and a delivery).
PROBE_INTERVAL_S = 0.1
# deploy/haproxy.cfg's limits, as shipped.
CONNECTIONS_PER_ADDRESS, REQUESTS_PER_10S, MAX_BODY = 50, 2000, 1048576

HEAD = ("POST /api/webhooks HTTP/1.1\r\nHost: ledger\r\nContent-Type: application/json\r\n"
        "X-Signature: 00\r\nContent-Length: {length}\r\n\r\n")


def stalled(sock, stop):
    """Headers and 6 bytes of a 100-byte body, then nothing."""
    sock.sendall(HEAD.format(length=100).encode() + b'{"id":')
    return wait_cut(sock, stop)


def trickling(sock, stop):
    """Headers a byte at a time, then the body a byte a second: never idle long enough for an idle timeout."""
    for byte in HEAD.format(length=100).encode() + b"{" * 100:
        if stop.is_set():
            return None
        sock.sendall(bytes([byte]))
        try:
            if sock.recv(4096, socket.MSG_DONTWAIT) == b"":
                return "cut"
        except (BlockingIOError, TimeoutError):
            pass
        time.sleep(0.3)
    return wait_cut(sock, stop)


def large_stalled(sock, stop):
    """A declared 200 kB body, 32 kB of it sent (more than haproxy's 16 kB buffer holds), then nothing."""
    sock.sendall(HEAD.format(length=200_000).encode() + b" " * 32_768)
    return wait_cut(sock, stop)


def wait_cut(sock, stop):
    """Block until the server closes the connection (or answers); return what ended it."""
    while not stop.is_set():
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return "reset"
        return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "cut"
    return None


# Of each address's 8 connections: 4 stall, 3 trickle, 1 stalls inside a large body.
KINDS = [stalled] * 4 + [trickling] * 3 + [large_stalled]


class Attack:
    """PER_ADDRESS connections from each attacker address to port, each re-opened as soon as it is cut."""

    def __init__(self, port):
        self.port, self.stop = port, threading.Event()
        self.ends, self.opened = [], 0
        self.threads = [threading.Thread(target=self._loop, args=(address, kind), daemon=True)
                        for address in ATTACKER_ADDRESSES for kind in KINDS]

    def _loop(self, address, kind):
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5,
                                              source_address=(address, 0)) as sock:
                    self.opened += 1
                    end = kind(sock, self.stop)
            except OSError:
                end = "refused"
            if end:
                self.ends.append(end)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        time.sleep(1)  # every connection open before the measuring starts
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(5)


class Client:
    """The legitimate client, from 127.0.0.1: GET /health on the host, signed deliveries to base."""

    def __init__(self, health_base, delivery_base):
        self.health_base, self.delivery_base = health_base, delivery_base
        self.health, self.deliveries = [], []  # (seconds, status) each; status None: no answer

    def _timed(self, call):
        started = time.monotonic()
        try:
            status = call()
        except OSError:
            status = None
        return time.monotonic() - started, status

    def probe_health(self, until):
        while time.monotonic() < until:
            self.health.append(self._timed(lambda: http_get(self.health_base, "/health", timeout=PATIENCE_S)[0]))
            time.sleep(PROBE_INTERVAL_S)

    def deliver(self, until):
        while time.monotonic() < until:
            event = payment(f"evt_slow_{uuid.uuid4().hex}", cents=1)
            body = encode(event)
            took, answer = self._timed(lambda body=body: send(
                self.delivery_base, body, timeout=PATIENCE_S)[:2])
            self.deliveries.append((event["id"], took, answer))
            time.sleep(PROBE_INTERVAL_S)

    def run(self, seconds):
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=self.probe_health, args=(until,)),
                   threading.Thread(target=self.deliver, args=(until,))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self


def p99(values):
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else max(values)


def report(name, client, attack):
    health = [took for took, _ in client.health]
    deliveries = [took for _, took, _ in client.deliveries]
    frozen = sum(took for took in health if took > ANSWER_WITHIN_S)
    ends = {end: attack.ends.count(end) for end in sorted(set(attack.ends))}
    print(f"\n[slow senders] {name}: {ATTACK_SECONDS:.0f} s, {len(ATTACKER_ADDRESSES) * PER_ADDRESS} attackers,"  # noqa: T201
          f" {attack.opened} connections opened, their ends {ends}\n"
          f"  /health: {len(health)} probes, p99 {p99(health):.3f} s, max {max(health):.3f} s,"
          f" {sum(1 for t in health if t > ANSWER_WITHIN_S)} over {ANSWER_WITHIN_S} s"
          f" (~{frozen:.1f} s of {ATTACK_SECONDS:.0f} s waiting),"
          f" {sum(1 for _, s in client.health if s != 200)} not 200\n"
          f"  deliveries: {len(deliveries)}, p99 {p99(deliveries):.3f} s, max {max(deliveries):.3f} s,"
          f" answers {count_answers(client)}")


def count_answers(client):
    counts = {}
    for _, _, answer in client.deliveries:
        key = "no answer" if answer is None else f"{answer[0]} {answer[1].get('status') or answer[1].get('error')}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def assert_each_delivery_credited_at_most_once(db, client):
    """Every delivery answered 200 processed has one journal row. One the client gave up on (no answer
    within PATIENCE_S) may have been credited after it left, once, as its provider's retry would then find
    it a duplicate. No other delivery is credited, and the balance adds up."""
    processed = {event_id for event_id, _, answer in client.deliveries
                 if answer and answer == (200, {"status": "processed", "event_id": event_id})}
    unanswered = {event_id for event_id, _, answer in client.deliveries if answer is None}
    credits = dict(db.execute("SELECT event_id, count(*) FROM ledger_journal WHERE event_id LIKE 'evt_slow_%' "
                              "GROUP BY event_id").fetchall())
    assert processed <= set(credits), "a delivery answered processed was not credited"
    assert set(credits) <= processed | unanswered, "a delivery answered otherwise than processed was credited"
    assert set(credits.values()) <= {1}, "a delivery was credited twice"
    assert balance(db) == OPENING[ALICE] + len(credits)
    assert_ledger_consistent(db)


@pytest.fixture
def proxy_dir():
    try:
        program("haproxy")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    base = Path(tempfile.mkdtemp(prefix="webhook-ledger-slow-"))
    base.chmod(0o755)  # haproxy's own user goes through it to its folder
    yield base / "haproxy"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def proxied(gunicorn, db, proxy_dir):
    """deploy/haproxy.cfg in front of one 3 x 4 host (the file's 3 servers all name it)."""
    host = gunicorn(workers=WORKERS, threads=THREADS)
    proxy = HAProxy(proxy_dir, [f"127.0.0.1:{host.port}"] * 3).start()
    yield proxy, host
    proxy.stop()


@pytest.fixture
def small_proxied(gunicorn, db, proxy_dir):
    """deploy/haproxy.cfg in front of a 1 x 4 host, for the limits' own tests (quicker to start)."""
    host = gunicorn(workers=1, threads=4)
    proxy = HAProxy(proxy_dir, [f"127.0.0.1:{host.port}"] * 3).start()
    yield proxy, host
    proxy.stop()


def test_behind_the_proxy_slow_senders_freeze_nothing_and_each_delivery_is_credited_once(proxied, db):
    proxy, host = proxied
    with Attack(proxy.port) as attack:
        client = Client(host.base, proxy.base).run(ATTACK_SECONDS)
    report("behind deploy/haproxy.cfg", client, attack)
    assert attack.opened > len(attack.threads), "the attackers' connections were never cut and re-opened"
    assert [took for took, status in client.health if status != 200 or took > ANSWER_WITHIN_S] == []
    assert [(event_id, took, answer) for event_id, took, answer in client.deliveries
            if took > ANSWER_WITHIN_S or answer != (200, {"status": "processed", "event_id": event_id})] == []
    assert_each_delivery_credited_at_most_once(db, client)


def test_a_bare_host_keeps_answering_under_the_same_waves(gunicorn, db):
    """The worker reads heads and bodies in its main loop: the waves hold no thread, so every /health probe and
    every delivery is answered (within the client's patience) and each delivery is credited once. The times are
    printed for docs/deploying.md (not asserted)."""
    host = gunicorn(workers=WORKERS, threads=THREADS)
    with Attack(host.port) as attack:
        client = Client(host.base, host.base).run(ATTACK_SECONDS)
    report("bare gunicorn", client, attack)
    assert [status for _, status in client.health if status != 200] == []
    assert [answer for _, _, answer in client.deliveries if answer is None or answer[0] != 200] == []
    host.stop()
    assert_each_delivery_credited_at_most_once(db, client)


# -- the proxy's limits, one at a time -------------------------------------------

def connect(port, address, timeout=2):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(address, 0))


def connect_or_refused(port, address):
    """A connected socket, or None when the proxy's refusal (a reset) came before connect() returned."""
    try:
        return connect(port, address)
    except ConnectionResetError:
        return None


def closed(sock):
    """Whether the peer closed (or reset) sock; False while it is open and silent."""
    if sock is None:
        return True
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, TimeoutError):
        return False
    except ConnectionResetError:
        return True


def test_an_address_past_50_open_connections_is_refused_others_not(small_proxied):
    proxy, host = small_proxied
    sockets = [connect_or_refused(proxy.port, "127.0.0.20") for _ in range(CONNECTIONS_PER_ADDRESS + 10)]
    try:
        time.sleep(1)
        refused = [closed(sock) for sock in sockets]
        assert sum(refused) == 10  # haproxy accepts in its own order: which 10 may vary
        body = encode(payment())
        assert send(proxy.base, body).status == 200  # 127.0.0.1 is not limited
    finally:
        for sock in sockets:
            if sock is not None:
                sock.close()


def test_an_address_over_2000_requests_in_10_s_is_answered_429_with_retry_after_others_not(small_proxied):
    proxy, host = small_proxied
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5, source_address=("127.0.0.21", 0))
    statuses = []
    try:
        for _ in range(REQUESTS_PER_10S + 5):
            conn.request("GET", "/nothing-here")
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        conn.request("GET", "/nothing-here")
        response = conn.getresponse()
        assert (response.status, response.getheader("Retry-After")) == (429, "10")
        assert b'"rate_limited"' in response.read()
    finally:
        conn.close()
    assert statuses.count(404) == REQUESTS_PER_10S and statuses[-1] == 429
    body = encode(payment())
    assert send(proxy.base, body).status == 200  # 127.0.0.1 is not limited


def test_a_body_declared_over_max_body_bytes_is_refused_413_before_a_host_sees_it(small_proxied):
    proxy, host = small_proxied
    with connect(proxy.port, "127.0.0.22", timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(HEAD.format(length=MAX_BODY + 1).encode() + b" " * 32_768)  # a buffer's worth, then more
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b'"too_large"' in answer
    assert time.monotonic() - started < ANSWER_WITHIN_S
    assert {row["pxname"]: int(row["stot"]) for row in proxy.stat() if row["svname"] == "BACKEND"} == {
        "app": 0, "app_unbuffered": 0}


def test_a_sender_that_stalls_is_answered_408_json_by_the_proxy(small_proxied):
    proxy, host = small_proxied
    with connect(proxy.port, "127.0.0.23", timeout=15) as sock:
        started = time.monotonic()
        sock.sendall(HEAD.format(length=100).encode() + b'{"id":')
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer
    assert 9 < time.monotonic() - started < 12  # timeout http-request 10s


@pytest.mark.parametrize(("padding", "lane"), [(100, "app"), (40_000, "app_unbuffered")])
def test_a_delivery_goes_to_the_lane_its_size_chooses(
        small_proxied, padding, lane):
    proxy, host = small_proxied
    event = payment(memo="x" * padding)
    body = encode(event)
    assert send(proxy.base, body)[:2] == (
        200, {"status": "processed", "event_id": event["id"]})
    sent = {row["pxname"]: int(row["stot"]) for row in proxy.stat() if row["svname"] == "BACKEND"}
    assert sent == {"app": 1 if lane == "app" else 0, "app_unbuffered": 1 if lane == "app_unbuffered" else 0}


def test_the_unbuffered_lane_holds_one_thread_per_host_at_most(small_proxied):
    """Stalled large bodies wait in haproxy's queue, not on threads: /health and small deliveries still answer."""
    proxy, host = small_proxied
    sockets = []
    try:
        for i in range(10):
            sock = connect(proxy.port, f"127.0.0.{30 + i}", timeout=15)
            sock.sendall(HEAD.format(length=200_000).encode() + b" " * 32_768)
            sockets.append(sock)
        time.sleep(1)
        lane = {row["svname"]: row for row in proxy.stat() if row["pxname"] == "app_unbuffered"}
        served = [int(lane[name]["scur"]) for name in ("host1", "host2", "host3")]
        assert served == [1, 1, 1] and int(lane["BACKEND"]["qcur"]) == 7  # one per server line, the rest queued
        started = time.monotonic()
        assert http_get(host.base, "/health", timeout=5)[0] == 200
        body = encode(payment())
        assert send(proxy.base, body, timeout=5).status == 200
        assert time.monotonic() - started < ANSWER_WITHIN_S
    finally:
        for sock in sockets:
            sock.close()
