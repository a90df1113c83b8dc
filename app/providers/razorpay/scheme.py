"""Razorpay's signature scheme: an HMAC-SHA256 of the body, hex, in X-Razorpay-Signature; the event id beside it
is not signed (app/providers/razorpay/rules.py binds it to the body)."""

from collections.abc import Mapping, Sequence

from ...core.signing import Certificates, hex_digest, mac, match, required

SCHEME = "razorpay"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "Razorpay"
SIGNATURE_HEADER = "X-Razorpay-Signature"
EVENT_ID_HEADER = "x-razorpay-event-id"


def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    return match(secrets, [body], [hex_digest(required(headers, SIGNATURE_HEADER).strip(), SIGNATURE_HEADER)])


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """What Razorpay sends with body: its signature, and the event id beside it, unsigned (msg_id, when given)."""
    return {SIGNATURE_HEADER: mac(secrets[0], body).hex(), **({EVENT_ID_HEADER: msg_id} if msg_id else {})}

