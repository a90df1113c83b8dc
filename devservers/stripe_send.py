"""The docs' one helper for sending a Stripe event as Stripe sends it: `stripe_send`, which `. .run/env` defines.

    stripe_send EVENT_ID TYPE OBJECT_JSON [--account acct_X] [--source NAME]
    stripe_send EVENT_JSON [--source NAME]

The first form wraps a Stripe object (a PaymentIntent, a Checkout Session, a Refund, a Dispute...) in an Event as
Stripe's API reference shows one (https://docs.stripe.com/api/events/object): `account` set for a connected
account's event (https://docs.stripe.com/connect/webhooks), `livemode` the object's. The second sends a whole event
as given (a thin event, or one put in Stripe's stand-in first). Either is signed with stripe-python's
`WebhookSignature.generate_signature_header` and the source's secret, posted to make run's service (LEDGER_URL, the
route of the default source or of --source), and its answer printed, then `HTTP <status>`.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

import stripe

from app.intake.events import DEFAULT_SOURCE

API_VERSION = "2025-03-31.basil"  # the version the docs' events are shaped by (docs/providers/stripe.md, "Limits")
TIMEOUT_S = 30  # one delivery on loopback


def event(event_id, event_type, obj, account=None):
    """An Event wrapping obj, as Stripe sends one to a webhook endpoint."""
    document = {"id": event_id, "object": "event", "api_version": API_VERSION, "created": int(time.time()),
                "data": {"object": obj}, "livemode": bool(obj.get("livemode", False)), "pending_webhooks": 1,
                "request": {"id": None, "idempotency_key": None}, "type": event_type}
    if account:
        document["account"] = account
    return document


def secret_and_path(source, environ):
    """The source's first signing secret (make run's settings, from .run/env) and its route."""
    if source == DEFAULT_SOURCE:
        name, path = "WEBHOOK_SECRET", "/api/webhooks"
    else:
        name, path = f"WEBHOOK_{source.upper().replace('-', '_')}_SECRET", f"/api/webhooks/{source}"
    secret = environ.get(name, "").split(",")[0].strip()
    if not secret:
        raise SystemExit(f"stripe_send: {name} is not set: run `. .run/env` first")
    return secret, path


def send(body, source=DEFAULT_SOURCE, environ=os.environ):
    """POST body signed as Stripe signs it; return (status, answer)."""
    base = environ.get("LEDGER_URL")
    if not base:
        raise SystemExit("stripe_send: LEDGER_URL is not set: run `. .run/env` first")
    secret, path = secret_and_path(source, environ)
    signature = stripe.WebhookSignature.generate_signature_header(body, secret)
    request = urllib.request.Request(base + path, body.encode(), {"Content-Type": "application/json",
                                                                 "Stripe-Signature": signature})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:  # its body says why
        return refused.code, refused.read().decode()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="stripe_send", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("words", nargs="+", metavar="EVENT_ID TYPE OBJECT_JSON | EVENT_JSON")
    parser.add_argument("--account", help="the connected account whose event it is (acct_...)")
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="the source it is sent to [default: default]")
    args = parser.parse_args(argv)
    if len(args.words) == 1:
        body = args.words[0]
    elif len(args.words) == 3:
        event_id, event_type, obj = args.words
        body = json.dumps(event(event_id, event_type, json.loads(obj), args.account), separators=(",", ":"))
    else:
        parser.error("give EVENT_ID TYPE OBJECT_JSON, or a whole EVENT_JSON")
    status, answer = send(body, args.source)
    print(answer.rstrip("\n"))  # noqa: T201 - what the command prints is its answer
    print(f"HTTP {status}")  # noqa: T201


if __name__ == "__main__":
    sys.exit(main())
