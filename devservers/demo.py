"""The demo that `make run` and `make cluster` set up: its user and secret,
the settings check before any server starts, and the banner with a signed
curl to paste. The README's smoke test uses the same user and secret."""

import json
import os
import shlex
import sys
import time
from pathlib import Path

from app.intake.events import DEFAULT_SOURCE
from app.intake.signature import sign
from app.settings.config import SETTINGS, ConfigError, from_env

from . import ROOT, stripe_local
from .supervise import Failed

DEMO_USER = "00000000-0000-4000-8000-000000000001"
DEMO_SECRET = "dev-secret-change-me"
# How the banner gives devservers/stripe_local.py's stand-in of Stripe's API the demo event, from the checkout.
STAND_IN_PUT = ".venv/bin/python -m devservers.stripe_local put"


def check_settings(log):
    """Use the demo secret unless WEBHOOK_SECRET is set, and check the settings before anything starts.

    Return whether the secret came from the environment.
    """
    secret_from_env = bool(os.environ.get("WEBHOOK_SECRET"))
    if not secret_from_env:
        os.environ["WEBHOOK_SECRET"] = DEMO_SECRET
        log(f"WEBHOOK_SECRET is not set: using the DEMO secret '{DEMO_SECRET}' (never use it in production)")
    try:  # the servers' URLs are known later
        from_env({**os.environ, "DATABASE_URL": "postgresql://localhost/later", "REDIS_URL": "redis://localhost/0"})
    except ConfigError as exc:
        raise Failed(f"configuration: {exc}") from None
    return secret_from_env


def add_demo_user(conn):
    conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)"
                 " ON CONFLICT (user_id) DO NOTHING", [DEMO_USER])


def banner(base_url, event_id, balance, config, secret_from_env, external, env_file=None):
    """What to paste into another terminal. Only the demo secret is ever printed (env_file holds the others)."""
    scheme = config.webhook_signature_scheme
    default = config.sources.get(DEFAULT_SOURCE)
    fetching = default is not None and default.fetch
    stand_in = fetching and scheme == "stripe" and (default.api_base or config.stripe_api_base) == stripe_local.API_URL
    document = {"id": event_id, "type": "payment.succeeded", "data": {"userId": DEMO_USER, "amountCents": 1000}}
    if stand_in:  # an Event, as the stand-in keeps one for Retrieve an event
        document = {"id": event_id, "object": "event", "created": int(time.time()), **document}
    body = json.dumps(document, separators=(",", ":"))
    headers = {"Content-Type": "application/json",
               **sign(scheme, body.encode(), config.webhook_secret, msg_id=event_id)}
    signed_with = "WEBHOOK_SECRET" if secret_from_env else f"the DEMO secret '{DEMO_SECRET}'"
    if scheme in ("stripe", "standard-webhooks"):
        signed_with += f"; its signed timestamp expires in {config.webhook_tolerance_seconds} s"
    curl = " ".join([f"curl -sS -w 'HTTP %{{http_code}}\\n' -X POST {base_url}/api/webhooks",
                     *(f"-H {shlex.quote(f'{name}: {value}')}" for name, value in headers.items()),
                     '--data-binary "$BODY"'])
    if stand_in:  # the service reads each event from Stripe's API: the stand-in must have it before it is sent
        curl = f"{STAND_IN_PUT} \"$BODY\"\n{curl}"
    delivery = f"""Credit the demo user 1000 cents ({scheme}, signed with {signed_with}); paste it twice:
the first answer is "processed", the second "duplicate".

BODY={shlex.quote(body)}
{curl}"""
    if fetching and not stand_in:
        delivery = ("No demo delivery: the default source reads each event from its provider's API (WEBHOOK_FETCH), "
                    "which has\nno made-up event (one would be answered 422); send a test event from the provider, "
                    f"with the demo user\n{DEMO_USER} in its metadata.")
    psql_target = '"$DATABASE_URL"' if external else shlex.quote(config.database_url)
    demo = "" if secret_from_env else f"\nWEBHOOK_SECRET = {DEMO_SECRET}  <- a DEMO secret, for local use only\n"
    rule = "=" * 70
    return f"""
{rule}
webhook-ledger is up at {base_url}   (Ctrl-C stops it{'' if external else ' and its servers'})
{demo}
{routes(base_url, config)}

{delivery}

The balance ({balance} cents now, {balance + 1000} after that):

psql {psql_target} -c "SELECT user_id, balance_cents FROM user_balances WHERE user_id = '{DEMO_USER}'"

{commands(config, secret_from_env, external, env_file)}
{rule}
"""


def routes(base_url, config):
    """The route of every configured source, with its signature scheme."""
    lines = ["Routes, one per configured source:"]
    for source in config.sources.values():
        path = "/api/webhooks" if source.name == DEFAULT_SOURCE else f"/api/webhooks/{source.name}"
        lines.append(f"  {source.name:<12} {source.scheme:<18} {base_url}{path}")
    return "\n".join(lines)


def commands(config, secret_from_env, external, env_file=None):
    """How another terminal runs `flask` commands: `. <env_file>` (written by write_env), then `flask events list`.

    Without env_file (make cluster), an `export` block of what is not secret (the private servers' URLs, the demo
    secret), the settings this shell gave named for the other terminal to set the same way.
    """
    if env_file is not None:
        return f"""For `flask` commands in another terminal (docs/operations.md): this file sets every setting this
service runs with, secrets included (readable by you alone), PATH with {Path(sys.executable).parent} first
and FLASK_APP=app; it is written again on every start (the ports change):

. {env_file}
flask events list"""
    printed = {}
    if not external:
        printed["DATABASE_URL"], printed["REDIS_URL"] = config.database_url, config.redis_url
    if not secret_from_env:
        printed["WEBHOOK_SECRET"] = DEMO_SECRET
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        printed["PROMETHEUS_MULTIPROC_DIR"] = os.environ["PROMETHEUS_MULTIPROC_DIR"]  # replays' counts: /metrics
    given = sorted(name for name in os.environ if name not in printed and _is_setting(name, config))
    export = "export " + " ".join([*_flask_shell(), *(f"{name}={shlex.quote(value)}"
                                                      for name, value in printed.items())])
    also = f"\n# and, as in the shell that started this: {' '.join(given)}" if given else ""
    return f"""For `flask` commands in another terminal (docs/operations.md; the ports change on every run):

{export}{also}
flask events list"""


def write_env(path, config, base_url=None):
    """Write path (mode 600): `export` lines of every setting this process runs with, for a shell to source, the
    service's address as LEDGER_URL, and a `flask` that says in one line when the file is not this shell's any more.

    Secrets included: the file is the developer's own, as the terminal is; the banner names the file, not them.
    The settings this run leaves at their default are unset, so that a terminal that sourced an earlier run's file
    (another LEDGER_CURRENCY, say) runs its commands with this run's settings alone.
    """
    settings = {name: value for name, value in os.environ.items() if _is_setting(name, config)}
    settings["DATABASE_URL"], settings["REDIS_URL"] = config.database_url, config.redis_url
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        settings["PROMETHEUS_MULTIPROC_DIR"] = os.environ["PROMETHEUS_MULTIPROC_DIR"]  # replays' counts: /metrics
    unset = sorted(name for name in SETTINGS if name not in settings)
    # Which run wrote the file: its pid (alive while it serves) and when (a pid is reused).
    run = f"{os.getpid()}:{time.time_ns()}"
    extra = [f"LEDGER_RUN={run}", *([f"LEDGER_URL={shlex.quote(base_url)}"] if base_url else [])]
    lines = [f"export {word}" for word in
             [*_flask_shell(), *extra, *(f"{name}={shlex.quote(value)}" for name, value in sorted(settings.items()))]]
    lines += [f"unset {' '.join(unset)}"] if unset else []
    lines += _stale_guard(path)
    lines += [  # the docs' one helper for a signed Stripe event (devservers/stripe_send.py), from any folder
        "stripe_send() {  # stripe_send EVENT_ID TYPE OBJECT_JSON [--account acct_X] [--source NAME], or EVENT_JSON",
        f"  (cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m devservers.stripe_send \"$@\")",
        "}",
    ]
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)  # created anew, mode 600 from the start
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write("# make run's settings, for `flask` commands in another terminal: . " + str(path) + "\n")
        file.write("\n".join(lines) + "\n")
    return path


def _stale_guard(path):
    """A shell function `flask`: one line, not a connection timeout, when the make run that wrote path was started
    again since (new ports: the file was written anew) or has stopped."""
    file = shlex.quote(str(path))
    return [
        "flask() {  # make run's: says so when this terminal's settings are not the running make run's",
        f"  if [ \"$(sed -n 's/^export LEDGER_RUN=//p' {file} 2>/dev/null)\" != \"$LEDGER_RUN\" ]; then",
        f"    echo \"flask: this terminal's settings are an earlier make run's ({path} was written again since):"
        f" run . {file} again\" >&2; return 1",
        "  elif ! kill -0 \"${LEDGER_RUN%%:*}\" 2>/dev/null; then",
        f"    echo \"flask: the make run that wrote {path} has stopped: start it, then . {file} again\" >&2; return 1",
        "  fi",
        '  command flask "$@"',
        "}",
    ]


def _flask_shell():
    """What makes `flask <command>` run as the docs print it: this virtualenv's flask first, and the app it serves."""
    return [f'PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"', "FLASK_APP=app"]


def _is_setting(name, config):
    """Whether name is a setting of the README's table, or one of a configured source's."""
    prefixes = tuple(f"WEBHOOK_{source.upper().replace('-', '_')}_" for source in config.webhook_sources)
    return name in SETTINGS or name.startswith(prefixes)
