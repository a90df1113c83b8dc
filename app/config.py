"""Typed configuration: environment variables parsed once, failing fast."""

import os

SCHEMES = ("hmac-sha256",)


class ConfigError(RuntimeError):
    """A setting is missing or invalid; the message names it."""


# name -> (parser, default). A default of None means the setting is required.
# The timeouts nest so that the inner one fails first with a clean answer:
# lock wait < statement < pool acquire < Redis lock TTL <= gunicorn timeout.
def _int(minimum):
    def parse(name, raw):
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name} must be >= {minimum}, got {value}")
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
    # Told to a 409/503 sender: the twin's transaction or an outage is short.
    "RETRY_AFTER_SECONDS": (_int(1), "1"),
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
    return config


def parse(mapping):
    """Validate a test's config dict the same way as the environment."""
    return from_env({name: str(value) for name, value in mapping.items()})


def check_nesting(config):
    """Return warnings for timeouts that do not nest (inner must fail first)."""
    chain = ["PG_LOCK_TIMEOUT_MS", "PG_STATEMENT_TIMEOUT_MS", "PG_POOL_TIMEOUT_MS", "LOCK_TTL_MS"]
    return [
        f"{inner} ({config[inner]}) should be below {outer} ({config[outer]})"
        for inner, outer in zip(chain, chain[1:])
        if config[inner] >= config[outer]
    ]
