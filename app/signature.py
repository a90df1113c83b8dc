"""Webhook signature checking: bytes in, one exception type out, no Flask.

Scheme `hmac-sha256` (seed 000): header `X-Signature: <hex>`, the
HMAC-SHA256 of the exact raw request body.
"""

import hashlib
import hmac

HEADER = "X-Signature"
_HEX_DIGEST_LEN = hashlib.sha256().digest_size * 2


class SignatureError(ValueError):
    """The delivery is not authentic; the message says why in general terms."""


def generate_signature(body: bytes, secret: bytes) -> str:
    """Return the header value a sender puts on body (the tests' signer)."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(body: bytes, header: str | None, secrets) -> int:
    """Return the index of the secret that signed body, or raise SignatureError."""
    if not header:
        raise SignatureError(f"missing {HEADER} header")
    header = header.strip()
    if len(header) != _HEX_DIGEST_LEN:
        raise SignatureError(f"malformed {HEADER} header: expected {_HEX_DIGEST_LEN} hex digits")
    try:
        received = bytes.fromhex(header)
    except ValueError:
        raise SignatureError(f"malformed {HEADER} header: not hexadecimal") from None
    # Every secret is tried, so the time taken does not depend on which matched.
    matched = -1
    for index, secret in enumerate(secrets):
        expected = hmac.new(secret, body, hashlib.sha256).digest()
        if hmac.compare_digest(expected, received) and matched < 0:
            matched = index
    if matched < 0:
        raise SignatureError("signature does not match")
    return matched
