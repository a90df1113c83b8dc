"""The demo that `make run` and `make cluster` set up: its user and secret,
the settings check before any server starts, and the banner with a signed
curl to paste. The README's smoke test uses the same user and secret."""

import json
import os
import shlex

from app.config import ConfigError, from_env
from app.signature import sign

from .supervise import Failed

DEMO_USER = "00000000-0000-4000-8000-000000000001"
DEMO_SECRET = "dev-secret-change-me"


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


def banner(base_url, event_id, balance, config, secret_from_env, external):
    """What to paste into another terminal. Only the demo secret is ever printed."""
    body = json.dumps({"id": event_id, "type": "payment.succeeded",
                       "data": {"userId": DEMO_USER, "amountCents": 1000}}, separators=(",", ":"))
    scheme = config.webhook_signature_scheme
    headers = {"Content-Type": "application/json",
               **sign(scheme, body.encode(), config.webhook_secret, msg_id=event_id)}
    signed_with = "WEBHOOK_SECRET" if secret_from_env else f"the DEMO secret '{DEMO_SECRET}'"
    if scheme in ("stripe", "standard-webhooks"):
        signed_with += f"; its signed timestamp expires in {config.webhook_tolerance_seconds} s"
    curl = " ".join([f"curl -sS -w 'HTTP %{{http_code}}\\n' -X POST {base_url}/api/webhooks",
                     *(f"-H {shlex.quote(f'{name}: {value}')}" for name, value in headers.items()),
                     '--data-binary "$BODY"'])
    psql_target = '"$DATABASE_URL"' if external else shlex.quote(config.database_url)
    demo = "" if secret_from_env else f"\nWEBHOOK_SECRET = {DEMO_SECRET}  <- a DEMO secret, for local use only\n"
    rule = "=" * 70
    return f"""
{rule}
webhook-ledger is up at {base_url}   (Ctrl-C stops it{'' if external else ' and its servers'})
{demo}
Credit the demo user 1000 cents ({scheme}, signed with {signed_with}); paste it twice:
the first answer is "processed", the second "duplicate".

BODY={shlex.quote(body)}
{curl}

The balance ({balance} cents now, {balance + 1000} after that):

psql {psql_target} -c "SELECT user_id, balance_cents FROM user_balances WHERE user_id = '{DEMO_USER}'"
{rule}
"""
