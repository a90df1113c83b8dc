"""DATABASE_URL: its values checked at start as libpq would check them, and kept out of every log line.

libpq's parser accepts what its connection attempt later refuses (an
unescaped `@` in a password makes the rest of it a host name, `sslmode=bogus`,
`keepalives=x`): the service would answer 503 for ever and psycopg_pool would
log the bad value on every attempt. Here such a URL stops the service at
start, and no message names any of its values.
"""

import ipaddress
import logging
import re
from collections.abc import Mapping
from typing import Any

# libpq's enumerated parameters and the values it accepts (PostgreSQL 18's
# libpq; older ones accept a subset, and refuse the keyword itself if new).
CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
    "ssl_min_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "ssl_max_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "min_protocol_version": ("3.0", "3.2", "latest"),
    "max_protocol_version": ("3.0", "3.2", "latest"),
}
# Parameters that libpq reads as integers, only when it connects.
INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
            "tcp_user_timeout")
AUTH_METHODS = ("password", "md5", "gss", "sspi", "scram-sha-256", "oauth", "none")
# A DNS name (Docker's service names may hold _).
HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")


class BadValueError(ValueError):
    """A conninfo value libpq would refuse; the message names the parameter, never its value."""


def check(params: Mapping[str, Any]) -> None:
    """Refuse the values of params (conninfo_to_dict's) that libpq would refuse when connecting."""
    for entry in _entries(params, "host"):
        if entry and not entry.startswith(("/", "@")) and not _is_address(entry) and not HOST_NAME.fullmatch(entry):
            raise BadValueError("has a host that is not a host name, an address or a socket path "
                           "(a password holding @, / or ? must write it %40, %2F or %3F)")
    if not all(_is_address(entry) for entry in _entries(params, "hostaddr") if entry):
        raise BadValueError("has a hostaddr that is not an IP address")
    if not all(entry.isdigit() and 1 <= int(entry) <= 65535 for entry in _entries(params, "port") if entry):
        raise BadValueError("has a port that is not a number from 1 to 65535")
    for keyword, choices in CHOICES.items():
        if keyword in params and params[keyword] not in choices:
            raise BadValueError(f"has an invalid {keyword}: libpq accepts {', '.join(choices)}")
    for keyword in INTEGERS:
        if keyword in params and not re.fullmatch(r"\s*-?\d+\s*", str(params[keyword])):
            raise BadValueError(f"has a {keyword} that is not an integer")
    if not all(method.removeprefix("!") in AUTH_METHODS for method in _entries(params, "require_auth")):
        raise BadValueError(f"has an invalid require_auth: libpq accepts {', '.join(AUTH_METHODS)}, each maybe after !")


def _entries(params: Mapping[str, Any], keyword: str) -> list[str]:
    return str(params[keyword]).split(",") if keyword in params else []


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# -- psycopg's own log lines ----------------------------------------------------

# Quoted text in psycopg's and libpq's messages is a value of the conninfo
# (host, user, database) or of a row, and so is the description in the repr
# of a connection or a pipeline, "(host=... user=... database=...)": kept
# out, the reason around them kept.
VALUES = re.compile(r"\"[^\"]*\"|'[^']*'|\((?:\w+=\S*\s?)+\)")
LOGGERS = ("psycopg", "psycopg.pool", "psycopg_pool.sched")  # each logger: a filter is not inherited


class Redact(logging.Filter):
    """Rewrites psycopg's and psycopg_pool's records to one line without the conninfo's values.

    Filtered rather than silenced: "Connection refused" or "password
    authentication failed" is what an operator needs while the pool
    reconnects, and only the quoted values (and a connection's description,
    which lists host, port, user and database) are at risk.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else (record.args,) if record.args else ()
        args = tuple(_safe(arg) for arg in args)
        try:
            message = record.msg % args if args else str(record.msg)
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg, record.args = redacted(message), None
        record.exc_info = record.exc_text = None  # no traceback: its text repeats the message
        return True


def redacted(message: str) -> str:
    """message on one line, without its quoted values."""
    return " ".join(VALUES.sub("...", message).split())


def _safe(arg: object) -> object:
    return f"{type(arg).__name__}: {arg}" if isinstance(arg, BaseException) else arg


REDACT = Redact()


def keep_out_of_logs() -> None:
    """Install the filter on psycopg's loggers (once per process: addFilter skips a filter already there)."""
    for name in LOGGERS:
        logging.getLogger(name).addFilter(REDACT)
