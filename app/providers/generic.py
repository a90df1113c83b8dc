"""The schemes of no one provider: hmac-sha256 (the default, with this service's own payment events), Standard
Webhooks and GitHub's (docs/providers/generic.md)."""

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError
from ..core.provider import Provider, envelope, long_enough
from ..core.signing import Certificates, SignatureError, check_timestamp, hex_digest, mac, match, required
from ..core.vocabulary import (
    LEDGERS_CURRENCY,
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    Headers,
    Kind,
    Rule,
    lower,
    text,
    uuid_text,
)

PAYMENT_SUCCEEDED = "payment.succeeded"
PAYMENT_REFUNDED = "payment.refunded"

_BASE64_DIGEST = re.compile(r"[A-Za-z0-9+/]{43}=")  # 32 bytes, standard alphabet
# webhook-id is signed material and becomes the event id (MAX_ID_CHARS at most).
_WEBHOOK_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_ID_CHARS}}}")


# -- hmac-sha256 and this service's own events --------------------------------------------------

def _verify_hmac_sha256(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int,
                        now: float, certificates: Certificates | None) -> int:
    return match(secrets, [body], [hex_digest(required(headers, "X-Signature").strip(), "X-Signature")])


def _sign_hmac_sha256(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Signature": mac(secrets[0], body).hex()}


def _currency_or_ledgers(data: dict[str, Any]) -> object:
    """This service's own shape may omit the currency: it is then the ledger's."""
    return lower(data["currency"]) if "currency" in data else LEDGERS_CURRENCY


def _read_payment(event: Event) -> Fields:
    data = event.data
    # Without a paymentId, each event is its own payment.
    payment_id = data["paymentId"] if "paymentId" in data else event.id
    return Fields(payment_id, uuid_text(data.get("userId")), data.get("amountCents"), _currency_or_ledgers(data), None)


def _read_payment_refunded(event: Event) -> Fields:
    data = event.data
    return Fields(data.get("paymentId"), None, data.get("amountRefundedCents"), _currency_or_ledgers(data), None)


RULES = {
    PAYMENT_SUCCEEDED: Rule(Kind.CREDIT, _read_payment, Fields(
        "data.paymentId", "data.userId", "data.amountCents", "data.currency", None)),
    PAYMENT_REFUNDED: Rule(Kind.REFUNDED_TOTAL, _read_payment_refunded, Fields(
        "data.paymentId", None, "data.amountRefundedCents", "data.currency", None)),
}

HMAC_SHA256 = Provider("hmac-sha256", "hmac-sha256", "X-Signature", _verify_hmac_sha256, _sign_hmac_sha256,
                       rules=RULES)


# -- Standard Webhooks (Svix and other senders of the specification) ----------------------------

def _verify_standard_webhooks(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int,
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


def _sign_standard_webhooks(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    if not msg_id:
        raise ValueError("standard-webhooks signs a webhook-id: pass msg_id")
    t = str(timestamp)
    signatures = " ".join(
        "v1," + base64.b64encode(mac(s, msg_id.encode(), b".", t.encode(), b".", body)).decode() for s in secrets
    )
    return {"webhook-id": msg_id, "webhook-timestamp": t, "webhook-signature": signatures}


def _parse_standard_webhooks(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """The common shape, its id the signed webhook-id header."""
    return envelope(document, body, headers, source,
                    text(headers.get("webhook-id"), "the webhook-id header", MAX_ID_CHARS))


# Standard Webhooks secrets are written whsec_<base64 of the key>.
WHSEC_PREFIX = "whsec_"


def _whsec_keys(name: str, secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The keys of a secrets setting's whsec_ entries, each long enough once decoded."""
    keys = tuple(_whsec_key(name, index, secret) for index, secret in enumerate(secrets))
    return long_enough(name, keys, f"bytes once decoded from {WHSEC_PREFIX}<base64>")


def _whsec_key(name: str, index: int, secret: bytes) -> bytes:
    """Decode a Standard Webhooks secret to its key; the message names it by index, never by value."""
    where = f"{name} entry {index} (counted from 0)"
    if not secret.startswith(WHSEC_PREFIX.encode()):
        raise ConfigError(f"{where} must be written {WHSEC_PREFIX}<base64> under standard-webhooks")
    encoded = secret[len(WHSEC_PREFIX):]
    try:
        # Padding is often left off; validate=True refuses anything outside the alphabet.
        key = base64.b64decode(encoded + b"=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise ConfigError(f"{where} is not valid base64 after {WHSEC_PREFIX}") from None
    if not key:
        raise ConfigError(f"{where} has an empty key after {WHSEC_PREFIX}")
    return key


STANDARD_WEBHOOKS = Provider("standard-webhooks", "Standard Webhooks", "webhook-signature",
                             _verify_standard_webhooks, _sign_standard_webhooks, parse=_parse_standard_webhooks,
                             keys=_whsec_keys)


# -- GitHub's -----------------------------------------------------------------------------------

def _verify_github(body: bytes, headers: Mapping[str, str], secrets: Sequence[bytes], tolerance: int, now: float,
                   certificates: Certificates | None) -> int:
    name = "X-Hub-Signature-256"
    algorithm, equals, digest = required(headers, name).strip().partition("=")
    if algorithm != "sha256" or not equals:
        raise SignatureError(f"malformed {name} header: expected sha256=<hex>")
    return match(secrets, [body], [hex_digest(digest, name)])


def _sign_github(body: bytes, secrets: list[bytes], timestamp: int, msg_id: str | None) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + mac(secrets[0], body).hex()}


def _parse_github(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """The common shape when the body names its type; else GitHub's own, its type and id in unsigned headers."""
    if "type" in document:
        return envelope(document, body, headers, source)
    event_type = text(headers.get("X-GitHub-Event"), "the X-GitHub-Event header", MAX_TYPE_CHARS)
    event_id = text(headers.get("X-GitHub-Delivery"), "the X-GitHub-Delivery header", MAX_ID_CHARS)
    return Event(event_id, event_type, document, document, body, source)


GITHUB = Provider("github", "GitHub", "X-Hub-Signature-256", _verify_github, _sign_github, parse=_parse_github,
                  type_header="X-GitHub-Event")
