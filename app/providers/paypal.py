"""PayPal: its signing certificates (fetched, checked, cached) and its REST API, which decides the money.

PayPal's signature covers `transmission_id|time|webhook_id|CRC32(body)`
(app/signature.py), and CRC32 is linear: any body can be padded to the CRC32
of a captured delivery and sent under its headers. So the signature proves
only that PayPal sent *some* delivery; the event itself is fetched from
PayPal's Webhooks Management API ("Show event notification details",
`GET /v1/notifications/webhooks-events/{event_id}`,
https://developer.paypal.com/api/webhooks/v1/) with the merchant's REST
credentials (OAuth 2.0 client credentials, `POST /v1/oauth2/token`,
https://developer.paypal.com/api/rest/authentication/), and the money is
read from what PayPal returns, never from the body (fetch).

The certificates:

PayPal names the certificate of each delivery's signature in its
PAYPAL-CERT-URL header ("Self verification method",
https://developer.paypal.com/api/rest/webhooks/rest/), so the URL is the
sender's to choose. Here it is fetched only when it is https on a host of
PAYPAL_CERT_HOSTS, under PayPal's certificates path; anything else is refused
(401) with nothing fetched, so that no request makes the service fetch an
address an attacker chose. A fetched certificate is kept only once it chains
to a trusted root (PAYPAL_CA_FILE, else certifi's bundle), is within its
validity dates and is issued to PayPal: its subject's common name ends with
.paypal.com, as PayPal's Python SDK checks (paypalrestsdk,
WebhookEvent._is_common_name_valid), and its subject alternative names hold
that name, as the Web PKI requires. It is then cached per URL for the
process (PayPal signs with few certificates, so it is fetched once, not per
delivery), and its dates are checked again at every use.

A fetch that fails for a reason of the moment (a timeout, a refused
connection, a TLS failure, a 5xx) raises CertificateUnavailableError, a 503
with Retry-After: the signature may be good, and PayPal retries a delivery
that was not answered 2xx (25 times over 3 days, the page above).
"""

import base64
import re
import ssl
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlsplit

import certifi
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from ..events import InvalidJSONError, load
from ..signature import SignatureError
from .outbound import Deadline, Outbound, ProviderRefusedError, ProviderUnavailableError, Reply

# PayPal's certificates are served under this path (PAYPAL-CERT-URL, e.g.
# https://api.sandbox.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77 in PayPal's
# own samples): nothing else on an allowed host is ever fetched.
CERT_PATH = "/v1/notifications/certs/"
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
# The name calls are counted under (app/metrics.py).
PROVIDER = "paypal"


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
    takes a slot of the process's calls (app/providers/outbound.py).
    """

    def __init__(self, hosts: frozenset[str], outbound: Outbound, ca_file: Path | None = None) -> None:
        self.hosts = hosts  # host:port, lower case
        self.ca_file = ca_file
        self.outbound = outbound
        self.fetches = 0  # how many times a certificate was fetched (tests, and a reader of the cache)
        self._cache: dict[str, _Checked] = {}
        self._lock = threading.Lock()  # guards _cache, _fetching and _failed
        self._fetching: dict[str, threading.Lock] = {}  # a URL being fetched now -> its lock
        self._failed: dict[str, tuple[float, Exception]] = {}  # a URL whose fetch failed -> until when, and why
        self._trust: tuple[Store, ssl.SSLContext] | None = None  # loaded on first use

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
                or ".." in parts.path or "%" in parts.path):
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
            with self.outbound.slot(PROVIDER):
                reply = self.outbound.request(PROVIDER, "GET", url, self.outbound.deadline(),
                                              headers={"Accept": "*/*"}, context=self._trusted()[1],
                                              max_bytes=MAX_CERT_BYTES)
        except ProviderUnavailableError as exc:
            if "larger than" in str(exc):
                raise SignatureError(f"PAYPAL-CERT-URL's answer is larger than {MAX_CERT_BYTES} bytes") from None
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


class API:
    """PayPal's REST API for one source: its credentials, its OAuth 2.0 token (kept until it expires), its events.

    credentials are the REST app's `<client id>:<secret>`
    (WEBHOOK_<NAME>_API_KEY); never in a repr, a log line or an answer.
    """

    def __init__(self, base: str, credentials: str, outbound: Outbound) -> None:
        self.base = base
        self._basic = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.outbound = outbound
        self._token: tuple[str, float] | None = None  # the access token and when to stop using it
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"API({self.base!r})"

    def event(self, event_id: str) -> bytes | None:
        """The event's bytes as PayPal's API returns them, or None when PayPal has no such event (404).

        ProviderUnavailableError when PayPal cannot answer now, ProviderRefusedError when it refuses our
        credentials; both within the process's deadline and one slot.
        """
        deadline = self.outbound.deadline()
        with self.outbound.slot(PROVIDER):
            reply = self._get(f"/v1/notifications/webhooks-events/{quote(event_id, safe='')}", deadline)
            if reply.status == 401:  # a token PayPal revoked before its time: one more, once
                self._token = None
                reply = self._get(f"/v1/notifications/webhooks-events/{quote(event_id, safe='')}", deadline)
        if reply.status == 404:
            return None
        _raise_for(reply.status, "its event")
        return reply.body

    def _get(self, path: str, deadline: Deadline) -> Reply:
        return self.outbound.request(PROVIDER, "GET", self.base + path, deadline, headers={
            "Authorization": f"Bearer {self._access_token(deadline)}", "Accept": "application/json"})

    def _access_token(self, deadline: Deadline) -> str:
        with self._lock:
            if self._token is not None and self._token[1] > time.monotonic():
                return self._token[0]
        reply = self.outbound.request(PROVIDER, "POST", self.base + "/v1/oauth2/token", deadline, headers={
            "Authorization": self._basic, "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded"}, body=b"grant_type=client_credentials")
        _raise_for(reply.status, "an access token")
        try:
            answer = load(reply.body)
            token, lifetime = answer["access_token"], answer["expires_in"]
            if not isinstance(token, str) or not isinstance(lifetime, int):
                raise TypeError
        except (InvalidJSONError, KeyError, TypeError):
            raise ProviderUnavailableError("PayPal's token endpoint answered without a token") from None
        with self._lock:
            # A minute early: a token must not expire between this check and PayPal's.
            self._token = (token, time.monotonic() + max(lifetime - 60, 0))
        return token


def _raise_for(status: int, what: str) -> None:
    if status in (401, 403):
        raise ProviderRefusedError(f"PayPal refused our credentials for {what} (HTTP {status}): "
                                   f"check the source's API key")
    if status != 200:
        raise ProviderUnavailableError(f"PayPal answered {status} for {what}")

