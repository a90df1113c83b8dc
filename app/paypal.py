"""PayPal's signing certificates, for the paypal scheme (app/signature.py): fetched, checked, cached.

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

import http.client
import re
import ssl
import threading
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

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

from .config import Settings
from .signature import SignatureError

if TYPE_CHECKING:
    from flask import Flask

# PayPal's certificates are served under this path (PAYPAL-CERT-URL, e.g.
# https://api.sandbox.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77 in PayPal's
# own samples): nothing else on an allowed host is ever fetched.
CERT_PATH = "/v1/notifications/certs/"
# PayPal's limit for cert_url in verify-webhook-signature (https://developer.paypal.com/api/webhooks/v1/).
MAX_URL_CHARS = 500
# A certificate and its chain are a few kilobytes; nothing past this is read.
MAX_CERT_BYTES = 64 * 1024
# Short: a delivery waits for it (only on a URL's first use); well under gunicorn's timeout.
FETCH_TIMEOUT_SECONDS = 3.0
# Certificates kept per process; PayPal signs with a handful. Past it, the oldest is dropped.
MAX_CACHED = 32
# The name a certificate must be issued to (PayPal's SDK: the subject's common name ends with it).
PAYPAL_SUFFIX = ".paypal.com"
# Where init_app keeps this process's cache (app.extensions).
EXTENSION = "paypal_certificates"


class CertificateUnavailableError(Exception):
    """PayPal's certificate could not be fetched now (timeout, TLS, 5xx): 503, and PayPal retries."""


@dataclass(frozen=True)
class _Checked:
    key: RSAPublicKey
    not_before: float
    not_after: float


class Certificates:
    """The certificates of one process, by URL: the paypal scheme's `certificates` (signature.Certificates).

    Thread-safe: gunicorn's threads share it; one fetch runs at a time, so
    concurrent deliveries naming a new URL fetch it once.
    """

    def __init__(self, hosts: frozenset[str], ca_file: Path | None = None,
                 timeout: float = FETCH_TIMEOUT_SECONDS) -> None:
        self.hosts = hosts  # host:port, lower case
        self.ca_file = ca_file
        self.timeout = timeout
        self.fetches = 0  # how many times a certificate was fetched (tests, and a reader of the cache)
        self._cache: dict[str, _Checked] = {}
        self._lock = threading.Lock()  # guards _cache
        self._fetch_lock = threading.Lock()  # one fetch at a time
        self._trust: tuple[Store, ssl.SSLContext] | None = None  # loaded on first use

    def __call__(self, url: str, now: float) -> RSAPublicKey:
        target = self.allowed(url)  # before anything is fetched
        checked = self._cached(target)
        if checked is None:
            # A twin waiting here finds the certificate its twin fetched.
            if not self._fetch_lock.acquire(timeout=self.timeout):
                raise CertificateUnavailableError("PayPal's certificate is being fetched; retry later")
            try:
                checked = self._cached(target) or self._store(target, self._check(self._fetch(target), now))
            finally:
                self._fetch_lock.release()
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
        """The URL's body, over TLS verified against the same roots; no redirect is followed."""
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._trusted()[1]), _NoRedirect)
        self.fetches += 1
        try:
            with opener.open(urllib.request.Request(url, headers={"Accept": "*/*"}), timeout=self.timeout) as answer:
                body: bytes = answer.read(MAX_CERT_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code == 429:
                raise CertificateUnavailableError(f"PayPal's certificate host answered {exc.code}") from None
            raise SignatureError(f"PAYPAL-CERT-URL names no certificate (HTTP {exc.code})") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, TLS, timeouts, resets
            raise CertificateUnavailableError(f"PayPal's certificate could not be fetched: "
                                              f"{type(getattr(exc, 'reason', exc)).__name__}") from None
        if len(body) > MAX_CERT_BYTES:
            raise SignatureError(f"PAYPAL-CERT-URL's answer is larger than {MAX_CERT_BYTES} bytes")
        return body

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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other (refused): it would fetch a URL nobody checked."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def init_app(app: "Flask") -> None:
    """The process's certificates, empty until a delivery names one; the roots are read at the first fetch."""
    settings = Settings.of(app)
    app.extensions[EXTENSION] = Certificates(settings.paypal_cert_hosts, settings.paypal_ca_file)


def certificates(app: "Flask") -> Certificates:
    """The certificates init_app made for the app."""
    cache: Certificates = app.extensions[EXTENSION]
    return cache
