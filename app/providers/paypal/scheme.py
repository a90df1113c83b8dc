"""PayPal's signature scheme: PayPal signs with its certificate's private key, over the transmission's id and time,
the webhook id and a CRC32 of the body (not the body itself: each event is fetched, app/providers/paypal/api.py)."""

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from ...core.signing import Certificates, SignatureError, check_age, required

SCHEME = "paypal"  # also the name its calls are counted under (app/receiver/metrics.py)
NAME = "PayPal"
SIGNATURE_HEADER = "PAYPAL-TRANSMISSION-SIG"

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


def verify(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
           certificates: Certificates | None) -> int:
    """PayPal's own check ("Self verification method"): the headers' fields, the time, then the certificate."""
    transmission_id = required(headers, "PAYPAL-TRANSMISSION-ID")
    if not _TRANSMISSION_ID.fullmatch(transmission_id):
        raise SignatureError("malformed PAYPAL-TRANSMISSION-ID header: expected 1 to 50 letters, digits, _ or -")
    stamp = required(headers, "PAYPAL-TRANSMISSION-TIME")
    try:
        if not _TRANSMISSION_TIME.fullmatch(stamp):
            raise ValueError
        sent = datetime.fromisoformat(stamp).timestamp()  # ValueError for a 13th month, a 25th hour
    except ValueError:
        raise SignatureError("malformed PAYPAL-TRANSMISSION-TIME header: expected an RFC 3339 date and time") from None
    algorithm = required(headers, "PAYPAL-AUTH-ALGO")
    if algorithm != PAYPAL_AUTH_ALGO:
        raise SignatureError(f"PAYPAL-AUTH-ALGO must be {PAYPAL_AUTH_ALGO}")
    raw_signature = required(headers, "PAYPAL-TRANSMISSION-SIG").strip()
    try:
        if len(raw_signature) > _MAX_SIGNATURE_CHARS:
            raise ValueError
        received = base64.b64decode(raw_signature, validate=True)
    except (ValueError, binascii.Error):
        raise SignatureError("malformed PAYPAL-TRANSMISSION-SIG header: expected base64") from None
    url = required(headers, "PAYPAL-CERT-URL").strip()
    check_age(now - sent, tolerance)
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


def sign(body: bytes, webhook_id: bytes, timestamp: int, transmission_id: str, private_key: RSAPrivateKey,
         cert_url: str) -> dict[str, str]:
    """The five headers PayPal sends with body, signed with private_key, the key of the certificate at cert_url."""
    stamp = datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    crc = str(binascii.crc32(body) & 0xFFFFFFFF).encode()
    signed = private_key.sign(b"|".join([transmission_id.encode(), stamp.encode(), webhook_id, crc]),
                              padding.PKCS1v15(), hashes.SHA256())
    return {"PAYPAL-TRANSMISSION-ID": transmission_id, "PAYPAL-TRANSMISSION-TIME": stamp,
            "PAYPAL-TRANSMISSION-SIG": base64.b64encode(signed).decode(), "PAYPAL-CERT-URL": cert_url,
            "PAYPAL-AUTH-ALGO": PAYPAL_AUTH_ALGO}

