"""Stripe's API on this machine, for docs/configuration.md's fetch and thin-event recipe: the stand-in of
devservers/stripe_stand_in.py on a fixed loopback port, in the background, holding what the recipe puts in it.

`python -m devservers.stripe_local` starts it and returns once it answers; `python -m devservers.stripe_local put
JSON` gives it an Event (kept as Retrieve an event and List events answer it) or an object (a PaymentIntent,
Charge, Refund, Dispute or thin event, retrieved by id); `python -m devservers.stripe_local stop` stops it. Its pid
file and log are in .run/stripe/ (STRIPE_LOCAL_DIR), its port 12111 (STRIPE_LOCAL_PORT), stripe-mock's."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

from . import ROOT, answers_tcp
from .stripe_stand_in import API_KEY, StripeStandIn, _handler

DIR = Path(os.environ.get("STRIPE_LOCAL_DIR") or ROOT / ".run" / "stripe")
PORT = int(os.environ.get("STRIPE_LOCAL_PORT") or 12111)
API_URL = f"http://127.0.0.1:{PORT}"
PUT_PATH = "/_stand_in/put"  # the stand-in's own call: Stripe's API has no such one
START_SECONDS = 30


def _shown(path):
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def put(document):
    """Give the running stand-in an Event or an object (a dict, as Stripe's API answers it)."""
    request = urllib.request.Request(API_URL + PUT_PATH, json.dumps(document).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def serve():
    """Run the stand-in on PORT until SIGTERM or SIGINT."""
    stand_in = StripeStandIn()

    class Handler(_handler(stand_in)):
        def do_POST(self):  # noqa: N802 - http.server's name
            document = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path != PUT_PATH or not isinstance(document, dict):
                self.send_response(404)
            else:
                (stand_in.add if document.get("object") == "event" else stand_in.put)(document)
                self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def _running():
    """The pid of the stand-in started from DIR, if it still runs."""
    try:
        pid = int((DIR / "pid").read_text())
        running = "devservers.stripe_local" in Path(f"/proc/{pid}/cmdline").read_text()
    except (OSError, ValueError):
        return None
    return pid if running else None


def stop():
    pid = _running()
    if pid is None:
        return "Stripe's stand-in is not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + START_SECONDS
    while _running() and time.monotonic() < deadline:
        time.sleep(0.05)
    (DIR / "pid").unlink(missing_ok=True)
    return "stopped Stripe's stand-in"


def start():
    """Start the stand-in in the background (stopping that of an earlier start); the lines to print."""
    stop()
    if answers_tcp(PORT):
        raise SystemExit(f"port {PORT} is in use: stop what uses it, or set STRIPE_LOCAL_PORT=<another port>")
    DIR.mkdir(parents=True, exist_ok=True)
    with open(DIR / "log", "ab") as log:
        server = subprocess.Popen([sys.executable, "-m", "devservers.stripe_local", "serve"], cwd=ROOT,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + START_SECONDS
    while not answers_tcp(PORT):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"Stripe's stand-in did not start; its log: {_shown(DIR / 'log')}")
        time.sleep(0.05)
    (DIR / "pid").write_text(f"{server.pid}\n")
    return [f"Stripe's API: {API_URL}, with the restricted key {API_KEY}",
            f"Stop it with: {_shown(Path(sys.executable))} -m devservers.stripe_local stop"]


def main(argv):
    command = argv[1] if len(argv) > 1 else "start"
    if command == "serve":
        serve()
    elif command == "stop":
        print(stop())  # noqa: T201
    elif command == "start":
        print("\n".join(start()))  # noqa: T201
    elif command == "put" and len(argv) == 3:
        put(json.loads(argv[2]))
    else:
        raise SystemExit(f"usage: {argv[0]} [start|stop|put JSON]")


if __name__ == "__main__":
    main(sys.argv)
