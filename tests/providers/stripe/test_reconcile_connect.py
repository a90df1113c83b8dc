"""`flask reconcile SOURCE --account acct_...` and `--all-accounts` (app/commands/reconcile.py, stripe_list.py): a
Stripe Connect platform's connected accounts, each listed in its own context (Stripe-Account), its events checked
against the account they were listed under, its run and watermark its own. The real stripe-python talks over HTTP to
devservers/stripe_stand_in.py; nothing is mocked. Assertions read balances and what reconcile reports, never a
payment's key (which may come to name its account)."""

import time
from datetime import UTC

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.commands import stripe_list
from app.store.db import apply_schema
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import ALICE, BOB, OPENING, assert_ledger_consistent, balance, db_url
from tests.providers.stripe.events import intent_succeeded, refund, send_stripe

pytestmark = pytest.mark.core

ALPHA, BETA, GAMMA = "acct_1Alpha0000000001", "acct_1Beta00000000002", "acct_1Gamma0000000003"


@pytest.fixture
def scheme():
    return "stripe"


@pytest.fixture
def stand_in():
    with StripeStandIn() as server:
        server.add_account(ALPHA, BETA, GAMMA)
        yield server


@pytest.fixture
def config(config, stand_in):
    return {**config, "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url}


def of(account, evt, seconds_ago=600):
    """evt as a Connect platform receives it from account (its top-level `account`), created seconds_ago."""
    evt["account"] = account
    evt["created"] = int(time.time()) - seconds_ago
    return evt


def run(app, *args):
    return app.test_cli_runner().invoke(args=["reconcile", "default", *args])


def runs(db):
    return db.execute("SELECT account, status, listed, applied, duplicates, refused FROM reconcile_runs"
                      " ORDER BY id").fetchall()


def watermarks(db):
    rows = db.execute("SELECT account, reconciled_until, run_id FROM reconcile_watermarks").fetchall()
    return {account: (until, run_id) for account, until, run_id in rows}


def stored(db):
    return db.execute("SELECT count(*) FROM webhook_events").fetchone()[0]


def test_a_connected_accounts_payment_and_refund_missed_by_the_webhook_are_recovered_by_its_run(app, client, db,
                                                                                              stand_in):
    delivered = of(ALPHA, intent_succeeded("pi_c_kept", user=BOB, cents=100), 900)
    assert send_stripe(client, delivered).json["status"] == "processed"
    stand_in.add(delivered, of(ALPHA, intent_succeeded("pi_c_lost", user=BOB, cents=1000), 800),
                 of(ALPHA, refund("re_c_lost", "pi_c_lost", 300, event_type="refund.created"), 700))
    stand_in.add(of(None, intent_succeeded("pi_platform", cents=50), 600))  # the platform's own: not ALPHA's
    result = run(app, "--account", ALPHA)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"reconcile default (connected account {ALPHA}) from Stripe's event list, run ")
    assert "3 listed: 2 applied (recovered: their deliveries were lost), 1 duplicates, 0 refused" in result.output
    assert balance(db, BOB) == 100 + 1000 - 300
    assert balance(db, ALICE) == OPENING[ALICE]
    assert runs(db) == [(ALPHA, "completed", 3, 2, 1, 0)]
    assert_ledger_consistent(db)


def test_all_accounts_reconciles_each_account_the_platform_lists_over_pages_of_accounts(app, db, stand_in,
                                                                                       monkeypatch):
    monkeypatch.setattr(stripe_list, "PAGE_LIMIT", 2)  # three accounts: two pages of them
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70)), of(BETA, intent_succeeded("pi_b", user=BOB, cents=30)))
    result = run(app, "--all-accounts")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines] == [GAMMA, BETA, ALPHA, "3 connected accounts"]  # newest first
    assert "1 listed: 1 applied, 0 duplicates, 0 refused; watermark " in lines[1]
    assert " completed: 0 pages, 0 listed: 0 applied" in lines[0]
    assert lines[-1] == "3 connected accounts: 3 completed"
    assert balance(db, ALICE) == OPENING[ALICE] + 70 and balance(db, BOB) == 30
    assert sorted(runs(db)) == [(ALPHA, "completed", 1, 1, 0, 0), (BETA, "completed", 1, 1, 0, 0),
                                (GAMMA, "completed", 0, 0, 0, 0)]
    account_pages = [request for request in stand_in.requests if request.get("starting_after", "").startswith("acct_")]
    assert account_pages == [{"limit": "2", "starting_after": BETA}]


def test_all_accounts_reports_an_account_that_refuses_the_key_and_still_runs_the_others(app, db, stand_in):
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70)), of(GAMMA, intent_succeeded("pi_g", cents=5)))
    stand_in.disconnect(BETA)  # still listed, but the platform can no longer act as it
    result = run(app, "--all-accounts")
    assert result.exit_code == 1, result.output
    assert f"{BETA}: failed: Stripe refused the key in WEBHOOK_API_KEY (403) in account {BETA}: " in result.output
    assert result.output.splitlines()[-1] == "3 connected accounts: 2 completed, 1 failed"
    assert balance(db) == OPENING[ALICE] + 75
    assert sorted(row[:2] for row in runs(db)) == [(ALPHA, "completed"), (BETA, "failed"), (GAMMA, "completed")]


def test_all_accounts_does_not_run_an_account_listed_with_an_id_that_is_none(app, db, stand_in):
    stand_in.add_account("acct_1Bad-Id")
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70)))
    result = run(app, "--all-accounts")
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == ("acct_1Bad-Id: failed: Stripe listed it as an account, but it is no "
                                             "account id (acct_ then letters and digits): not reconciled")
    assert result.output.splitlines()[-1] == "4 connected accounts: 3 completed, 1 failed"
    assert balance(db) == OPENING[ALICE] + 70
    assert "acct_1Bad-Id" not in {row[0] for row in runs(db)}


def test_all_accounts_stops_in_one_line_when_the_platform_cannot_list_its_accounts(make_app, config, db):
    result = run(make_app({**config, "WEBHOOK_API_KEY": "rk_test_notTheKeyStripeKnows0123456789"}), "--all-accounts")
    assert (result.exit_code, result.output) == (1, "Error: Stripe refused the key in WEBHOOK_API_KEY (401): it "
                                                    "must be a restricted key with read access to Accounts\n")


@pytest.mark.parametrize("listed_under, names, args", [
    (ALPHA, BETA, ["--account", ALPHA]),  # another connected account's event, in ALPHA's list
    (ALPHA, None, ["--account", ALPHA]),  # the platform's own event, in ALPHA's list
    (None, ALPHA, []),  # a connected account's event, in the platform's own list
], ids=["another-account", "no-account-under-an-account", "an-account-under-the-platform"])
def test_an_event_listed_under_one_account_that_names_another_is_refused_and_nothing_applied(app, db, stand_in,
                                                                                             listed_under, names,
                                                                                             args):
    stray = of(names, intent_succeeded("pi_stray", user=BOB, cents=400))
    stand_in.add_listed_under(listed_under, stray)
    result = run(app, *args)
    assert "1 listed: 0 applied (recovered: their deliveries were lost), 0 duplicates, 1 refused" in result.output
    whose = f"account {listed_under}" if listed_under else "the platform's own account"
    named = f"the account {names}" if names else "no account"
    assert f"refused {stray['id']} (payment_intent.succeeded): not stored: listed as an event of {whose}, it " \
           f"names {named}" in result.output, result.output
    assert balance(db, BOB) == 0
    assert stored(db) == 0
    assert [row[1:] for row in runs(db)] == [("completed", 1, 0, 0, 1)]


def test_an_accounts_run_leaves_the_platforms_watermark_alone(app, db, stand_in):
    stand_in.add(of(None, intent_succeeded("pi_platform", cents=20), 3600))
    assert run(app).exit_code == 0
    platform = watermarks(db)[""]
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70), 7200))  # older than the platform's watermark
    first = run(app, "--account", ALPHA)
    assert first.exit_code == 0, first.output
    assert "(the watermark " not in first.output  # its first run starts at the horizon, not at the platform's
    assert "1 listed: 1 applied" in first.output
    assert balance(db) == OPENING[ALICE] + 90
    assert watermarks(db)[""] == platform
    alpha = watermarks(db)[ALPHA]
    assert alpha[1] == db.execute("SELECT id FROM reconcile_runs WHERE account = %s", [ALPHA]).fetchone()[0]
    second = run(app, "--account", ALPHA)
    assert f"(the watermark {alpha[0].astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')}" in second.output, second.output
    assert watermarks(db)[""] == platform


def _held(db, account):
    """A connection holding the watermark row of the default source's account, as a running run does."""
    holder = psycopg.connect(db_url(db))
    holder.execute("INSERT INTO reconcile_watermarks (source, account) VALUES ('default', %s) ON CONFLICT DO NOTHING",
                   [account])
    holder.execute("SELECT 1 FROM reconcile_watermarks WHERE source = 'default' AND account = %s FOR UPDATE",
                   [account])
    return holder


def test_a_run_of_the_platform_does_not_hold_back_an_accounts_run(app, db, stand_in):
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70)))
    with _held(db, ""):
        result = run(app, "--account", ALPHA)
    assert result.exit_code == 0, result.output
    assert balance(db) == OPENING[ALICE] + 70


def test_a_second_run_of_one_account_yields(app, db, stand_in):
    with _held(db, ALPHA):
        result = run(app, "--account", ALPHA)
    assert result.exit_code == 75, result.output
    assert result.output.splitlines()[-1] == (f"another reconcile of account {ALPHA} of this source is running (it "
                                              "holds the watermark row): this one yields")
    assert [row[:2] for row in runs(db)] == [(ALPHA, "yielded")]


def test_an_accounts_dry_run_reads_its_own_watermark(app, db, stand_in):
    stand_in.add(of(ALPHA, intent_succeeded("pi_a", cents=70), 7200))
    assert run(app).exit_code == 0  # the platform's watermark: now
    result = run(app, "--account", ALPHA, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "(the watermark " not in result.output
    assert "1 listed: 1 not stored (would be applied)" in result.output


@pytest.mark.parametrize("account", ["acct_", "acct_1-x", "cus_1Alpha", "acct_1 2", "ACCT_1Alpha", "acct_1\nx",
                                     "acct_" + "a" * 251])
def test_a_bad_account_id_is_one_line_and_runs_nothing(app, db, stand_in, account):
    result = run(app, "--account", account)
    assert result.exit_code == 1
    assert result.output.startswith("Error: --account ") and "is not a Stripe account id" in result.output
    assert result.output.count("\n") == 1, result.output
    assert stand_in.requests == [] and runs(db) == []


def test_account_and_all_accounts_together_is_one_line(app, db, stand_in):
    result = run(app, "--account", ALPHA, "--all-accounts")
    assert (result.exit_code, result.output) == (1, "Error: --account and --all-accounts: give one or the other\n")


def _last_success(client):
    return next(sample.value for family in text_string_to_metric_families(client.get("/metrics").text)
                if family.name == "webhook_ledger_reconcile_last_success_timestamp_seconds"
                for sample in family.samples if sample.labels["source"] == "default")


def test_the_metrics_last_success_is_the_least_recently_reconciled_accounts(app, client, db, stand_in):
    assert run(app).exit_code == 0
    assert time.time() - _last_success(client) < 60
    stand_in.disconnect(ALPHA)
    assert run(app, "--account", ALPHA).exit_code == 1  # ALPHA has a watermark row, and no success yet
    assert _last_success(client) == 0
    stand_in.reconnect(ALPHA)
    assert run(app, "--account", ALPHA).exit_code == 0
    assert time.time() - _last_success(client) < 60


def test_a_watermark_from_before_accounts_is_the_platforms_own(app, db, stand_in):
    """A database migrated to 006: its watermark rows keep meaning the platform's account."""
    db.execute("DROP INDEX reconcile_runs_source_idx")
    db.execute("ALTER TABLE reconcile_watermarks DROP CONSTRAINT reconcile_watermarks_pkey, DROP COLUMN account,"
               " ADD PRIMARY KEY (source)")
    db.execute("ALTER TABLE reconcile_runs DROP COLUMN account")
    db.execute("CREATE INDEX reconcile_runs_source_idx ON reconcile_runs (source, status, finished_at)")
    db.execute("DELETE FROM schema_migrations WHERE name = '006_reconcile_accounts.sql'")
    db.execute("INSERT INTO reconcile_runs (source, since, until, status, finished_at) VALUES"
               " ('default', now() - interval '2 days', now() - interval '1 day', 'completed', now())")
    db.execute("INSERT INTO reconcile_watermarks (source, reconciled_until, run_id)"
               " SELECT source, until, id FROM reconcile_runs")
    assert apply_schema(db) == (False, ["006_reconcile_accounts.sql"])
    assert [row[:2] for row in runs(db)] == [("", "completed")]
    assert "(the watermark " in run(app).output
    assert "(the watermark " not in run(app, "--account", ALPHA).output
