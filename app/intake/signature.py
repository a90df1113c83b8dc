"""Webhook signature checking: bytes and headers in, one exception type out, no Flask.
Here are the generic schemes and the table of every scheme; each provider's own is in its module (docs/providers/)."""

import base64
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from ..core.signing import (
    Certificates,
    MissingHeaderError,
    SignatureError,
    check_timestamp,
    hex_digest,
    mac,
    match,
    required,
)
from ..core.vocabulary import MAX_ID_CHARS
from ..providers import paypal, razorpay, stripe

__all__ = ["HMAC_SCHEMES", "SCHEMES", "Certificates", "SignatureError", "sign", "verify"]

_BASE64_DIGEST = re.compile(r"[A-Za-z0-9+/]{43}=")  # 32 bytes, standard alphabet
# webhook-id is signed material and becomes the event id (MAX_ID_CHARS at most).
_WEBHOOK_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_ID_CHARS}}}")


class Headers(Protocol):
    """What verify reads of a request's headers: a dict's or Werkzeug's Headers' items()."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def verify(scheme: str, body: bytes, headers: Headers, secrets: Sequence[bytes], tolerance: int,
           now: float | None = None, certificates: Certificates | None = None) -> int:
    """Return the index of the secret that signed the delivery, or raise SignatureError.

    certificates is needed by the paypal scheme alone (its secrets are webhook ids, its key PayPal's).
    """
    lowered = {str(name).lower(): value for name, value in headers.items()}
    try:
        return _SCHEMES[scheme][0](body, lowered, secrets, tolerance, time.time() if now is None else now,
                                   certificates)
    except MissingHeaderError as exc:
        raise SignatureError(f"{exc}: {_expected(scheme, lowered)}") from None


def _hmac_sha256(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
                 certificates: Certificates | None) -> int:
    return match(secrets, [body], [hex_digest(required(headers, "X-Signature").strip(), "X-Signature")])


def _standard_webhooks(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int,
                       now: float, certificates: Certificates | None) -> int:
    msg_id = required(headers, "webhook-id")
    if not _WEBHOOK_ID.fullmatch(msg_id):
        raise SignatureError(f"malformed webhook-id header: expected 1 to {MAX_ID_CHARS} visible ASCII characters")
    stamp = required(headers, "webhook-timestamp").strip()
    signatures = []
    for item in required(headers, "webhook-signature").split():
        version, comma, value = item.partition(",")
        if not comma:
            raise SignatureError("malformed webhook-signature header: expected space-separated v1,<base64>")
        if version == "v1":
            if not _BASE64_DIGEST.fullmatch(value):
                raise SignatureError("malformed webhook-signature header: v1 must be a base64 SHA-256 digest")
            signatures.append(base64.b64decode(value))
        # v1a (asymmetric) and later versions are ignored, as the specification says.
    if not signatures:
        raise SignatureError("webhook-signature header has no v1 signature")
    check_timestamp(stamp, "webhook-timestamp", tolerance, now)
    return match(secrets, [msg_id.encode(), b".", stamp.encode(), b".", body], signatures)


def _github(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
            certificates: Certificates | None) -> int:
    name = "X-Hub-Signature-256"
    algorithm, equals, digest = required(headers, name).strip().partition("=")
    if algorithm != "sha256" or not equals:
        raise SignatureError(f"malformed {name} header: expected sha256=<hex>")
    return match(secrets, [body], [hex_digest(digest, name)])


# A scheme's verifier: (body, lowered headers, secrets, tolerance, now, certificates) -> the secret's index.
# Only paypal reads certificates; the HMAC schemes sign with the secrets alone.
_Verifier = Callable[[bytes, Mapping[str, str], Sequence[bytes], int, float, "Certificates | None"], int]
# Each scheme's verifier, and the header that tells its deliveries apart (standard-webhooks sends two more),
# named to a delivery that lacks its source's.
_SCHEMES: dict[str, tuple[_Verifier, str]] = {
    "hmac-sha256": (_hmac_sha256, "X-Signature"),
    stripe.SCHEME: (stripe.verify, stripe.SIGNATURE_HEADER),
    "standard-webhooks": (_standard_webhooks, "webhook-signature"),
    "github": (_github, "X-Hub-Signature-256"),
    razorpay.SCHEME: (razorpay.verify, razorpay.SIGNATURE_HEADER),
    paypal.SCHEME: (paypal.verify, paypal.SIGNATURE_HEADER),
}
SCHEMES = tuple(_SCHEMES)
# Those whose sign() and verify() need nothing but the secrets (keys): every scheme but paypal, whose
# verifier needs PayPal's certificate and whose signer a private key (tests/test_paypal_scheme.py).
HMAC_SCHEMES = tuple(scheme for scheme in SCHEMES if scheme != paypal.SCHEME)


def _expected(scheme: str, headers: Mapping[str, str]) -> str:
    """What a delivery lacking the scheme's header is told: the scheme, and the one it seems signed by."""
    said = f"this source verifies the {scheme} scheme"
    others = [(other, name) for other, (_, name) in _SCHEMES.items() if other != scheme and name.lower() in headers]
    if others:
        said += f", and the request carries {others[0][1]}, the {others[0][0]} scheme's header"
    return said


# -- the senders' side: the twin of each verifier, for the tests, the docs'
# recipes, `make run`'s printed command and `make bench` ---------------------


def sign(scheme: str, body: bytes, secrets: Iterable[bytes], *, timestamp: int | None = None,
         msg_id: str | None = None, private_key: RSAPrivateKey | None = None,
         cert_url: str | None = None) -> dict[str, str]:
    """Return the signature headers a sender of scheme sends with body.

    secrets are keys as configured (Standard Webhooks': the bytes after whsec_); the timestamped schemes sign one
    v1 per secret, as a sender rolling its secret does, the others with the first. timestamp defaults to now; msg_id
    is standard-webhooks' webhook-id (required there), razorpay's x-razorpay-event-id (sent when given) and paypal's
    transmission id (default a new UUID). paypal signs for the first secret (the webhook id) with private_key, the
    key of the certificate at cert_url (both required).
    """
    stamp = int(time.time() if timestamp is None else timestamp)
    if scheme == paypal.SCHEME:
        if private_key is None or cert_url is None:
            raise ValueError("paypal signs with the private key of the certificate at cert_url: pass both")
        return paypal.sign(body, next(iter(secrets)), stamp, msg_id or str(uuid.uuid4()), private_key, cert_url)
    return _SIGNERS[scheme](body, list(secrets), stamp, msg_id)


def _sign_hmac_sha256(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Signature": mac(secrets[0], body).hex()}


def _sign_standard_webhooks(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    if not msg_id:
        raise ValueError("standard-webhooks signs a webhook-id: pass msg_id")
    t = str(timestamp)
    signatures = " ".join(
        "v1," + base64.b64encode(mac(s, msg_id.encode(), b".", t.encode(), b".", body)).decode() for s in secrets
    )
    return {"webhook-id": msg_id, "webhook-timestamp": t, "webhook-signature": signatures}


def _sign_github(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + mac(secrets[0], body).hex()}


# paypal's signer takes a private key and a certificate's URL besides: sign() calls it itself.
_SIGNERS: dict[str, Callable[[bytes, list[bytes], int, str | None], dict[str, str]]] = {
    "hmac-sha256": _sign_hmac_sha256,
    stripe.SCHEME: stripe.sign,
    "standard-webhooks": _sign_standard_webhooks,
    "github": _sign_github,
    razorpay.SCHEME: razorpay.sign,
}
