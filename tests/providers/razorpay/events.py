"""Razorpay's webhook events as Razorpay sends them: the envelope (entity, account_id, event, contains,
payload.<name>.entity, created_at) and each entity with the fields Razorpay's API reference and webhook
sample payloads show (https://razorpay.com/docs/webhooks/payloads/payments,
https://razorpay.com/docs/api/refunds/entity, https://razorpay.com/docs/api/disputes/entity), those
the ledger reads among them. Amounts are in the currency's subunits (paise for INR)."""

import time
import uuid

from tests.helpers import ALICE

CURRENCY = "INR"


def new_id(prefix):
    """An id in Razorpay's style: a prefix and 14 base62 characters."""
    return f"{prefix}_{uuid.uuid4().hex[:14]}"


def envelope(event_type, **entities):
    """The event: its type in `event`, each entity under payload.<name>.entity; the id travels in a header."""
    return {"entity": "event", "account_id": "acc_BFQ7uQEaa7j2z7", "event": event_type,
            "contains": list(entities), "payload": {name: {"entity": entity} for name, entity in entities.items()},
            "created_at": int(time.time())}


def payment_entity(payment_id, user=ALICE, paise=50000, status="captured", order_id=None, notes=None, **extra):
    return {"id": payment_id, "entity": "payment", "amount": paise, "currency": CURRENCY, "status": status,
            "order_id": order_id, "invoice_id": None, "international": False, "method": "upi",
            "amount_refunded": 0, "refund_status": None, "captured": status in ("captured", "refunded"),
            "description": "Test Transaction", "email": "gaurav.kumar@example.com", "contact": "+919000090000",
            "notes": {"user_id": str(user)} if notes is None else notes, "fee": 1180, "tax": 180,
            "error_code": None, "error_description": None, "created_at": int(time.time()), **extra}


def payment_captured(payment_id, user=ALICE, paise=50000, **extra):
    return envelope("payment.captured", payment=payment_entity(payment_id, user, paise, **extra))


def order_paid(payment_id, user=ALICE, paise=50000, order_id=None):
    """order.paid: the order and the payment that paid it (the same payment as payment.captured's)."""
    order_id = order_id or new_id("order")
    order = {"id": order_id, "entity": "order", "amount": paise, "amount_paid": paise, "amount_due": 0,
             "currency": CURRENCY, "receipt": "rcptid #1", "status": "paid", "attempts": 1, "notes": [],
             "created_at": int(time.time())}
    return envelope("order.paid", payment=payment_entity(payment_id, user, paise, order_id=order_id), order=order)


def refund_entity(refund_id, payment_id, paise, status):
    return {"id": refund_id, "entity": "refund", "amount": paise, "currency": CURRENCY, "payment_id": payment_id,
            "notes": [], "receipt": None, "acquirer_data": {"arn": None}, "created_at": int(time.time()),
            "batch_id": None, "status": status, "speed_processed": "normal", "speed_requested": "normal"}


def refund_event(event_type, refund_id, payment_id, paise, status):
    """refund.created (pending), refund.processed (processed) or refund.failed (failed), with its payment."""
    return envelope(event_type, refund=refund_entity(refund_id, payment_id, paise, status),
                    payment=payment_entity(payment_id, status="captured"))


def dispute_event(event_type, dispute_id, payment_id, paise, status, deducted=None):
    """payment.dispute.<status>: the Dispute entity for paise disputed (amount), with its payment. amount_deducted
    is what Razorpay deducted from the merchant: 0 unless the dispute is lost (the Disputes entity's page), then all
    of it unless deducted says otherwise; deducted also stands for a deduction at onset (Deduct at Onset)."""
    deducted = (paise if status == "lost" else 0) if deducted is None else deducted
    dispute = {"id": dispute_id, "entity": "dispute", "payment_id": payment_id, "amount": paise,
               "currency": CURRENCY, "amount_deducted": deducted, "reason_code": "chargeback",
               "respond_by": int(time.time()) + 86400 * 7, "status": status, "phase": "chargeback",
               "created_at": int(time.time())}
    return envelope(event_type, dispute=dispute, payment=payment_entity(payment_id, status="captured"))
