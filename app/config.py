"""Typed configuration: environment variables parsed once, failing fast."""

import base64
import binascii
import os
from pathlib import Path

from .signature import SCHEMES

# Standard Webhooks secrets are written whsec_<base64 of the key>.
WHSEC_PREFIX = "whsec_"


# schema.sql lives at the top of the repository (and of the Docker image),
# beside the package, not inside it; SCHEMA_PATH overrides for other layouts,
# a relative one taken from there too.
TOP = Path(__file__).resolve().parent.parent
DEFAULT_SCHEMA_PATH = TOP / "schema.sql"


class ConfigError(RuntimeError):
    """A setting is missing or invalid; the message names it."""


# name -> (parser, default). A default of None means the setting is required.
# The timeouts nest so that the inner one fails first with a clean answer:
# lock wait < statement < pool acquire < Redis lock TTL <= gunicorn timeout.
def _int(minimum, why=""):
    def parse(name, raw):
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}{why}")
        return value

    return parse


def _secrets(name, raw):
    # Read as a string, never JSON-parsed: a digits-only secret stays a secret.
    secrets = [s.strip() for s in raw.split(",") if s.strip()]
    if not secrets:
        raise ConfigError(f"{name} is empty; set at least one signing secret")
    return tuple(s.encode("utf-8") for s in secrets)


def _scheme(name, raw):
    if raw not in SCHEMES:
        raise ConfigError(f"{name} must be one of {', '.join(SCHEMES)}, got {raw!r}")
    return raw


def _text(name, raw):
    if not raw.strip():
        raise ConfigError(f"{name} is empty")
    return raw.strip()


SETTINGS = {
    "DATABASE_URL": (_text, None),
    "REDIS_URL": (_text, None),
    "WEBHOOK_SECRET": (_secrets, None),
    "WEBHOOK_SIGNATURE_SCHEME": (_scheme, "hmac-sha256"),
    # Stripe's and Standard Webhooks' own default: a signed timestamp older
    # (or further ahead) than this is a replay (or a forged clock).
    # stripe-python reads 0 as "do not check"; here the window is never off.
    "WEBHOOK_TOLERANCE_SECONDS": (_int(1, ": the replay window cannot be switched off"), "300"),
    # Long enough to cover a delivery's whole transaction (see the nesting above).
    "LOCK_TTL_MS": (_int(1), "10000"),
    "MAX_BODY_BYTES": (_int(1), "1048576"),
    # A row lock held by a twin delivery is given up first: 503, retry later.
    "PG_LOCK_TIMEOUT_MS": (_int(1), "1000"),
    "PG_STATEMENT_TIMEOUT_MS": (_int(1), "2000"),
    # Waiting for a pooled connection (or a dead server) ends in 503 after this.
    "PG_POOL_TIMEOUT_MS": (_int(1), "3000"),
    # One connection per gunicorn thread: a request never waits for another's.
    "PG_POOL_SIZE": (_int(1), "4"),
    # Well under a second, so a dead Redis degrades the service, not stalls it.
    "REDIS_TIMEOUT_MS": (_int(1), "250"),
    # How long Redis remembers a committed event, so that its re-deliveries
    # skip PostgreSQL; older ones are answered by PostgreSQL, as after a flush.
    "REDIS_DONE_TTL_SECONDS": (_int(1), "86400"),
    # Told to a 409/503 sender: the twin's transaction or an outage is short.
    "RETRY_AFTER_SECONDS": (_int(1), "1"),
    # Where `flask init-db` reads the schema.
    "SCHEMA_PATH": (lambda name, raw: TOP / _text(name, raw), "schema.sql"),
}


def from_env(environ=None):
    """Return the settings parsed from environ (default os.environ)."""
    environ = os.environ if environ is None else environ
    config = {}
    for name, (parse, default) in SETTINGS.items():
        raw = environ.get(name, default)
        if raw is None:
            raise ConfigError(f"{name} is required but not set")
        config[name] = parse(name, raw)
    if config["WEBHOOK_SIGNATURE_SCHEME"] == "standard-webhooks":
        config["WEBHOOK_SECRET"] = tuple(_whsec_key(i, s) for i, s in enumerate(config["WEBHOOK_SECRET"]))
    return config


def _whsec_key(index, secret):
    """Decode a Standard Webhooks secret to its key; the message names it by index, never by value."""
    where = f"WEBHOOK_SECRET entry {index} (counted from 0)"
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


def parse(mapping):
    """Validate a test's config dict the same way as the environment."""
    return from_env({name: str(value) for name, value in mapping.items()})


def check_nesting(config):
    """Return warnings for timeouts that do not nest (inner must fail first)."""
    chain = ["PG_LOCK_TIMEOUT_MS", "PG_STATEMENT_TIMEOUT_MS", "PG_POOL_TIMEOUT_MS", "LOCK_TTL_MS"]
    return [
        f"{inner} ({config[inner]}) should be below {outer} ({config[outer]})"
        for inner, outer in zip(chain, chain[1:], strict=False)
        if config[inner] >= config[outer]
    ]
