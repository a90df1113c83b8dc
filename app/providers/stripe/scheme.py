"""Stripe's signature scheme: the Stripe-Signature header, verified and signed (docs/providers/stripe.md)."""

from collections.abc import Mapping, Sequence

from ...core.signing import Certificates, SignatureError, check_timestamp, hex_digest, mac, match, required

SCHEME = "stripe"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "Stripe"
# The header that tells its deliveries apart, named to a delivery sent to a source of another scheme.
SIGNATURE_HEADER = "Stripe-Signature"


def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """The index of the secret that signed body (headers' names in lower case), or SignatureError."""
    name = SIGNATURE_HEADER
    stamps, signatures = [], []
    for item in required(headers, name).split(","):
        key, equals, value = item.strip().partition("=")
        if not equals:
            raise SignatureError(f"malformed {name} header: expected comma-separated key=value pairs")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            signatures.append(hex_digest(value, name))
        # v0 (Stripe's test scheme) and keys added later are ignored, as Stripe's own verifier does.
    if len(stamps) != 1:
        raise SignatureError(f"malformed {name} header: expected exactly one t=<timestamp>")
    if not signatures:
        raise SignatureError(f"{name} header has no v1 signature")
    check_timestamp(stamps[0], name, tolerance, now)
    return match(secrets, [stamps[0].encode(), b".", body], signatures)


def sign(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    """The header Stripe sends with body: one v1 per secret, as while a secret rolls."""
    t = str(timestamp)
    v1 = ",".join(f"v1={mac(s, t.encode(), b'.', body).hex()}" for s in secrets)
    return {SIGNATURE_HEADER: f"t={t},{v1}"}
