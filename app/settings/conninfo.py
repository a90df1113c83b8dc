"""DATABASE_URL: checked at start by libpq itself, and kept out of every log line
(docs/design.md, "DATABASE_URL, checked at start")."""

import ipaddress
import logging
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

from psycopg import ProgrammingError, pq
from psycopg.conninfo import make_conninfo, timeout_from_conninfo

# libpq's own parameter names: the only quoted words of its messages that
# ours repeat (anything else quoted is a value, maybe a password).
KEYWORDS = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
QUOTED = re.compile(r'"([^"]*)"')
# Where libpq's connection goes instead of the server's: replaced, so that
# neither the given hosts nor PGHOST and PGHOSTADDR are reached.
TARGET = ("host", "hostaddr", "port")
# libpq's words before its reason, on a connection to our loopback port (its
# address and port are ours, not the setting's).
LOOPBACK_PREFIX = re.compile(r'^connection to server at "[^"]*"(?: \([^)]*\))?, port \d+ failed: ')


class BadValueError(ValueError):
    """A conninfo value libpq would refuse; the message names the parameter, never its value."""


def check(params: Mapping[str, Any]) -> None:
    """Refuse the values of params (conninfo_to_dict's) that libpq would refuse when connecting."""
    if any("@" in entry and not entry.startswith(("/", "@")) for entry in _entries(params, "host")):
        raise BadValueError("has a host name holding @ (a password holding @, / or ? must write it %40, %2F or %3F)")
    if not all(_is_address(entry) for entry in _entries(params, "hostaddr") if entry):
        raise BadValueError("has a hostaddr that is not an IP address")
    try:
        timeout_from_conninfo(dict(params))
    except ProgrammingError:
        raise BadValueError("has a connect_timeout that is not a number") from None
    _refused_by_libpq_on_a_socket(params)
    _refused_by_libpq_on_loopback(params)


def _refused_by_libpq_on_a_socket(params: Mapping[str, Any]) -> None:
    """Connect to a socket that does not exist, once for each host: libpq refuses a bad value, or finds no socket."""
    nowhere = os.path.join(tempfile.gettempdir(), f"webhook-ledger-no-server-{uuid.uuid4().hex}")
    hosts = len(_entries(params, "host") or _entries(params, "hostaddr") or [""])
    # gssencmode=require is refused over a local socket: the loopback connection checks it.
    given = {key: value for key, value in params.items() if key not in ("host", "hostaddr", "gssencmode")}
    reason = _refusal(make_conninfo(**given, host=",".join([nowhere] * hosts), hostaddr="", gssencmode="disable"))
    if reason is not None and nowhere not in reason:
        raise BadValueError(f"has a value that libpq refuses: {_without_values(reason)}")


def _refused_by_libpq_on_loopback(params: Mapping[str, Any]) -> None:
    """Connect to a loopback port that listens and never answers: libpq refuses a bad value, or waits."""
    given = {key: value for key, value in params.items() if key not in TARGET}
    if given.get("gssencmode") == "require":
        given["gssencmode"] = "prefer"
    with socket.create_server(("127.0.0.1", 0), backlog=1) as listener:
        port = listener.getsockname()[1]
        reason = _refusal(make_conninfo(**given, host="127.0.0.1", hostaddr="127.0.0.1", port=port))
    if reason is not None:
        raise BadValueError(f"has a value that libpq refuses: {_without_values(LOOPBACK_PREFIX.sub('', reason))}")


def _refusal(conninfo: str) -> str | None:
    """libpq's message if it gave up on conninfo at once, else None (the connection is closed)."""
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        if pgconn.status != pq.ConnStatus.BAD:
            return None
        return pgconn.get_error_message()
    finally:
        pgconn.finish()


def _without_values(message: str) -> str:
    """libpq's message on one line, its quoted values replaced by "..." (its parameter names kept)."""
    kept = QUOTED.sub(lambda quoted: quoted[0] if quoted[1] in KEYWORDS else '"..."', message)
    return " ".join(kept.split())


def _entries(params: Mapping[str, Any], keyword: str) -> list[str]:
    return str(params[keyword]).split(",") if params.get(keyword) else []


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
    """Rewrites psycopg's and psycopg_pool's records to one line without the conninfo's values."""
    # Filtered rather than silenced: "Connection refused" or "password authentication failed" is what an operator
    # needs while the pool reconnects, and only the quoted values (and a connection's description, which lists host,
    # port, user and database) are at risk.

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
