"""Stripe's events as Stripe sends them, built by stripe-python (`stripe.Event.construct_from`) and signed by
its own signer. Each object carries the fields Stripe's API reference shows for it (PaymentIntent, Charge,
Refund, Dispute, Checkout Session: https://docs.stripe.com/api), those the ledger reads among them."""

import json
import time
import uuid

import stripe

from tests.helpers import ALICE, SECRETS, send

API_VERSION = "2025-03-31.basil"  # the default: the version whose charges no longer count released authorisations
BEFORE_BASIL = "2024-06-20"


def _id(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def event(event_type, obj, event_id=None, livemode=True, api_version=API_VERSION):
    """An Event object of event_type carrying obj as data.object."""
    return stripe.Event.construct_from({
        "id": event_id or _id("evt"), "object": "event", "type": event_type, "livemode": livemode,
        "api_version": api_version, "created": int(time.time()), "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None}, "data": {"object": obj},
    }, "sk_test")


def intent_succeeded(intent_id, user=ALICE, cents=250, currency="usd", event_id=None, authorized=None,
                     customer=None, metadata=None, api_version=API_VERSION):
    """payment_intent.succeeded: amount is what was authorised, amount_received what was captured. metadata
    (default {"user_id": user}) is the PaymentIntent's whole; customer its cus_... or None (a guest)."""
    return event("payment_intent.succeeded", {
        "id": intent_id, "object": "payment_intent", "amount": authorized or cents, "amount_capturable": 0,
        "amount_received": cents, "currency": currency, "status": "succeeded", "capture_method": "automatic",
        "customer": customer, "latest_charge": f"ch_{intent_id}",
        "metadata": {"user_id": str(user)} if metadata is None else metadata}, event_id, api_version=api_version)


def invoice_intent_succeeded(intent_id, customer, cents=2000, event_id=None):
    """A Billing invoice's PaymentIntent: it names the customer and its invoice, and carries none of the
    subscription's metadata (Stripe copies subscription metadata to the invoice, not to its PaymentIntent)."""
    evt = intent_succeeded(intent_id, cents=cents, event_id=event_id, customer=customer, metadata={})
    evt.data.object["description"] = "Subscription creation"
    return evt


def charge_refunded(intent_id, refunded_total, currency="usd", event_id=None, cents=250, captured=None,
                    api_version=API_VERSION):
    """charge.refunded: the Charge, with the total refunded so far (amount_refunded)."""
    captured = cents if captured is None else captured
    return event("charge.refunded", {
        "id": f"ch_{intent_id}", "object": "charge", "payment_intent": intent_id, "amount": cents,
        "amount_captured": captured, "amount_refunded": refunded_total, "captured": captured > 0,
        "refunded": refunded_total == cents, "currency": currency, "status": "succeeded", "paid": True},
        event_id, api_version=api_version)


def refund(refund_id, intent_id, cents, status="succeeded", event_type=None, currency="usd", event_id=None,
           reason=None, api_version=API_VERSION):
    """A Refund object in one of its events (refund.created, refund.updated, refund.failed,
    charge.refund.updated); by default refund.failed for a failed status, refund.updated otherwise."""
    failed = status in ("failed", "canceled")
    event_type = event_type or ("refund.failed" if status == "failed" else "refund.updated")
    return event(event_type, {
        "id": refund_id, "object": "refund", "amount": cents, "charge": f"ch_{intent_id}",
        "payment_intent": intent_id, "currency": currency, "status": status, "reason": reason,
        "balance_transaction": _id("txn"), "created": int(time.time()), "metadata": {},
        "failure_reason": "expired_or_canceled_card" if failed else None,
        "failure_balance_transaction": _id("txn") if failed else None}, event_id, api_version=api_version)


def dispute(dispute_id, intent_id, cents, event_type="charge.dispute.funds_withdrawn", status="needs_response",
            currency="usd", event_id=None, api_version=API_VERSION, balance_transactions=(), case_type=None):
    """A Dispute object in one of its events (charge.dispute.created, .updated, .closed, .funds_withdrawn,
    .funds_reinstated); balance_transactions the amounts its funds moved by (negative: withdrawn), case_type its
    card's payment_method_details.card.case_type (block, resolution: a prevented dispute's, since 2025-08-27.basil)."""
    return event(event_type, {
        "id": dispute_id, "object": "dispute", "amount": cents, "charge": f"ch_{intent_id}",
        "payment_intent": intent_id, "currency": currency, "status": status, "reason": "fraudulent",
        "is_charge_refundable": False, "created": int(time.time()), "livemode": True, "metadata": {},
        "balance_transactions": [{"id": _id("txn"), "object": "balance_transaction", "amount": amount,
                                  "currency": currency} for amount in balance_transactions],
        **({} if case_type is None else {"payment_method_details": {
            "type": "card", "card": {"brand": "visa", "case_type": case_type, "network_reason_code": "10.4"}}})},
        event_id, api_version=api_version)


SESSION_COMPLETED = "checkout.session.completed"
ASYNC_SUCCEEDED = "checkout.session.async_payment_succeeded"
ASYNC_FAILED = "checkout.session.async_payment_failed"


def checkout_session(intent_id, event_type=SESSION_COMPLETED, user=ALICE, cents=250, payment_status="paid",
                     mode="payment", metadata=None, customer=None, event_id=None, currency="usd",
                     api_version=API_VERSION, subscription=None):
    """A Checkout Session (https://docs.stripe.com/api/checkout/sessions/object) in one of its events; user is its
    client_reference_id (None: none), intent_id its payment_intent in payment mode, subscription its sub_... in
    subscription mode (where Stripe always creates the customer: customer_creation is null)."""
    return event(event_type, {
        "id": _id("cs_live"), "object": "checkout.session", "mode": mode, "status": "complete",
        "payment_status": payment_status, "amount_subtotal": cents, "amount_total": cents, "currency": currency,
        "client_reference_id": None if user is None else str(user), "customer": customer,
        "customer_creation": "if_required" if mode == "payment" else None,
        "customer_details": {"email": "buyer@example.com"}, "metadata": {} if metadata is None else metadata,
        "payment_intent": intent_id if mode == "payment" else None, "setup_intent": None,
        "subscription": subscription or (_id("sub") if mode == "subscription" else None),
        "created": int(time.time()), "expires_at": int(time.time()) + 86400, "url": None,
        "success_url": "https://example.com/done"}, event_id, api_version=api_version)


def stripe_signed(evt, secret=SECRETS["stripe"]):
    """The event's bytes and the headers Stripe sends with them (stripe-python's signer), signed with secret."""
    body = str(evt).encode()
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, int(time.time()))
    return body, {"Content-Type": "application/json; charset=utf-8", "Stripe-Signature": header}


def send_stripe(to, evt):
    """POST evt, signed by Stripe's signer, to to (helpers.send's: the app's scheme must be stripe)."""
    return send(to, *stripe_signed(evt))


# Thin events (https://docs.stripe.com/api/v2/core/events/object): what each related object is retrieved by.
PATHS = {"payment_intent": "payment_intents", "charge": "charges", "refund": "refunds", "dispute": "disputes",
         "checkout.session": "checkout/sessions"}


def thin(event_type, obj=None, context=None, snapshot_event=None):
    """A thin event of event_type naming obj (a dict with object and id; None: no related object)."""
    document = {"id": f"evt_test_{uuid.uuid4().hex}", "object": "v2.core.event", "type": event_type,
                "created": "2026-12-03T14:00:00.000Z", "livemode": True, "context": context,
                "reason": {"type": "request", "request": {"id": "req_v2test", "idempotency_key": None}}}
    if obj is not None:
        document["related_object"] = {"id": obj["id"], "type": obj["object"],
                                      "url": f"/v1/{PATHS[obj['object']]}/{obj['id']}"}
    if snapshot_event is not None:
        document["snapshot_event"] = snapshot_event
    return document


def thin_signed(document, secret=SECRETS["stripe"]):
    """The thin event's bytes and the headers Stripe sends with them (stripe-python's signer)."""
    body = json.dumps(document).encode()
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, int(time.time()))
    return body, {"Content-Type": "application/json; charset=utf-8", "Stripe-Signature": header}


def deliver(to, evt):
    """POST a snapshot event (a stripe.Event) or a thin event (a dict), signed as Stripe signs it."""
    return send(to, *(thin_signed(evt) if isinstance(evt, dict) else stripe_signed(evt)))
