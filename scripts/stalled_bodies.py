"""How long `GET /health` takes on a bare host (gunicorn as gunicorn.conf.py runs it, no proxy in front, 2 workers
x 4 threads, REQUEST_READ_TIMEOUT_SECONDS at its default) while senders stall inside their request bodies: N
connections (default 64) from 127.0.0.2 and up, each sending a whole head and part of the body it announces (by
Content-Length, by chunks, or nothing after `Expect: 100-continue`), then nothing. Prints one line per kind; a
figure, not a test (docs/deploying.md, "Slow senders", quotes it). /health touches no dependency, so the service
runs on addresses where no database or Redis answers.

    .venv/bin/python scripts/stalled_bodies.py [N [ROUNDS]]   (default 64 senders, 3 rounds of each kind)
"""

import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devservers import Gunicorn  # noqa: E402

HEAD = (b"POST /api/webhooks HTTP/1.1\r\nHost: ledger\r\nContent-Type: application/json\r\n"
        b"X-Signature: 00\r\n")
STALLED = {
    "content-length": HEAD + b"Content-Length: 100\r\n\r\n{\"id\"",
    "chunked": HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"id\"\r\n",
    "expect-100-continue": HEAD + b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n",
}
PATIENCE_S = 30.0


def main(count, rounds):
    env = {"DATABASE_URL": "postgresql://ledger@127.0.0.1:1/ledger", "REDIS_URL": "redis://127.0.0.1:1/0",
           "WEBHOOK_SECRET": "whsec-stalled-bodies"}
    for kind, first_bytes in [(kind, first_bytes) for kind, first_bytes in STALLED.items() for _ in range(rounds)]:
        # Each round on a server of its own: which worker accepts which connection is the kernel's choice.
        with tempfile.TemporaryDirectory() as folder:
            server = Gunicorn(env, workers=2, threads=4, log_path=Path(folder) / "gunicorn.log").start()
            try:
                sockets = [socket.create_connection(("127.0.0.1", server.port), timeout=5,
                                                    source_address=(f"127.0.0.{2 + i % 250}", 0))
                           for i in range(count)]
                for sock in sockets:
                    sock.sendall(first_bytes)
                time.sleep(0.5)  # each accepted by a worker
                started = time.monotonic()
                try:
                    with urllib.request.urlopen(f"{server.base}/health", timeout=PATIENCE_S) as answer:
                        status = answer.status
                except OSError as exc:
                    status = f"no answer ({exc})"
                print(f"{count} senders stalling inside a body ({kind}), 2 x 4 host: GET /health {status} "  # noqa: T201
                      f"in {time.monotonic() - started:.3f} s", flush=True)
                for sock in sockets:
                    sock.close()
            finally:
                server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
