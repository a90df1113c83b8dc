"""What every group of `flask` commands shares: the settings each command needs, one-line failures, tables.
cli.py's and users.py's commands are built from it."""

import functools
import getpass
import logging
import logging.handlers
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from flask import current_app
from flask.cli import AppGroup

from ..core.errors import ConfigError
from ..core.provider import Provider
from ..core.vocabulary import minor_unit_name
from ..intake.events import Effect, Policy, StoredBodyError, Users, effect_of, stored_event
from ..providers import PROVIDERS
from ..serving.logformat import json_formatter
from ..settings.config import PROBLEMS, Needs, Settings
from ..settings.sources import Source
from ..store.db import unavailable_in_one_line
from ..store.schema import recorded_currency

F = TypeVar("F", bound=Callable[..., Any])

# Where a command's audit lines go: the system log's socket (journald's on a systemd host, beside the service's own
# lines), not the command's output, which is for the person who ran it. Without one (a container), stderr.
SYSTEM_LOG = "/dev/log"
AUDIT = "app.audit"  # their logger's name

# What each level of the settings is, in a refusal's words.
NEEDS_WORDS = {Needs.DATABASE: "DATABASE_URL", Needs.REDIS: "DATABASE_URL and REDIS_URL",
               Needs.SERVICE: "the service's settings"}


def needs(level: Needs) -> Callable[[F], F]:
    """Declare what a command reads of the settings: one that is missing or bad stops it in one line, before it runs."""
    # `flask` builds the app from as much of the settings as there is, from DATABASE_URL alone up (create_app).
    def declare(command: F) -> F:
        @functools.wraps(command)
        def checked(*args: Any, **kwargs: Any) -> Any:
            with config_error_in_one_line():
                if Settings.of(current_app).read < level:
                    problem = current_app.extensions[PROBLEMS][level]
                    raise ConfigError(f"{problem.message} ({name_of(click.get_current_context())} reads "
                                      f"{NEEDS_WORDS[level]})")
                return command(*args, **kwargs)
        return checked  # type: ignore[return-value]
    return declare


class ConfigExit(click.ClickException):
    """A ConfigError as a `flask` command ends on it: `Error: configuration error: ...`, and exit status EX_CONFIG."""

    exit_code = ConfigError.exit_code


@contextmanager
def config_error_in_one_line() -> Iterator[None]:
    """Under a `flask` command, a ConfigError raised inside ends the command in one line, not a traceback."""
    try:
        yield
    except ConfigError as exc:
        if click.get_current_context(silent=True) is None:
            raise  # no command runs (a test's create_app, wsgi.py): its caller reads it
        raise ConfigExit(exc.format_message()) from None


def name_of(ctx: click.Context) -> str:
    """The command as an operator types it: `flask events replay` (however `flask` itself was started)."""
    names: list[str] = []
    while ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["flask", *names])


class Commands(AppGroup):
    """A group of commands that end in one line, not a traceback, when PostgreSQL is unavailable.
    Each declares what it reads of the settings (`@group.command(name, needs=Needs.DATABASE)`); by default, all."""

    def invoke(self, ctx: click.Context) -> Any:
        with unavailable_in_one_line():
            return super().invoke(ctx)

    def command(self, *args: Any, needs: Needs = Needs.SERVICE, **kwargs: Any) -> Any:
        register = super().command(*args, **kwargs)
        return lambda function: register(_needs(needs)(function))


_needs = needs  # for Commands.command, whose keyword hides it


def api_base(source: Source) -> str:
    """The address of source's provider API, resolved when the settings were read (app/settings/sources.py)."""
    assert source.api_base is not None, f"{source.scheme} has no API address"  # a provider with an API has one
    return source.api_base


def either(names: list[str]) -> str:
    """names in words: "a", "a or b", "a, b or c"."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def with_accounts() -> list[Provider]:
    """The providers whose platforms have connected accounts."""
    return [provider for provider in PROVIDERS.values() if provider.is_account is not None]


def is_account(text: str) -> bool:
    """Whether text is a connected account's id, of any provider that has them (a ledger key's first part)."""
    return any(provider.has_account(text) for provider in PROVIDERS.values())


def meant_as_account(text: str) -> bool:
    """Whether text begins as a connected account's id does (a typo of one, not a customer's id)."""
    return any(provider.account_prefix and text.startswith(provider.account_prefix) for provider in with_accounts())


def account_words(customer: bool = False) -> str:
    """A connected account's id in a refusal's words ("acct_ then letters and digits"), or its customer's
    ("acct_.../<customer id>")."""
    return " or ".join(f"{provider.account_prefix}.../<customer id>" if customer else provider.account_words
                       for provider in with_accounts())


# An adjustment's amount: any that a balance (BIGINT) can hold.
CENTS = click.IntRange(-2**63, 2**63 - 1)


def unit_name(conn: Any) -> str:
    """What the ledger's balances count, by name ("cents", "paise"): its recorded currency's minor unit, else
    LEDGER_CURRENCY's (a database before its first init-db)."""
    return minor_unit_name(recorded_currency(conn) or Settings.of(current_app).policy.currency)


def audit(message: str, *args: object) -> None:
    """Log what an operator's command changed to the system log (SYSTEM_LOG), as one JSON line tagged
    webhook-ledger; to the process's log on stderr where the machine has no system log."""
    logger = logging.getLogger(AUDIT)
    logger.setLevel(logging.INFO)  # whatever the root's level: an audit line is never filtered out
    if not logger.handlers and os.path.exists(SYSTEM_LOG):
        try:
            handler = logging.handlers.SysLogHandler(SYSTEM_LOG)
        except OSError:
            pass  # nobody listens there: stderr, as if there were none
        else:
            handler.ident = "webhook-ledger: "
            handler.setFormatter(json_formatter())
            logger.addHandler(handler)
            logger.propagate = False
    logger.info(message, *args)


def utc(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip())


def os_user() -> str:
    """The name of the OS user running the command."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in the environment, and a uid with no passwd entry
        raise click.ClickException("cannot tell which OS user runs this: name who makes it with --by") from None


# Off a terminal, one progress line each this many items: a log gets a few lines of a long run, not one per row.
PROGRESS_EVERY = 1000
# On a terminal, the bar or count is drawn again once each this many items at most (each drawing is a write).
BAR_STEPS = 100


class Progress:
    """advance(n), told of each n items done; total(n), told of how many there are once that is known."""
    # On a terminal (stderr): click's progress bar with the position, percentage and an estimate of the time left
    # when the total is known, else a count redrawn in place ("events listed: 1200"); off a terminal, a plain line
    # each PROGRESS_EVERY items ("events replayed: 2000 of 5000"), for a log.

    def __init__(self, done_what: str, total: int | None = None) -> None:
        self.done_what, self.of, self.done = done_what, total, 0
        self.terminal = sys.stderr.isatty()
        self.bar: Any = None  # click's, made on the first item once the total is known
        self.drawn = 0  # the count last drawn in place

    def total(self, total: int) -> None:
        self.of = total

    def __call__(self, n: int = 1) -> None:
        before, self.done = self.done, self.done + n
        if not self.terminal:
            if self.done // PROGRESS_EVERY > before // PROGRESS_EVERY:
                of = "" if self.of is None else f" of {self.of}"
                click.echo(f"{self.done_what}: {self.done}{of}", err=True)
        elif self.of is not None:
            if self.bar is None:
                self.bar = click.progressbar(length=self.of, label=self.done_what, file=sys.stderr, show_eta=True,
                                             show_percent=True, show_pos=True,
                                             update_min_steps=max(1, min(BAR_STEPS, self.of // 100)))
                self.bar.__enter__()
            self.bar.update(n)
        elif self.done - self.drawn >= BAR_STEPS or self.drawn == 0:
            self.drawn = self.done
            click.echo(f"\r{self.done_what}: {self.done}", err=True, nl=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
        elif self.terminal and self.done:
            click.echo(f"\r{self.done_what}: {self.done}", err=True)  # the last count, and the line ended


@contextmanager
def progress(done_what: str, total: int | None = None) -> Iterator[Progress]:
    """A Progress of done_what (its total, when known), closed at the end: the terminal's line is ended."""
    shown = Progress(done_what, total)
    try:
        yield shown
    finally:
        shown.close()


# A source's stored events of some statuses, oldest first, those whose bytes (or the provider's, kept with them) hold
# %(naming)s when given (stored_effects reads their bytes). The byte filter only spares the reading of the others.
STORED_EVENTS = """
    SELECT event_id, event_type, status, body, payload_sha256, fetched, coalesce(user_metadata_key, 'user_id')
    FROM webhook_events
    WHERE source = %(source)s AND status = ANY(%(statuses)s)
      AND (%(naming)s::bytea IS NULL OR position(%(naming)s IN body) > 0 OR position(%(naming)s IN fetched) > 0)
    ORDER BY created_at, id
"""
# The statuses of the events a user's link or a payment's user or key may be waiting for.
UNAPPLIED = ("failed", "ignored")
EVERY_STATUS = ("completed", "failed", "ignored", "dismissed")


def stored_effects(conn: Any, source: str, statuses: Sequence[str], naming: str | None = None
                   ) -> Iterator[tuple[str, str, Effect]]:
    """(event id, status, effect) of each stored event of source in statuses (whose bytes name naming, when given),
    oldest first, read as it was decided (by the metadata key recorded with it); one whose stored bytes cannot be
    read is left out."""
    params = {"source": source, "statuses": list(statuses), "naming": None if naming is None else naming.encode()}
    for event_id, event_type, status, body, payload_sha256, fetched, key in conn.execute(STORED_EVENTS, params):
        policy = Policy(users={source: Users(metadata_key=key)})
        try:
            yield event_id, status, effect_of(stored_event(source, event_id, event_type, bytes(body), payload_sha256,
                                                            fetched), policy)
        except StoredBodyError:
            continue


def unapplied(conn: Any, source: str) -> Iterator[tuple[str, str, Effect]]:
    """(event id, status, effect) of each failed or ignored event of source, oldest first."""
    return stored_effects(conn, source, UNAPPLIED)
