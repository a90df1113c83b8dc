"""PayPal's webhook events as PayPal sends them: the envelope (id WH-..., event_version, create_time,
resource_type, event_type, summary, resource, links) and each resource with the fields of PayPal's
sample events, those the ledger reads among them: a Capture (PAYMENT.CAPTURE.COMPLETED, with custom_id
and its links), a Refund (PAYMENT.CAPTURE.REFUNDED and .REVERSED, whose `up` link is
/v2/payments/captures/<capture id>) and a Dispute (CUSTOMER.DISPUTE.*: dispute_id,
disputed_transactions[].seller_transaction_id, dispute_amount, dispute_outcome with its amount_refunded,
money_movements; fields as https://developer.paypal.com/docs/disputes/webhooks/ lists them, and as the
Disputes API's dispute object, https://developer.paypal.com/docs/api/customer-disputes/v1/, defines them).
Event names and what triggers each: https://docs.paypal.ai/reference/webhook-events/payments-v2. Amounts are
PayPal's Money objects, {"currency_code": "USD", "value": "21.00"}."""

import random
import string
import time
import uuid

from tests.helpers import ALICE

API = "https://api.paypal.com"


def new_id(length=17):
    """An id in PayPal's style: 17 upper-case letters and digits (a capture's, a refund's, a webhook's)."""
    return "".join(random.choices(string.ascii_uppercase + string.digits, k=length))


def new_event_id():
    return f"WH-{new_id()}-{new_id()}"


def _stamp():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def envelope(event_type, resource_type, resource, summary="", event_id=None):
    event_id = event_id or new_event_id()
    return {"id": event_id, "event_version": "1.0", "create_time": _stamp(), "resource_type": resource_type,
            "resource_version": "2.0", "event_type": event_type, "summary": summary, "resource": resource,
            "links": [{"href": f"{API}/v1/notifications/webhooks-events/{event_id}", "rel": "self", "method": "GET"},
                      {"href": f"{API}/v1/notifications/webhooks-events/{event_id}/resend", "rel": "resend",
                       "method": "POST"}]}


def money(value, currency="USD"):
    return {"currency_code": currency, "value": value}


def capture_completed(capture_id, user=ALICE, value="21.00", currency="USD", event_id=None, **extra):
    """PAYMENT.CAPTURE.COMPLETED: the Capture, its custom_id the user (as the merchant's order set it)."""
    capture = {"id": capture_id, "amount": money(value, currency), "final_capture": True,
               "seller_protection": {"status": "ELIGIBLE",
                                     "dispute_categories": ["ITEM_NOT_RECEIVED", "UNAUTHORIZED_TRANSACTION"]},
               "seller_receivable_breakdown": {"gross_amount": money(value, currency),
                                               "paypal_fee": money("0.73", currency),
                                               "net_amount": money(value, currency)},
               "custom_id": str(user), "status": "COMPLETED", "create_time": _stamp(), "update_time": _stamp(),
               "supplementary_data": {"related_ids": {"order_id": new_id()}},
               "links": [{"href": f"{API}/v2/payments/captures/{capture_id}", "rel": "self", "method": "GET"},
                         {"href": f"{API}/v2/payments/captures/{capture_id}/refund", "rel": "refund",
                          "method": "POST"},
                         {"href": f"{API}/v2/checkout/orders/{new_id()}", "rel": "up", "method": "GET"}],
               **extra}
    return envelope("PAYMENT.CAPTURE.COMPLETED", "capture", capture, f"Payment completed for {value} {currency}",
                    event_id)


def refund_event(event_type, refund_id, capture_id, value, status="COMPLETED", currency="USD"):
    """PAYMENT.CAPTURE.REFUNDED (the merchant refunds) or .REVERSED (PayPal reverses): a Refund of the capture."""
    refund = {"id": refund_id, "amount": money(value, currency), "note_to_payer": "Defective product",
              "seller_payable_breakdown": {"gross_amount": money(value, currency),
                                           "paypal_fee": money("0.00", currency),
                                           "net_amount": money(value, currency),
                                           "total_refunded_amount": money(value, currency)},
              "status": status, "create_time": _stamp(), "update_time": _stamp(),
              "links": [{"href": f"{API}/v2/payments/refunds/{refund_id}", "rel": "self", "method": "GET"},
                        {"href": f"{API}/v2/payments/captures/{capture_id}", "rel": "up", "method": "GET"}]}
    return envelope(event_type, "refund", refund, f"A {value} {currency} capture payment was refunded")


# The outcomes in which the buyer is refunded (PayPal's sample of a dispute RESOLVED_BUYER_FAVOUR carries
# dispute_outcome.amount_refunded and the money_movements that moved it); the others refund nothing.
REFUNDED_OUTCOMES = ("RESOLVED_BUYER_FAVOUR", "ACCEPTED")
_ALL = object()


def dispute_event(event_type, dispute_id, capture_id, value, status="OPEN", outcome=None, currency="USD",
                  refunded=_ALL):
    """CUSTOMER.DISPUTE.CREATED, .UPDATED or .RESOLVED (with dispute_outcome) on the capture's transaction, for
    value disputed (dispute_amount). Resolved for the buyer, the outcome's amount_refunded is what the buyer got
    back: all of value unless refunded says otherwise (None: PayPal's record says nothing of it)."""
    dispute = {"dispute_id": dispute_id, "create_time": _stamp(), "update_time": _stamp(),
               "disputed_transactions": [{"seller_transaction_id": capture_id,
                                          "seller": {"merchant_id": "RD465XN5VS364", "name": "Test Store"},
                                          "items": [], "seller_protection_eligible": True}],
               "reason": "MERCHANDISE_OR_SERVICE_NOT_RECEIVED", "status": status,
               "dispute_amount": money(value, currency), "dispute_life_cycle_stage": "CHARGEBACK",
               "dispute_channel": "INTERNAL",
               "links": [{"href": f"{API}/v1/customer/disputes/{dispute_id}", "rel": "self", "method": "GET"}]}
    if outcome is not None:
        dispute["dispute_outcome"] = {"outcome_code": outcome}
        refunded = (value if outcome in REFUNDED_OUTCOMES else None) if refunded is _ALL else refunded
        if refunded is not None:
            dispute["dispute_outcome"]["amount_refunded"] = money(refunded, currency)
            dispute["money_movements"] = [
                {"affected_party": party, "amount": money(refunded, currency), "initiated_time": _stamp(),
                 "type": kind, "reason": "DISPUTE_SETTLEMENT"} for party, kind in (("BUYER", "CREDIT"),
                                                                                   ("SELLER", "DEBIT"))]
    return envelope(event_type, "dispute", dispute, f"Dispute {dispute_id}")


def new_dispute_id():
    return f"PP-D-{uuid.uuid4().int % 10**5:05d}"
