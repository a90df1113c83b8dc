"""PayPal: its signature scheme, its events' shape and money rules, its certificates and its REST API.
Its signature covers only a CRC32 of the body, so each event is fetched from PayPal (docs/providers.md, "paypal")."""

import base64
import binascii
import logging
import re
import ssl
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import certifi
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from ..core.errors import AnswerTooLargeError, BudgetSpentError, ProviderUnavailableError
from ..core.provider import EventById, Provider, envelope, with_statuses
from ..core.signing import Certificates as CertificateSource
from ..core.signing import SignatureError, check_age, required
from ..core.vocabulary import (
    CURRENCY,
    CURRENCY_EXPONENTS,
    MAX_ID_CHARS,
    MAX_TYPE_CHARS,
    Event,
    Fields,
    Headers,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Rule,
    State,
    an_object,
    load,
    lower,
    minor_units,
    text,
    uuid_text,
)
from .outbound import MAX_ANSWER_BYTES, Budget, Deadline, Outbound, Reply, record

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from . import budget as shared

# PayPal's certificates are served under this path (PAYPAL-CERT-URL, e.g.
# https://api.sandbox.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77 in PayPal's
# own samples): nothing else on an allowed host is ever fetched.
CERT_PATH = "/v1/notifications/certs/"
# The name after it. PayPal documents no grammar; every URL its SDKs' samples and its live deliveries show
# is CERT- and three groups of eight hex digits (live: .../CERT-360caa42-fca2a594-df8cd2d5 in
# github.com/paypal/PayPal-Python-SDK/issues/130; sandbox: .../CERT-360caa42-fca2a594-a5cafa77 in the
# PHP SDK's sample ValidateWebhookEvent.php). Any other name is refused before anything is fetched.
CERT_NAME = re.compile(r"CERT-[0-9A-Fa-f]{8}-[0-9A-Fa-f]{8}-[0-9A-Fa-f]{8}")
# The certificate fetches of requests not yet verified, per certificate host and process, apart from
# PROVIDER_SLOTS (which only authentic work takes): one at a time, and six a minute. A process meets
# one or two of PayPal's certificates in a year (one per environment, a new one when it rotates), each
# fetched once and cached; an unsigned sender naming new URLs gets these and nothing more.
CERT_FETCHES_AT_ONCE = 1
CERT_FETCHES_PER_MINUTE = 6
# A spent budget is told in one WARNING line per process at most this often, with how many it refused.
CERT_BUDGET_LOG_SECONDS = 60.0
# PayPal's limit for cert_url in verify-webhook-signature (https://developer.paypal.com/api/webhooks/v1/).
MAX_URL_CHARS = 500
# A certificate and its chain are a few kilobytes; nothing past this is read.
MAX_CERT_BYTES = 64 * 1024
# Certificates kept per process; PayPal signs with a handful. Past it, the oldest is dropped.
MAX_CACHED = 32
# The name a certificate must be issued to (PayPal's SDK: the subject's common name ends with it).
PAYPAL_SUFFIX = ".paypal.com"
# PayPal's live REST API; a sandbox source sets WEBHOOK_<NAME>_API_BASE=https://api-m.sandbox.paypal.com.
API_BASE = "https://api-m.paypal.com"
SCHEME = "paypal"  # also the name its calls are counted under (app/receiver/metrics.py)
# The name its certificate host's calls are counted under: that host is sent no credentials of ours, so
# what it answers is never a refusal of them (the alert WebhookLedgerProviderRefusesCredentials).
CERTIFICATES = "paypal_certificates"
# The result a 401 to a token is counted as when one more token is asked for: no alert unless that one is refused.
STALE_TOKEN = "stale_token"
NAME = "PayPal"
SIGNATURE_HEADER = "PAYPAL-TRANSMISSION-SIG"
CAPTURE_COMPLETED = "PAYMENT.CAPTURE.COMPLETED"
REFUND_EVENTS = ("PAYMENT.CAPTURE.REFUNDED", "PAYMENT.CAPTURE.REVERSED")
DISPUTE_RESOLVED = "CUSTOMER.DISPUTE.RESOLVED"  # CUSTOMER.DISPUTE.CREATED and .UPDATED move nothing


# -- the scheme ---------------------------------------------------------------------------------

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
           certificates: CertificateSource | None) -> int:
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


# -- the shape ----------------------------------------------------------------------------------

def parse(document: dict[str, Any], body: bytes, source: str) -> Event:
    """The event in PayPal's own shape: id its `id` (WH-...), type its `event_type`, data its `resource`."""
    event_id = text(document.get("id"), "'id'", MAX_ID_CHARS)
    event_type = text(document.get("event_type"), "'event_type'", MAX_TYPE_CHARS)
    resource = document.get("resource")
    if not isinstance(resource, dict):
        raise InvalidEventError("'resource' must be an object")
    return Event(event_id, event_type, resource, document, body, source)


# -- the rules ----------------------------------------------------------------------------------

def _resource(event: Event) -> dict[str, Any]:
    # From the document, not event.data: a stored event's data is its whole body.
    return an_object(event.document.get("resource"))


def _money(money: object, label: str) -> tuple[object, object, str | None]:
    """A Money object's amount in minor units and its currency (lower case), or why the amount is not exact.

    A value that is not a string, or a currency that is no code, is left as
    sent: app/intake/events.py names it. A value that does not convert exactly is the 422.
    """
    value, code = an_object(money).get("value"), an_object(money).get("currency_code")
    units = minor_units(value, code)
    if units is None and isinstance(value, str) and isinstance(code, str) and CURRENCY.fullmatch(code.lower()):
        exponent = CURRENCY_EXPONENTS.get(code.upper(), 2)
        return value, code.lower(), (f"{label}.value must be a decimal amount of {code.upper()} exact in its minor "
                                     f"units ({exponent} decimals), got {value[:40]!r}")
    return (value if units is None else units), lower(code), None


def _read_capture(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.COMPLETED: the Capture, credited once by its id, to the user its custom_id names."""
    capture = _resource(event)
    amount, currency, problem = _money(capture.get("amount"), "resource.amount")
    return problem or Fields(capture.get("id"), uuid_text(capture.get("custom_id")), amount, currency, None)


# A PayPal Refund's status -> what it says of the refund (Payments v2, the refund's `status`).
REFUND_STATES = {"PENDING": State.APPLIED, "COMPLETED": State.APPLIED, "FAILED": State.REVERSED,
                        "CANCELLED": State.REVERSED}
# A Refund's capture: its `up` link, https://api.paypal.com/v2/payments/captures/<capture id>.
_CAPTURE_LINK = re.compile(r"https://[^/]+/v2/payments/captures/([^/?#]+)")


def _read_refund(event: Event) -> Fields | str:
    """PAYMENT.CAPTURE.REFUNDED and .REVERSED: a Refund of a capture, keyed by its own id, its amount debited."""
    refund = _resource(event)
    amount, currency, problem = _money(refund.get("amount"), "resource.amount")
    if problem:
        return problem
    links = refund.get("links")
    ups = [link.get("href") for link in links if isinstance(link, dict) and link.get("rel") == "up"] \
        if isinstance(links, list) else []
    capture = _CAPTURE_LINK.fullmatch(ups[0]) if len(ups) == 1 and isinstance(ups[0], str) else None
    status = refund.get("status")
    state = REFUND_STATES.get(status, status) if isinstance(status, str) else status
    return Fields(capture[1] if capture else None, None, amount, currency, None, refund.get("id"), state)


# A resolved Dispute's outcome -> what it does to the merchant's funds (Disputes v1, dispute_outcome.outcome_code):
# the buyer's win (the merchant accepting the claim among them) takes what the buyer was refunded; the seller's,
# the buyer's cancelling, a claim denied, or PayPal paying out itself, gives back what a loss took. NONE, no
# outcome, is refused: the ledger does not guess one.
DISPUTE_OUTCOMES = {"RESOLVED_BUYER_FAVOUR": State.APPLIED, "ACCEPTED": State.APPLIED,
                           "RESOLVED_SELLER_FAVOUR": State.REVERSED, "DENIED": State.REVERSED,
                           "CANCELED_BY_BUYER": State.REVERSED, "RESOLVED_WITH_PAYOUT": State.REVERSED}


def _read_dispute(event: Event) -> Fields | str:
    """CUSTOMER.DISPUTE.RESOLVED: the buyer's win takes dispute_outcome.amount_refunded (what the buyer got back,
    which may be part of dispute_amount) from its transaction's payment once; the seller's gives back what a loss
    took, the dispute named by its dispute_amount. Created and updated move nothing: the ledger follows the outcome."""
    dispute = _resource(event)
    outcome = an_object(dispute.get("dispute_outcome"))
    code = outcome.get("outcome_code")
    state = DISPUTE_OUTCOMES.get(code) if isinstance(code, str) else None
    if state is None:
        return f"resource.dispute_outcome.outcome_code must be one of {', '.join(DISPUTE_OUTCOMES)}"
    transactions = dispute.get("disputed_transactions")
    if not isinstance(transactions, list) or len(transactions) != 1:
        return "resource.disputed_transactions must name exactly one transaction"
    if state == State.APPLIED and outcome.get("amount_refunded") is None:
        return ("resource.dispute_outcome.amount_refunded is missing: a dispute resolved for the buyer takes what "
                "the buyer was refunded, and PayPal's record does not say")
    amount, currency, problem = _money(outcome.get("amount_refunded"), "resource.dispute_outcome.amount_refunded") \
        if state == State.APPLIED else _money(dispute.get("dispute_amount"), "resource.dispute_amount")
    return problem or Fields(an_object(transactions[0]).get("seller_transaction_id"), None, amount, currency, None,
                             dispute.get("dispute_id"), state)


RULES = {
    CAPTURE_COMPLETED: Rule(Kind.CREDIT, _read_capture, Fields(
        "resource.id", "resource.custom_id", "resource.amount.value", "resource.amount.currency_code", None)),
    **{refund: Rule(Kind.REFUND, _read_refund, Fields(
        "resource.links[rel=up] (the capture's URL)", None, "resource.amount.value", "resource.amount.currency_code",
        None, "resource.id", "resource.status")) for refund in REFUND_EVENTS},
    DISPUTE_RESOLVED: Rule(Kind.DISPUTE, _read_dispute, Fields(
        "resource.disputed_transactions[0].seller_transaction_id", None,
        "resource.dispute_outcome.amount_refunded.value (the buyer's win) or resource.dispute_amount.value",
        "resource.dispute_outcome.amount_refunded.currency_code (the buyer's win) or "
        "resource.dispute_amount.currency_code", None, "resource.dispute_id", "resource.dispute_outcome")),
}


# -- the certificates ---------------------------------------------------------------------------

class CertificateUnavailableError(ProviderUnavailableError):
    """PayPal's certificate could not be fetched now (timeout, TLS, 5xx): 503, and PayPal retries."""


@dataclass(frozen=True)
class _Checked:
    key: RSAPublicKey
    not_before: float
    not_after: float


class Certificates:
    """The certificates of one process, by URL: the paypal scheme's `certificates` (signature.Certificates).

    Thread-safe: gunicorn's threads share it. A URL is fetched at most once
    per deadline, whatever unsigned senders name: a twin naming it meanwhile
    waits for that fetch (up to the deadline), and a URL whose fetch failed is
    answered by that failure until the deadline has passed again. Each fetch
    spends the certificate host's budget, never a slot of PROVIDER_SLOTS; a
    URL refused for want of budget is not remembered as failed.
    """

    def __init__(self, hosts: frozenset[str], outbound: Outbound, ca_file: Path | None = None,
                 budget: Budget | None = None) -> None:
        self.hosts = hosts  # host:port, lower case
        self.ca_file = ca_file
        self.outbound = outbound
        self.budget = budget or Budget(CERT_FETCHES_AT_ONCE, CERT_FETCHES_PER_MINUTE)
        self.fetches = 0  # how many times a certificate was fetched (tests, and a reader of the cache)
        self._cache: dict[str, _Checked] = {}
        self._lock = threading.Lock()  # guards _cache, _fetching, _failed and the budget's report
        self._fetching: dict[str, threading.Lock] = {}  # a URL being fetched now -> its lock
        self._failed: dict[str, tuple[float, Exception]] = {}  # a URL whose fetch failed -> until when, and why
        self._trust: tuple[Store, ssl.SSLContext] | None = None  # loaded on first use
        self._over_budget = 0  # deliveries refused for want of budget since the last report
        self._reported_at = -CERT_BUDGET_LOG_SECONDS  # when the last report was logged (the budget's clock)

    def __call__(self, url: str, now: float) -> RSAPublicKey:
        target = self.allowed(url)  # before anything is fetched
        checked = self._cached(target) or self._fetched_once(target, now)
        if not checked.not_before <= now <= checked.not_after:
            raise SignatureError("PayPal's certificate is outside its validity dates")
        return checked.key

    def allowed(self, url: str) -> str:
        """The URL to fetch, rebuilt from its checked parts, or SignatureError: https, a listed host, PayPal's path."""
        if len(url) > MAX_URL_CHARS or not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
            raise SignatureError("PAYPAL-CERT-URL is not a URL of PayPal's certificates")
        parts = urlsplit(url)
        try:
            port = parts.port or 443
        except ValueError:
            port = -1
        host = (parts.hostname or "").lower()
        if (parts.scheme != "https" or parts.username is not None or parts.password is not None
                or parts.netloc.lower() not in (host, f"{host}:{port}") or f"{host}:{port}" not in self.hosts
                or parts.query or parts.fragment or not parts.path.startswith(CERT_PATH)
                or not CERT_NAME.fullmatch(parts.path.removeprefix(CERT_PATH))):
            raise SignatureError("PAYPAL-CERT-URL is not a URL of PayPal's certificates (PAYPAL_CERT_HOSTS)")
        return f"https://{host}:{port}{parts.path}"

    def _cached(self, url: str) -> _Checked | None:
        with self._lock:
            return self._cache.get(url)

    def _fetched_once(self, url: str, now: float) -> _Checked:
        """url's certificate fetched and checked by this thread, or by a twin that fetched it meanwhile."""
        with self._lock:
            failed = self._failed.get(url)
            if failed is not None and failed[0] > time.monotonic():
                raise failed[1]
            fetching = self._fetching.setdefault(url, threading.Lock())
        if not fetching.acquire(timeout=self.outbound.deadline_seconds):
            raise CertificateUnavailableError("PayPal's certificate is being fetched; retry later")
        try:
            checked = self._cached(url)
            if checked is not None:
                return checked
            with self._lock:  # a twin's fetch failed while this one waited
                failed = self._failed.get(url)
                if failed is not None and failed[0] > time.monotonic():
                    raise failed[1]
            with self._spending(urlsplit(url).netloc):  # its refusal is not the URL's failure: not remembered
                try:
                    return self._store(url, self._check(self._fetch(url), now))
                except (SignatureError, CertificateUnavailableError) as exc:
                    with self._lock:
                        while len(self._failed) >= MAX_CACHED:
                            del self._failed[next(iter(self._failed))]
                        self._failed[url] = (time.monotonic() + self.outbound.deadline_seconds, exc)
                    raise
        finally:
            fetching.release()
            with self._lock:
                if self._fetching.get(url) is fetching and not fetching.locked():
                    del self._fetching[url]

    @contextmanager
    def _spending(self, host: str) -> Iterator[None]:
        """Spend host's budget for one fetch; refused, count it (no_budget) and log it once per interval."""
        try:
            with self.budget.spend(host):
                yield
        except BudgetSpentError as exc:
            self.outbound.observe(CERTIFICATES, "no_budget", 0.0)
            with self._lock:
                self._over_budget += 1
                now, refused = self.budget.clock(), 0
                if now - self._reported_at >= CERT_BUDGET_LOG_SECONDS:
                    refused, self._over_budget, self._reported_at = self._over_budget, 0, now
            if refused:
                log.warning("PayPal certificate fetches for deliveries not yet verified are over budget (%s): "
                            "%d deliveries answered 503 since the last report", exc, refused)
            raise

    def _store(self, url: str, checked: _Checked) -> _Checked:
        with self._lock:
            while len(self._cache) >= MAX_CACHED:
                del self._cache[next(iter(self._cache))]
            self._cache[url] = checked
        return checked

    def _trusted(self) -> tuple[Store, ssl.SSLContext]:
        if self._trust is None:
            bundle = str(self.ca_file or certifi.where())
            with open(bundle, "rb") as roots:
                store = Store(_roots(roots.read()))
            self._trust = store, ssl.create_default_context(cafile=bundle)
        return self._trust

    def _fetch(self, url: str) -> bytes:
        """The URL's body, over TLS verified against the same roots, within the deadline; no redirect is followed."""
        self.fetches += 1
        try:
            reply = self.outbound.request(CERTIFICATES, "GET", url, self.outbound.deadline(),
                                          headers={"Accept": "*/*"}, context=self._trusted()[1],
                                          max_bytes=MAX_CERT_BYTES)
        except AnswerTooLargeError:
            raise SignatureError(f"PAYPAL-CERT-URL's answer is larger than {MAX_CERT_BYTES} bytes") from None
        except ProviderUnavailableError as exc:
            raise CertificateUnavailableError(f"PayPal's certificate could not be fetched: {exc}") from None
        if reply.status >= 500 or reply.status == 429:
            raise CertificateUnavailableError(f"PayPal's certificate host answered {reply.status}")
        if reply.status != 200:
            raise SignatureError(f"PAYPAL-CERT-URL names no certificate (HTTP {reply.status})")
        return reply.body

    def _check(self, pem: bytes, now: float) -> _Checked:
        """The leaf (first) certificate's key, once it and the chain after it pass every check, or SignatureError."""
        try:
            leaf, *intermediates = x509.load_pem_x509_certificates(pem)
        except ValueError:
            raise SignatureError("PAYPAL-CERT-URL's answer is not a PEM certificate") from None
        not_before, not_after = leaf.not_valid_before_utc.timestamp(), leaf.not_valid_after_utc.timestamp()
        if not not_before <= now <= not_after:
            raise SignatureError("PayPal's certificate is outside its validity dates")
        names = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        name = str(names[0].value).lower() if names else ""
        if not name.endswith(PAYPAL_SUFFIX):
            raise SignatureError("the certificate is not issued to PayPal")
        _check_alt_names(leaf, name)
        key = leaf.public_key()
        if not isinstance(key, RSAPublicKey):
            raise SignatureError("PayPal's certificate does not hold an RSA key")
        verifier = (PolicyBuilder().store(self._trusted()[0]).time(datetime.fromtimestamp(now, UTC))
                    .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_LEAF_POLICY)
                    .build_server_verifier(x509.DNSName(name)))
        try:
            verifier.verify(leaf, intermediates)
        except (VerificationError, ValueError):
            raise SignatureError("PayPal's certificate does not chain to a trusted root for its name") from None
        return _Checked(key, not_before, not_after)


def _check_alt_names(leaf: x509.Certificate, name: str) -> None:
    """SignatureError unless the leaf's subject alternative names hold name: the Web PKI reads a name there only."""
    try:
        alt_names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise SignatureError("PayPal's certificate has no subject alternative name (SAN): its name must be one"
                             ) from None
    except (x509.DuplicateExtension, ValueError):
        raise SignatureError("PayPal's certificate's extensions cannot be read") from None
    if name not in (alt_name.lower() for alt_name in alt_names.get_values_for_type(x509.DNSName)):
        raise SignatureError("PayPal's certificate's subject alternative names do not hold its name")


def _roots(pem: bytes) -> list[x509.Certificate]:
    """Each certificate of a bundle that parses: one that a later cryptography refuses (certifi's holds one with
    a serial number RFC 5280 forbids) is left out, not allowed to refuse them all."""
    roots = []
    for block in _PEM_BLOCK.findall(pem):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            try:
                roots.append(x509.load_pem_x509_certificate(block))
            except ValueError:
                continue
    return roots


_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


# The Web PKI's checks of a leaf (its names, key usage, basic constraints), less the one
# that it be a TLS server's (extended key usage): the certificate signs messages here.
_LEAF_POLICY = ExtensionPolicy.webpki_defaults_ee().may_be_present(x509.ExtendedKeyUsage, Criticality.AGNOSTIC, None)


# -- the API ------------------------------------------------------------------------------------

class API:
    """PayPal's REST API for one source: its credentials, its OAuth 2.0 token (kept until it expires), its events.

    credentials are the REST app's `<client id>:<secret>`
    (WEBHOOK_<NAME>_API_KEY); never in a repr, a log line or an answer.
    """

    name = NAME

    def __init__(self, base: str, credentials: str, outbound: Outbound, budget: "shared.Budget | None" = None) -> None:
        self.base = base
        self._basic = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.outbound = outbound
        self.budget = budget  # the account's shared budget (app/providers/budget.py); None: unmetered
        self._token: tuple[str, float] | None = None  # the access token and when to stop using it
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event: Event) -> bytes | None:
        """The event's bytes as PayPal's API returns them, or None when PayPal has no such event (404).

        ProviderUnavailableError when PayPal cannot answer now, ProviderRefusedError when it refuses our
        credentials; both within the process's deadline and one slot.
        """
        return self.get(f"/v1/notifications/webhooks-events/{quote(event.id, safe='')}", "its event",
                        endpoint="webhooks-events")

    def get(self, path: str, what: str, endpoint: str, max_bytes: int = MAX_ANSWER_BYTES) -> bytes | None:
        """The body PayPal's API answers GET path with (a query included), or None for a 404; what names it in
        an error, endpoint in the account's budget. Raises as event does, within the deadline and one slot."""
        deadline = self.outbound.deadline()
        with self.outbound.slot(SCHEME):
            # A token PayPal revoked before its time: one more, once. Only the second 401 refuses our credentials.
            reply = self._get(path, deadline, max_bytes, endpoint, unauthorized_as=STALE_TOKEN)
            if reply.status == 401:
                self._token = None
                reply = self._get(path, deadline, max_bytes, endpoint)
        return record(reply, NAME, what)

    def _get(self, path: str, deadline: Deadline, max_bytes: int, endpoint: str,
             unauthorized_as: str | None = None) -> Reply:
        return self.outbound.request(SCHEME, "GET", self.base + path, deadline, headers={
            "Authorization": f"Bearer {self._access_token(deadline)}", "Accept": "application/json"},
            max_bytes=max_bytes, unauthorized_as=unauthorized_as,
            spend=None if self.budget is None else self.budget.on(endpoint))

    def _access_token(self, deadline: Deadline) -> str:
        with self._lock:
            if self._token is not None and self._token[1] > time.monotonic():
                return self._token[0]
        reply = self.outbound.request(SCHEME, "POST", self.base + "/v1/oauth2/token", deadline, headers={
            "Authorization": self._basic, "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded"}, body=b"grant_type=client_credentials",
            spend=None if self.budget is None else self.budget.on("oauth2-token"))
        try:
            answer = load(record(reply, NAME, "an access token") or b"")
            token, lifetime = answer["access_token"], answer["expires_in"]
            if not isinstance(token, str) or not isinstance(lifetime, int):
                raise TypeError
        except (InvalidJSONError, KeyError, TypeError):
            raise ProviderUnavailableError("PayPal's token endpoint answered without a token") from None
        with self._lock:
            # A minute early: a token must not expire between this check and PayPal's.
            self._token = (token, time.monotonic() + max(lifetime - 60, 0))
        return token




# -- the provider -------------------------------------------------------------------------------

def _parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """PayPal's own shape, or the common one when the body names its type."""
    return envelope(document, body, headers, source) if "type" in document else parse(document, body, source)


def _api(base: str, key: str, outbound: Outbound, budget: "shared.Budget | None",
         every_event: bool) -> EventById | None:
    return EventById(API(base, key, outbound, budget), _parse) if every_event else None


# PayPal's webhook id (https://developer.paypal.com/api/webhooks/v1/, verify-webhook-signature's webhook_id:
# letters and digits, at most 50), and WEBHOOK_ID, the id its simulator's mock events are signed for
# (https://developer.paypal.com/api/rest/webhooks/rest/).
WEBHOOK_ID_FORM = re.compile(rb"[A-Za-z0-9]{1,50}|WEBHOOK_ID")


def _webhook_ids(name: str, secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """A source's secrets are its webhook ids, not keys (PayPal's RSA key signs): no length to reach."""
    from ..core.errors import ConfigError

    for index, webhook_id in enumerate(secrets):
        if not WEBHOOK_ID_FORM.fullmatch(webhook_id):
            raise ConfigError(f"{name} entry {index} (counted from 0) is not a PayPal webhook id (1 to 50 letters "
                              f"and digits, or WEBHOOK_ID) under the paypal scheme")
    return secrets


PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, None, parse=_parse,
                    rules=with_statuses(RULES, REFUND_STATES), sign_with_key=sign, api=_api, api_base=API_BASE,
                    keys=_webhook_ids,
                    must_fetch="its signature covers only a CRC32 of the body, so each event is fetched from "
                               "PayPal's API",
                    api_key_words="PayPal's REST app credentials", api_key_written="<client id>:<secret>",
                    api_key_pattern="[^:]*:.*")
