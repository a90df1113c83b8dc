"""What a delivery came to: the ledger's answer, shared by the view, the ledger, the lock, metrics and the CLI.
No Flask here: the ledger and the lock speak this vocabulary without importing a request module."""

from enum import StrEnum


class Outcome(StrEnum):
    """What a delivery came to: the `outcome` of its log line and metrics."""

    PROCESSED = "processed"  # effects committed by this delivery
    DUPLICATE = "duplicate"  # committed before; nothing changed
    ACCEPTED = "accepted"  # recorded as received; its money moves when the provider's record is read (202)
    FAILED = "failed"  # recorded as failed: the effect cannot apply (422)
    IGNORED = "ignored"  # a payment that names no user, or a movement of one, under NO_USER=ignore (200)
    PAYLOAD_MISMATCH = "payload_mismatch"  # this id was stored with a different effect (409)
    PAYMENT_MISMATCH = "payment_mismatch"  # its payment was credited with another user, amount or currency (409)
    IN_PROGRESS = "in_progress"  # a twin delivery holds the lock (409)
    UNAVAILABLE = "unavailable"  # the database did not answer; nothing committed (503)
    REJECTED = "rejected"  # refused before the ledger: 400, 401, 404, 413, 415
    ERROR = "error"  # a bug (500)
