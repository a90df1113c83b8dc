"""PayPal: its signature scheme, its events' shape and money rules, its certificates and its REST API.
Its signature covers only a CRC32 of the body, so each event is fetched from PayPal (docs/providers/paypal.md)."""

import re
from typing import TYPE_CHECKING, Any

from ...core.errors import ConfigError
from ...core.provider import EventById, Provider, envelope, with_statuses
from ...core.vocabulary import Event, Headers
from ..outbound import Outbound
from .api import API, API_BASE
from .certificates import CERT_FETCHES_PER_MINUTE, Certificates, CertificateUnavailableError
from .rules import DISPUTE_RESOLVED, REFUND_EVENTS, REFUND_STATES, RULES, parse
from .scheme import NAME, SCHEME, SIGNATURE_HEADER, sign, verify

if TYPE_CHECKING:
    from ..budget import Budget
    from .audit import PayPalTransactions

__all__ = ["API", "API_BASE", "CERT_FETCHES_PER_MINUTE", "DISPUTE_RESOLVED", "NAME", "PROVIDER", "REFUND_EVENTS",
           "RULES", "SCHEME", "CertificateUnavailableError", "Certificates", "parse", "sign", "verify"]


def _parse(document: dict[str, Any], body: bytes, headers: Headers, source: str) -> Event:
    """PayPal's own shape, or the common one when the body names its type."""
    return envelope(document, body, headers, source) if "type" in document else parse(document, body, source)


def _api(base: str, key: str, outbound: Outbound, budget: "Budget | None", every_event: bool) -> EventById | None:
    return EventById(API(base, key, outbound, budget), _parse) if every_event else None


def _certificates(settings: Any, outbound: Outbound) -> Certificates:
    """The process's certificates, from the hosts and roots the settings name (PAYPAL_CERT_HOSTS, PAYPAL_CA_FILE)."""
    return Certificates(settings.paypal_cert_hosts, outbound, settings.paypal_ca_file)


# PayPal's webhook id (https://developer.paypal.com/api/webhooks/v1/, verify-webhook-signature's webhook_id:
# letters and digits, at most 50), and WEBHOOK_ID, the id its simulator's mock events are signed for
# (https://developer.paypal.com/api/rest/webhooks/rest/).
WEBHOOK_ID_FORM = re.compile(rb"[A-Za-z0-9]{1,50}|WEBHOOK_ID")


def _webhook_ids(name: str, secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """A source's secrets are its webhook ids, not keys (PayPal's RSA key signs): no length to reach."""
    for index, webhook_id in enumerate(secrets):
        if not WEBHOOK_ID_FORM.fullmatch(webhook_id):
            raise ConfigError(f"{name} entry {index} (counted from 0) is not a PayPal webhook id (1 to 50 letters "
                              f"and digits, or WEBHOOK_ID) under the paypal scheme")
    return secrets


def _money_records(api_key: str, base: str, key_setting: str, account: str | None, metadata_key: str,
                   budget: "Budget | None") -> "PayPalTransactions":
    from .audit import PayPalTransactions
    return PayPalTransactions(api_key, base, key_setting, budget)


PROVIDER = Provider(SCHEME, NAME, SIGNATURE_HEADER, verify, None, parse=_parse,
                    rules=with_statuses(RULES, REFUND_STATES), sign_with_key=sign, api=_api, api_base=API_BASE,
                    certificates=_certificates,
                    money_records=_money_records, money_key="PayPal's REST app's <client id>:<secret>",
                    keys=_webhook_ids,
                    must_fetch="its signature covers only a CRC32 of the body, so each event is fetched from "
                               "PayPal's API",
                    api_key_words="PayPal's REST app credentials", api_key_written="<client id>:<secret>",
                    api_key_pattern="[^:]*:.*")
