"""Stripe's API on this machine, for docs/configuration.md's fetch and thin-event recipe: the stand-in of
devservers/stripe_stand_in.py on a fixed loopback port, in the background, holding what the recipe puts in it.

`python -m devservers.stripe_local` starts it and returns once it answers; `python -m devservers.stripe_local put
JSON` gives it an Event (kept as Retrieve an event and List events answer it), a balance transaction (listed by
List all balance transactions, in the connected account its `account` names) or an object (a PaymentIntent,
Charge, Refund, Dispute or thin event, retrieved by id); `python -m devservers.stripe_local stop` stops it. Its pid
file and log are in .run/stripe/ (STRIPE_LOCAL_DIR), its port 12111 (STRIPE_LOCAL_PORT), stripe-mock's."""

import json
import os
import sys
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

from . import ROOT, answers_tcp
from .background import Background, shown, wait_for_signal
from .stripe_stand_in import API_KEY, StripeStandIn, _handler

DIR = Path(os.environ.get("STRIPE_LOCAL_DIR") or ROOT / ".run" / "stripe")
PORT = int(os.environ.get("STRIPE_LOCAL_PORT") or 12111)
API_URL = f"http://127.0.0.1:{PORT}"
PUT_PATH = "/_stand_in/put"  # the stand-in's own call: Stripe's API has no such one
BACKGROUND = Background("devservers.stripe_local", DIR, "Stripe's stand-in")


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
                if document.get("object") == "balance_transaction":  # listed in its `account`'s list, if it names one
                    stand_in.balance.add(document, account=document.pop("account", None))
                else:
                    (stand_in.add if document.get("object") == "event" else stand_in.put)(document)
                self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    wait_for_signal()
    server.shutdown()


def stop():
    return BACKGROUND.stop()


def start():
    """Start the stand-in in the background (stopping that of an earlier start); the lines to print."""
    BACKGROUND.stop()
    if answers_tcp(PORT):
        raise SystemExit(f"port {PORT} is in use: stop what uses it, or set STRIPE_LOCAL_PORT=<another port>")
    BACKGROUND.spawn([PORT])
    return [f"Stripe's API: {API_URL}, with the restricted key {API_KEY}",
            f"Stop it with: {shown(Path(sys.executable))} -m devservers.stripe_local stop"]


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
