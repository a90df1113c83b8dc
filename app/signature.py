"""Webhook signature checking: bytes and headers in, one exception type out, no Flask.

One scheme per deployment, never guessed from the request (so a sender
cannot pick the weakest). Each is an HMAC-SHA256 over the exact raw bytes,
which are never decoded to text, compared timing-safe with every secret:

- `hmac-sha256` (the default): `X-Signature: <hex>` of the body.
- `stripe`: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]` of `<t>.<body>`.
- `standard-webhooks`: `webhook-signature: v1,<base64>[ v1,<base64>...]` of
  `<webhook-id>.<webhook-timestamp>.<body>`.
- `github`: `X-Hub-Signature-256: sha256=<hex>` of the body.
- `razorpay`: `X-Razorpay-Signature: <hex>` of the body. Razorpay signs no
  timestamp and not its `x-razorpay-event-id` header: see app/events.py.

And one that is not an HMAC:

- `paypal`: `PAYPAL-TRANSMISSION-SIG: <base64>`, PayPal's RSA-SHA256
  (SHA256withRSA) signature of `<PAYPAL-TRANSMISSION-ID>|<PAYPAL-TRANSMISSION-TIME>|<webhook id>|<CRC32 of the
  body, unsigned decimal>` ("Self verification method",
  https://developer.paypal.com/api/rest/webhooks/rest/; PayPal's Python SDK, paypalrestsdk's
  WebhookEvent._get_expected_sig, builds the same string). The secrets are the webhook ids; the public key
  is that of the certificate PAYPAL-CERT-URL names, which verify asks of `certificates`
  (app/providers/paypal.py fetches, checks and caches it: this module does no I/O). A CRC32 can be matched
  by any body, so this proves only that PayPal sent a delivery: the event is fetched (app/providers/).

A missing or malformed header raises SignatureError, as a wrong signature
does; no input raises anything else. A missing header's message names the
scheme the source expects, and the scheme whose header the request carries
instead, if any (a Stripe delivery sent to an `hmac-sha256` source): header
names only, never a value.
"""

import base64
import binascii
import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey

_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_BASE64_DIGEST = re.compile(r"[A-Za-z0-9+/]{43}=")  # 32 bytes, standard alphabet
# Plain ASCII digits: int() would also take "+1", " 1", "1_0" or "١", and a
# ten-thousand-digit string would make it raise. Twelve digits reach year 33000.
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")
# webhook-id is signed material and becomes the event id (at most 128 chars).
_WEBHOOK_ID = re.compile(r"[\x21-\x7e]{1,128}")


class SignatureError(ValueError):
    """The delivery is not authentic; the message says why in general terms."""


class Headers(Protocol):
    """What verify reads of a request's headers: a dict's or Werkzeug's Headers' items()."""

    def items(self) -> Iterable[tuple[str, str]]: ...


class Certificates(Protocol):
    """Where the paypal scheme gets the public key of the certificate a PAYPAL-CERT-URL names (app/providers/paypal.py).

    It raises SignatureError for a URL or a certificate it refuses, and may
    raise another error (answered 503) when the certificate cannot be had now.
    """

    def __call__(self, url: str, now: float) -> RSAPublicKey: ...


def verify(scheme: str, body: bytes, headers: Headers, secrets: Sequence[bytes], tolerance: int,
           now: float | None = None, certificates: Certificates | None = None) -> int:
    """Return the index of the secret that signed the delivery, or raise SignatureError.

    certificates is needed by the paypal scheme alone (its secrets are webhook ids, its key PayPal's).
    """
    lowered = {str(name).lower(): value for name, value in headers.items()}
    try:
        return _SCHEMES[scheme][0](body, lowered, secrets, tolerance, time.time() if now is None else now,
                                   certificates)
    except _MissingHeaderError as exc:
        raise SignatureError(f"{exc}: {_expected(scheme, lowered)}") from None


def _hmac_sha256(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
                 certificates: Certificates | None) -> int:
    return _match(secrets, [body], [_hex(_required(headers, "X-Signature").strip(), "X-Signature")])


def _stripe(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
            certificates: Certificates | None) -> int:
    name = "Stripe-Signature"
    stamps, signatures = [], []
    for item in _required(headers, name).split(","):
        key, equals, value = item.strip().partition("=")
        if not equals:
            raise SignatureError(f"malformed {name} header: expected comma-separated key=value pairs")
        if key == "t":
            stamps.append(value)
        elif key == "v1":
            signatures.append(_hex(value, name))
        # v0 (Stripe's test scheme) and keys added later are ignored, as Stripe's own verifier does.
    if len(stamps) != 1:
        raise SignatureError(f"malformed {name} header: expected exactly one t=<timestamp>")
    if not signatures:
        raise SignatureError(f"{name} header has no v1 signature")
    _check_timestamp(stamps[0], name, tolerance, now)
    return _match(secrets, [stamps[0].encode(), b".", body], signatures)


def _standard_webhooks(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int,
                       now: float, certificates: Certificates | None) -> int:
    msg_id = _required(headers, "webhook-id")
    if not _WEBHOOK_ID.fullmatch(msg_id):
        raise SignatureError("malformed webhook-id header: expected 1 to 128 visible ASCII characters")
    stamp = _required(headers, "webhook-timestamp").strip()
    signatures = []
    for item in _required(headers, "webhook-signature").split():
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
    _check_timestamp(stamp, "webhook-timestamp", tolerance, now)
    return _match(secrets, [msg_id.encode(), b".", stamp.encode(), b".", body], signatures)


def _github(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
            certificates: Certificates | None) -> int:
    name = "X-Hub-Signature-256"
    algorithm, equals, digest = _required(headers, name).strip().partition("=")
    if algorithm != "sha256" or not equals:
        raise SignatureError(f"malformed {name} header: expected sha256=<hex>")
    return _match(secrets, [body], [_hex(digest, name)])


def _razorpay(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
              certificates: Certificates | None) -> int:
    name = "X-Razorpay-Signature"
    return _match(secrets, [body], [_hex(_required(headers, name).strip(), name)])


# PayPal's (https://developer.paypal.com/api/webhooks/v1/, verify-webhook-signature's request): a
# transmission id matches ^(?!\d+$)\w+\S+ in at most 50 characters (a UUID in practice); narrowed to
# ASCII word characters and '-', so that no '|' can move a field of the signed string.
_TRANSMISSION_ID = re.compile(r"[0-9A-Za-z_-]{1,50}")
# "Internet date and time format" (RFC 3339), as PayPal sends it: 2016-02-18T20:01:35Z.
_TRANSMISSION_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})")
# The only algorithm accepted, whatever PAYPAL-AUTH-ALGO says otherwise: it is not signed, and PayPal's
# SDK would also take SHA1withRSA.
PAYPAL_AUTH_ALGO = "SHA256withRSA"
# A 4096-bit RSA signature is 684 base64 characters; PayPal's limit for the field is 500.
_MAX_SIGNATURE_CHARS = 1024


def _paypal(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
            certificates: Certificates | None) -> int:
    """PayPal's own check ("Self verification method"): the headers' fields, the time, then the certificate."""
    transmission_id = _required(headers, "PAYPAL-TRANSMISSION-ID")
    if not _TRANSMISSION_ID.fullmatch(transmission_id):
        raise SignatureError("malformed PAYPAL-TRANSMISSION-ID header: expected 1 to 50 letters, digits, _ or -")
    stamp = _required(headers, "PAYPAL-TRANSMISSION-TIME")
    try:
        if not _TRANSMISSION_TIME.fullmatch(stamp):
            raise ValueError
        sent = datetime.fromisoformat(stamp).timestamp()  # ValueError for a 13th month, a 25th hour
    except ValueError:
        raise SignatureError("malformed PAYPAL-TRANSMISSION-TIME header: expected an RFC 3339 date and time") from None
    algorithm = _required(headers, "PAYPAL-AUTH-ALGO")
    if algorithm != PAYPAL_AUTH_ALGO:
        raise SignatureError(f"PAYPAL-AUTH-ALGO must be {PAYPAL_AUTH_ALGO}")
    raw_signature = _required(headers, "PAYPAL-TRANSMISSION-SIG").strip()
    try:
        if len(raw_signature) > _MAX_SIGNATURE_CHARS:
            raise ValueError
        received = base64.b64decode(raw_signature, validate=True)
    except (ValueError, binascii.Error):
        raise SignatureError("malformed PAYPAL-TRANSMISSION-SIG header: expected base64") from None
    url = _required(headers, "PAYPAL-CERT-URL").strip()
    _check_age(now - sent, tolerance)
    if certificates is None:
        raise TypeError("the paypal scheme verifies with a certificate source: pass certificates")
    key = certificates(url, now)  # after every cheap refusal: nothing is fetched for a malformed delivery
    crc = str(binascii.crc32(body) & 0xFFFFFFFF).encode()  # the SDK's: unsigned, base 10
    matched = -1
    for index, webhook_id in enumerate(secrets):
        try:
            key.verify(received, b"|".join([transmission_id.encode(), stamp.encode(), webhook_id, crc]),
                       padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            continue
        matched = index
        break  # the webhook id is no secret: which one matched may show in the time taken
    if matched < 0:
        raise SignatureError("signature does not match")
    return matched


# A scheme's verifier: (body, lowered headers, secrets, tolerance, now, certificates) -> the secret's index.
# Only paypal reads certificates; the HMAC schemes sign with the secrets alone.
_Verifier = Callable[[bytes, Mapping[str, str], Sequence[bytes], int, float, "Certificates | None"], int]
# Each scheme's verifier, and the header that tells its deliveries apart (standard-webhooks sends two more),
# named to a delivery that lacks its source's.
_SCHEMES: dict[str, tuple[_Verifier, str]] = {
    "hmac-sha256": (_hmac_sha256, "X-Signature"),
    "stripe": (_stripe, "Stripe-Signature"),
    "standard-webhooks": (_standard_webhooks, "webhook-signature"),
    "github": (_github, "X-Hub-Signature-256"),
    "razorpay": (_razorpay, "X-Razorpay-Signature"),
    "paypal": (_paypal, "PAYPAL-TRANSMISSION-SIG"),
}
SCHEMES = tuple(_SCHEMES)
# Those whose sign() and verify() need nothing but the secrets (keys): every scheme but paypal, whose
# verifier needs PayPal's certificate and whose signer a private key (tests/test_paypal_scheme.py).
HMAC_SCHEMES = tuple(scheme for scheme in SCHEMES if scheme != "paypal")


class _MissingHeaderError(SignatureError):
    """A header the scheme signs is absent; verify adds which scheme the source expects."""


def _expected(scheme: str, headers: Mapping[str, str]) -> str:
    """What a delivery lacking the scheme's header is told: the scheme, and the one it seems signed by."""
    said = f"this source verifies the {scheme} scheme"
    others = [(other, name) for other, (_, name) in _SCHEMES.items() if other != scheme and name.lower() in headers]
    if others:
        said += f", and the request carries {others[0][1]}, the {others[0][0]} scheme's header"
    return said


def _required(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name.lower())
    if not isinstance(value, str) or not value.strip():
        raise _MissingHeaderError(f"missing {name} header")
    return value


def _hex(value: str, header: str) -> bytes:
    if not _HEX_DIGEST.fullmatch(value):
        raise SignatureError(f"malformed {header} header: expected 64 hex digits")
    return bytes.fromhex(value)


def _check_timestamp(value: str, header: str, tolerance: int, now: float) -> None:
    """Refuse a delivery signed too long ago (a replay) or too far ahead (a skewed or forged clock)."""
    if not _UNIX_SECONDS.fullmatch(value):
        raise SignatureError(f"malformed {header} header: expected a timestamp in Unix seconds")
    _check_age(now - int(value), tolerance)


def _check_age(age: float, tolerance: int) -> None:
    if age > tolerance:
        raise SignatureError("timestamp is too old: outside the tolerance window")
    if age < -tolerance:
        raise SignatureError("timestamp is too far in the future: outside the tolerance window")


def _match(secrets: Sequence[bytes], signed_parts: Sequence[bytes], received: Sequence[bytes]) -> int:
    """Return the index of the first secret whose HMAC of signed_parts is among received."""
    # Every secret and every candidate is compared, so the time taken does not tell which matched.
    matched = -1
    for index, secret in enumerate(secrets):
        expected = _mac(secret, *signed_parts)
        for candidate in received:
            if hmac.compare_digest(expected, candidate) and matched < 0:
                matched = index
    if matched < 0:
        raise SignatureError("signature does not match")
    return matched


def _mac(secret: bytes, *parts: bytes) -> bytes:
    # Fed part by part: the body is never copied into a bigger buffer.
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


# -- the senders' side: the twin of each verifier, for the tests, the docs'
# recipes, `make run`'s printed command and `make bench` ---------------------


def sign(scheme: str, body: bytes, secrets: Iterable[bytes], *, timestamp: int | None = None,
         msg_id: str | None = None, private_key: RSAPrivateKey | None = None,
         cert_url: str | None = None) -> dict[str, str]:
    """Return the signature headers a sender of scheme sends with body.

    secrets are keys as configured (Standard Webhooks': the bytes after
    whsec_). The timestamped schemes sign one v1 per secret, as a sender
    rolling its secret does; the others sign with the first. timestamp
    defaults to now; msg_id is standard-webhooks' webhook-id (required there)
    and razorpay's x-razorpay-event-id (sent when given).

    paypal signs as PayPal does: for the first secret (the webhook id), with
    private_key, the key of the certificate at cert_url (both required);
    msg_id is the transmission id (default a new UUID).
    """
    stamp = int(time.time() if timestamp is None else timestamp)
    if scheme == "paypal":
        if private_key is None or cert_url is None:
            raise ValueError("paypal signs with the private key of the certificate at cert_url: pass both")
        return _sign_paypal(body, next(iter(secrets)), stamp, msg_id or str(uuid.uuid4()), private_key, cert_url)
    return _SIGNERS[scheme](body, list(secrets), stamp, msg_id)


def _sign_hmac_sha256(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Signature": _mac(secrets[0], body).hex()}


def _sign_stripe(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    t = str(timestamp)
    v1 = ",".join(f"v1={_mac(s, t.encode(), b'.', body).hex()}" for s in secrets)
    return {"Stripe-Signature": f"t={t},{v1}"}


def _sign_standard_webhooks(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    if not msg_id:
        raise ValueError("standard-webhooks signs a webhook-id: pass msg_id")
    t = str(timestamp)
    signatures = " ".join(
        "v1," + base64.b64encode(_mac(s, msg_id.encode(), b".", t.encode(), b".", body)).decode() for s in secrets
    )
    return {"webhook-id": msg_id, "webhook-timestamp": t, "webhook-signature": signatures}


def _sign_github(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + _mac(secrets[0], body).hex()}


def _sign_razorpay(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    # The event id rides beside the signature, unsigned, as Razorpay sends it.
    return {"X-Razorpay-Signature": _mac(secrets[0], body).hex(), **({"x-razorpay-event-id": msg_id} if msg_id else {})}


def _sign_paypal(body: bytes, webhook_id: bytes, timestamp: int, transmission_id: str, private_key: RSAPrivateKey,
                 cert_url: str) -> dict[str, str]:
    stamp = datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    crc = str(binascii.crc32(body) & 0xFFFFFFFF).encode()
    signed = private_key.sign(b"|".join([transmission_id.encode(), stamp.encode(), webhook_id, crc]),
                              padding.PKCS1v15(), hashes.SHA256())
    return {"PAYPAL-TRANSMISSION-ID": transmission_id, "PAYPAL-TRANSMISSION-TIME": stamp,
            "PAYPAL-TRANSMISSION-SIG": base64.b64encode(signed).decode(), "PAYPAL-CERT-URL": cert_url,
            "PAYPAL-AUTH-ALGO": PAYPAL_AUTH_ALGO}


# paypal's signer takes a private key and a certificate's URL besides: sign() calls it itself.
_SIGNERS: dict[str, Callable[[bytes, list[bytes], int, str | None], dict[str, str]]] = {
    "hmac-sha256": _sign_hmac_sha256,
    "stripe": _sign_stripe,
    "standard-webhooks": _sign_standard_webhooks,
    "github": _sign_github,
    "razorpay": _sign_razorpay,
}
