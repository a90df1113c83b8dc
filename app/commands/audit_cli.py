"""`flask audit SOURCE` and `flask audit show RUN_ID`: the ledger against the provider's own money records
(app/commands/audit.py), read-only for the money tables (docs/operations.md, "Auditing against the provider")."""

import json
import os
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import with_appcontext
from psycopg.rows import namedtuple_row

from ..core.errors import ProviderError
from ..core.vocabulary import excerpt
from ..providers import PROVIDERS, of
from ..providers.budget import Budget
from ..settings.config import Needs, Settings
from ..settings.parsers import ConfigError
from ..settings.sources import api_key_setting
from ..store.db import get_pool, transaction, unavailable_in_one_line
from . import audit
from .base import Commands, api_base, either, needs, table, utc, with_accounts
from .cli import When


class AuditGroup(Commands):
    """`flask audit SOURCE ...` runs an audit; `flask audit show RUN_ID` shows one: a first word that names no
    subcommand is a source."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "run", self.commands["run"], args
        return super().resolve_command(ctx, args)


audit_group = AuditGroup("audit", help="Hold the ledger against the provider's own money records (read-only).",
                         invoke_without_command=False)

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Duration(click.ParamType):
    """90m, 2h, 1d, 0s."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        match = _DURATION.fullmatch(str(value).strip())
        if match is None:
            self.fail(f"{value!r} is not a duration (90m, 2h, 1d, 0s)", param, ctx)
        try:
            return timedelta(seconds=int(match[1]) * _UNITS[match[2]])
        except OverflowError:
            self.fail(f"{value!r} is longer than a duration can be ({timedelta.max.days} days)", param, ctx)


def init_app(app: Flask) -> None:
    app.cli.add_command(audit_group)


@audit_group.command("run", hidden=True)
@click.argument("source_name", metavar="SOURCE")
@click.option("--since", type=When(), help="Records created at or after WHEN [default: --until minus 36 hours].")
@click.option("--until", type=When(), help="Records created before WHEN [default: now].")
@click.option("--account", metavar="ACCT", help="A connected account's id "
              f"({', '.join(f'{provider.account_prefix}...' for provider in with_accounts())}): audit its balance.")
@click.option("--all-accounts", is_flag=True, help="Audit, in turn, each connected account the platform lists.")
@click.option("--grace", type=Duration(), default=f"{int(audit.DEFAULT_GRACE.total_seconds() // 60)}m",
              show_default=True, help="Items younger than this are pending, not breaks.")
@click.option("--payouts", is_flag=True, help="Also each paid payout of the window against its transactions.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the run (header, statements, breaks, pending) to FILE.")
@with_appcontext
@needs(Needs.SERVICE)
def run_audit(source_name: str, since: datetime | None, until: datetime | None, account: str | None,
              all_accounts: bool, grace: timedelta, payouts: bool, json_file: Path | None) -> None:
    """Audit SOURCE's ledger against the provider's money records (its balance transactions, settlements or
    transactions). Exit 0: reconciled (pending or not), 1: breaks, 2: incomplete."""
    settings = Settings.of(current_app)
    source = settings.sources.get(source_name)
    if source is None:
        raise click.UsageError(f"no source named {source_name!r} (WEBHOOK_SOURCES; `default` is WEBHOOK_SECRET's)")
    provider = of(source.scheme)
    make_records, list_accounts = provider.money_records, provider.accounts
    if make_records is None:
        audited = either([scheme for scheme, each in PROVIDERS.items() if each.money_records is not None])
        raise click.UsageError(f"source {source_name!r} has the scheme {source.scheme}: only a {audited} source's "
                               "money can be audited")
    lacking = [flag for flag, given, has in (("--account", account is not None, provider.is_account is not None),
                                             ("--all-accounts", all_accounts, list_accounts is not None),
                                             ("--payouts", payouts, provider.payouts)) if given and not has]
    if lacking:
        raise click.UsageError(f"{', '.join(lacking)}: not for a {provider.name} source")
    if account is not None and all_accounts:
        raise click.UsageError("--account and --all-accounts: give one or the other")
    if account is not None and not provider.has_account(account):
        raise click.UsageError(f"--account '{excerpt(account, 64)}' is not a {provider.name} account id "
                               f"({provider.account_words})")
    key_setting, api_key = api_key_setting(source.name), source.api_key
    if api_key is None:
        raise ConfigError(f"{key_setting} is not set: the audit needs {provider.money_key}")
    if json_file is not None and (json_file.is_dir() or not os.access(json_file.parent, os.W_OK)):
        raise click.UsageError(f"--json {json_file}: not a file this user can write")
    now = datetime.now(UTC)  # not rounded: a ledger item made this second is in the window
    until = min(until or now, now)
    if since is None and until - datetime.min.replace(tzinfo=UTC) < audit.DEFAULT_WINDOW:
        raise click.UsageError("--until is too early to be a window's end: give --since too")
    since = since or until - audit.DEFAULT_WINDOW
    if since >= until:
        raise click.UsageError("--since must be before --until")
    metadata_key = source.users.metadata_key
    # The account's budget, shared with every host's fetches and `flask reconcile` through Redis
    # (app/providers/budget.py): every request the audit makes spends it, and a 429 pauses them all.
    budget = Budget(current_app.extensions.get("redis"), source.scheme, api_key, source.api_rate, source.api_rate_total)

    def one(whose: str | None) -> audit.Run:
        records = make_records(api_key, api_base(source), key_setting, whose, metadata_key, budget)
        return audit.audit(get_pool(current_app), source.event_source, records, since, until, grace, now,
                           payouts=payouts)

    with unavailable_in_one_line():
        if all_accounts:
            assert list_accounts is not None  # refused above
            try:
                accounts = list_accounts(api_key, api_base(source), key_setting, budget)
            except ProviderError as exc:
                raise click.ClickException(str(exc)) from None
            runs = [one(whose) for whose in accounts if provider.has_account(whose)]
        else:
            runs = [one(account)]
    for run in runs:
        for line in summary_lines(run):
            click.echo(line)
    if json_file is not None:
        document = runs[0].as_json() if len(runs) == 1 else [run.as_json() for run in runs]
        json_file.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    raise click.exceptions.Exit(max((audit.EXIT[run.verdict] for run in runs), default=0))


def summary_lines(run: audit.Run) -> list[str]:
    """A run as `flask audit` prints it."""
    whose = f" (connected account {run.account})" if run.account else ""
    lines = [f"audit {run.source}{whose} against {run.provider}'s {run.what}, run {run.run_id}: created "
             f"{utc(run.since)} to {utc(run.until)}, grace {run.grace}: {run.verdict.upper()}"
             + (f": {run.reason}" if run.reason else "")]
    objects = ", ".join(f"{count} {kind}s" for kind, count in run.objects.items())
    lines.append(f"  {run.listed} records listed; objects audited: {objects or 'none'}; {len(run.pending)} pending, "
                 f"{len(run.breaks)} breaks ({run.new} new), {run.resolved} resolved")
    for currency, statement in sorted(run.statements.items()):
        lines.append(f"  {currency}: ledger {statement.ledger}, provider {statement.provider}, difference "
                     f"{statement.provider - statement.ledger} = pending {statement.pending} + breaks "
                     f"{statement.breaks} + set aside {statement.set_aside} + residual {statement.residual}")
        non_user = ", ".join(f"{category} {cents} ({statement.non_user_count[category]})"
                             for category, cents in sorted(statement.non_user.items()))
        lines.append(f"    not a user's money: fees {-statement.fees}" + (f", {non_user}" if non_user else "")
                     + (f", unknown types {statement.unknown}" if statement.unknown else ""))
    if run.payouts is not None:
        checked = [check for check in run.payouts if check.checked]
        lines.append(f"  payouts: {len(checked)} checked against their transactions, "
                     f"{sum(check.net == check.amount for check in checked)} add up"
                     + (f", {len(run.payouts) - len(checked)} manual (no transactions to check)"
                        if len(checked) < len(run.payouts) else ""))
    if run.breaks:
        counts = Counter(str(found.klass) for found in run.breaks)
        lines.append("  breaks by class: " + ", ".join(f"{klass} {count}" for klass, count in sorted(counts.items())))
    for found in run.breaks:
        lines.append(f"  {found.break_id} {found.klass} {found.provider_key or found.ledger_key}: {found.detail}")
        lines.append(f"    fix: {found.fix}")
    for item in run.pending:
        lines.append(f"  pending {item.kind} {item.key}: {item.why}")
    return lines


SHOW_RUN = "SELECT * FROM audit_runs WHERE id = %s"
SHOW_BREAKS = """
    SELECT break_id, class AS break_class, status, provider_key, ledger_key, provider_amount, ledger_amount,
           provider_currency, ledger_currency, runs_seen, first_seen_at, last_seen_at, fix
    FROM audit_breaks
    WHERE source = %(source)s AND account = %(account)s
      AND (last_run = %(run)s OR resolved_run = %(run)s) AND (NOT %(open)s OR status <> 'resolved')
    ORDER BY class, break_id
"""


@audit_group.command("show", needs=Needs.DATABASE)
@click.argument("run_id", type=int)
@click.option("--open", "only_open", is_flag=True, help="Only the breaks still open.")
def show_run(run_id: int, only_open: bool) -> None:
    """Show audit run RUN_ID: its verdict, statements, and the breaks it found or resolved."""
    with transaction(get_pool(current_app)) as conn:
        conn.row_factory = namedtuple_row
        run = conn.execute(SHOW_RUN, [run_id]).fetchone()
        if run is None:
            raise click.ClickException(f"no audit run {run_id}")
        rows = conn.execute(SHOW_BREAKS, {"source": run.source, "account": run.account, "run": run_id,
                                          "open": only_open}).fetchall()
    whose = f" (connected account {run.account})" if run.account else ""
    click.echo(f"audit run {run.id} of {run.source}{whose}: {run.verdict}{': ' + run.reason if run.reason else ''}")
    click.echo(f"  window {utc(run.since)} to {utc(run.until)}, grace {run.grace_seconds} s, started "
               f"{utc(run.started_at)}, finished {utc(run.finished_at)}; {run.listed} listed, {run.pending} pending,"
               f" {run.breaks} breaks")
    for currency, statement in sorted((run.statements or {}).items()):
        click.echo(f"  {currency}: ledger {statement['ledger']}, provider {statement['provider']}, residual "
                   f"{statement['residual']}")
    table(["break", "class", "status", "provider", "ledger", "runs", "first seen"],
          [[row.break_id, row.break_class, row.status,
            f"{row.provider_key or '-'} {_amount(row.provider_amount, row.provider_currency)}",
            f"{row.ledger_key or '-'} {_amount(row.ledger_amount, row.ledger_currency)}", row.runs_seen,
            utc(row.first_seen_at)] for row in rows])
    for row in rows:
        if row.status != "resolved":
            click.echo(f"  fix {row.break_id}: {row.fix}")


def _amount(cents: int | None, currency: str | None) -> str:
    return "-" if cents is None else f"{cents} {currency}"
