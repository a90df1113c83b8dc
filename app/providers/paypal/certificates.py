"""PayPal's certificates, fetched from the URL a delivery names only once it passes every check, and checked
against the Web PKI's roots before their key verifies anything."""

import logging
import re
import ssl
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
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

from ...core.errors import AnswerTooLargeError, BudgetSpentError, ProviderUnavailableError
from ...core.signing import SignatureError
from ..outbound import Budget, Outbound

log = logging.getLogger(__name__)

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
# The name its certificate host's calls are counted under: that host is sent no credentials of ours, so
# what it answers is never a refusal of them (the alert WebhookLedgerProviderRefusesCredentials).
CERTIFICATES = "paypal_certificates"


class CertificateUnavailableError(ProviderUnavailableError):
    """PayPal's certificate could not be fetched now (timeout, TLS, 5xx): 503, and PayPal retries."""


@dataclass(frozen=True)
class _Checked:
    key: RSAPublicKey
    not_before: float
    not_after: float


class Certificates:
    """The certificates of one process, by URL: the paypal scheme's `certificates` (core.signing.Certificates).
    Thread-safe, and a URL is fetched at most once per deadline, whatever unsigned senders name."""

    # Gunicorn's threads share it. A twin naming a URL being fetched waits for that fetch (up to the deadline), and a
    # URL whose fetch failed is answered by that failure until the deadline has passed again. Each fetch spends the
    # certificate host's budget, never a slot of PROVIDER_SLOTS; a URL refused for want of budget is not remembered
    # as failed.

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
