"""What every signature scheme shares: SignatureError, and the checks of a header, a timestamp and an HMAC.
Pure (no I/O, no Flask): the schemes are app/intake/signature.py's and each provider module's."""

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey

_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
# Plain ASCII digits: int() would also take "+1", " 1", "1_0" or "١", and a
# ten-thousand-digit string would make it raise. Twelve digits reach year 33000.
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")


class SignatureError(ValueError):
    """The delivery is not authentic; the message says why in general terms."""


class MissingHeaderError(SignatureError):
    """A header the scheme signs is absent; verify adds which scheme the source expects."""


class Certificates(Protocol):
    """Where the paypal scheme gets the public key of the certificate a PAYPAL-CERT-URL names: SignatureError for
    one it refuses, another error (answered 503) when the certificate cannot be had now."""

    def __call__(self, url: str, now: float) -> RSAPublicKey: ...


def required(headers: Mapping[str, str], name: str) -> str:
    """The header's value (headers' names in lower case), or MissingHeaderError."""
    value = headers.get(name.lower())
    if not isinstance(value, str) or not value.strip():
        raise MissingHeaderError(f"missing {name} header")
    return value


def hex_digest(value: str, header: str) -> bytes:
    if not _HEX_DIGEST.fullmatch(value):
        raise SignatureError(f"malformed {header} header: expected 64 hex digits")
    return bytes.fromhex(value)


def check_timestamp(value: str, header: str, tolerance: int, now: float) -> None:
    """Refuse a delivery signed too long ago (a replay) or too far ahead (a skewed or forged clock)."""
    if not _UNIX_SECONDS.fullmatch(value):
        raise SignatureError(f"malformed {header} header: expected a timestamp in Unix seconds")
    check_age(now - int(value), tolerance)


def check_age(age: float, tolerance: int) -> None:
    if age > tolerance:
        raise SignatureError("timestamp is too old: outside the tolerance window")
    if age < -tolerance:
        raise SignatureError("timestamp is too far in the future: outside the tolerance window")


def match(secrets: Sequence[bytes], signed_parts: Sequence[bytes], received: Sequence[bytes]) -> int:
    """Return the index of the first secret whose HMAC of signed_parts is among received."""
    # Every secret and every candidate is compared, so the time taken does not tell which matched.
    matched = -1
    for index, secret in enumerate(secrets):
        expected = mac(secret, *signed_parts)
        for candidate in received:
            if hmac.compare_digest(expected, candidate) and matched < 0:
                matched = index
    if matched < 0:
        raise SignatureError("signature does not match")
    return matched


def mac(secret: bytes, *parts: bytes) -> bytes:
    # Fed part by part: the body is never copied into a bigger buffer.
    digest = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(part)
    return digest.digest()
