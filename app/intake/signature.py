"""Webhook signature checking: bytes and headers in, one exception type out, no Flask. Each scheme's verifier and
its signer twin are its provider's (app/providers/, asked through the registry)."""

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from ..core.signing import Certificates, MissingHeaderError, SignatureError
from ..providers import PROVIDERS, SCHEMES, of

__all__ = ["HMAC_SCHEMES", "SCHEMES", "Certificates", "SignatureError", "sign", "verify"]

# Those whose sign() and verify() need nothing but the secrets (keys): every scheme whose sender signs with them.
HMAC_SCHEMES = tuple(scheme for scheme, provider in PROVIDERS.items() if provider.sign is not None)


class Headers(Protocol):
    """What verify reads of a request's headers: a dict's or Werkzeug's Headers' items()."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def verify(scheme: str, body: bytes, headers: Headers, secrets: Sequence[bytes], tolerance: int,
           now: float | None = None, certificates: Certificates | None = None) -> int:
    """Return the index of the secret that signed the delivery, or raise SignatureError.

    certificates is needed by a scheme whose provider signs with its own key (paypal).
    """
    lowered = {str(name).lower(): value for name, value in headers.items()}
    try:
        return of(scheme).verify(body, lowered, secrets, tolerance, time.time() if now is None else now, certificates)
    except MissingHeaderError as exc:
        raise SignatureError(f"{exc}: {_expected(scheme, lowered)}") from None


def _expected(scheme: str, headers: Mapping[str, str]) -> str:
    """What a delivery lacking the scheme's header is told: the scheme, and the one it seems signed by."""
    said = f"this source verifies the {scheme} scheme"
    others = [(other, provider.signature_header) for other, provider in PROVIDERS.items()
              if other != scheme and provider.signature_header.lower() in headers]
    if others:
        said += f", and the request carries {others[0][1]}, the {others[0][0]} scheme's header"
    return said


def sign(scheme: str, body: bytes, secrets: Iterable[bytes], *, timestamp: int | None = None,
         msg_id: str | None = None, private_key: RSAPrivateKey | None = None,
         cert_url: str | None = None) -> dict[str, str]:
    """The signature headers a sender of scheme sends with body: the tests', the docs' recipes', `make run`'s and
    `make bench`'s signer."""
    # secrets are keys as configured (Standard Webhooks': the bytes after whsec_); the timestamped schemes sign one v1
    # per secret, as a sender rolling its secret does, the others with the first. timestamp defaults to now; msg_id is
    # standard-webhooks' webhook-id (required there), razorpay's x-razorpay-event-id (sent when given) and paypal's
    # transmission id (default a new UUID). paypal signs for the first secret (the webhook id) with private_key, the
    # key of the certificate at cert_url (both required).
    stamp = int(time.time() if timestamp is None else timestamp)
    provider = of(scheme)
    if provider.sign is not None:
        return provider.sign(body, list(secrets), stamp, msg_id)
    if provider.sign_with_key is None or private_key is None or cert_url is None:
        raise ValueError(f"{scheme} signs with the private key of the certificate at cert_url: pass both")
    return provider.sign_with_key(body, next(iter(secrets)), stamp, msg_id or str(uuid.uuid4()), private_key, cert_url)
