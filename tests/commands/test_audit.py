"""`flask audit` (app/commands/audit.py, app/providers/stripe_audit.py): the ledger held against Stripe's balance
transactions. The real stripe-python lists them over HTTP from devservers/stripe_stand_in.py, which serves List all
balance transactions as https://docs.stripe.com/api/balance_transactions/list documents it; the ledger is filled by
`flask reconcile` from the same account's events. Nothing is mocked."""

import json
import os
import shlex
import time
from datetime import UTC, datetime

import pytest
import stripe
from prometheus_client.parser import text_string_to_metric_families

from app.commands import stripe_list
from devservers.stripe_balance import charge, payout, transaction
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import ALICE, assert_ledger_consistent
from tests.providers.stripe.audit_seed import seeded
from tests.providers.stripe.events import intent_succeeded, send_stripe

pytestmark = pytest.mark.core

# The money tables: what no audit may change (a count and a sum of each).
MONEY = {"user_balances": "balance_cents", "webhook_events": "attempts", "payments": "amount_cents",
         "movements": "amount_cents", "ledger_journal": "amount_cents", "customer_links": "0",
         "payment_users": "0", "ignored_payments": "0"}
# The account (10,000 payments, 1,000 refunds of which 50 failed, 100 disputes of which 20 reinstated, 200
# non-user transactions, 6 discrepancies of each class Stripe can show) with AUDIT_FULL_SEED=1: four minutes here,
# most of it reconcile filling the ledger; the default is a tenth of it, 4 of each class.
FULL_SEED = dict(payments=10000, refunds=1000, failed=50, disputes=100, reinstated=20, non_user=200, per_class=6)
SEED = FULL_SEED if os.environ.get("AUDIT_FULL_SEED") == "1" else {}
INJECTED_CLASSES = ("missing_in_ledger", "missing_at_provider", "amount_mismatch", "currency_mismatch",
                    "state_mismatch", "user_mismatch", "unknown_provider_type")


@pytest.fixture
def scheme():
    return "stripe"


@pytest.fixture
def stand_in():
    with StripeStandIn() as server:
        yield server


@pytest.fixture
def config(config, stand_in):
    return {**config, "WEBHOOK_API_KEY": API_KEY, "STRIPE_API_BASE": stand_in.url}


def iso(seconds):
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def cli(app, *args):
    return app.test_cli_runner().invoke(args=list(args))


def audit(app, tmp_path, *args, since_days=3):
    """One `flask audit default` over the last since_days; (its exit code, its --json document, its output)."""
    out = tmp_path / f"audit{time.monotonic_ns()}.json"
    since = iso(int(time.time()) - since_days * 86400)
    result = cli(app, "audit", "default", "--since", since, "--json", str(out), *args)
    document = json.loads(out.read_text()) if out.exists() else None
    return result.exit_code, document, result.output


def fill(app, stand_in, seed, account=None):
    """The ledger as deliveries would have made it: the seed's events, by `flask reconcile`."""
    stand_in.add(*seed.events)
    stand_in.balance.add(*seed.transactions, account=account)
    extra = ["--account", account] if account else []
    result = cli(app, "reconcile", "default", "--since", iso(int(time.time()) - 3 * 86400), *extra)
    assert result.exit_code == 0, result.output


def money(db):
    """A count and a sum of each money table."""
    return {name: db.execute(f"SELECT count(*), coalesce(sum({column}), 0) FROM {name}").fetchone()  # noqa: S608
            for name, column in MONEY.items()}


def found(document):
    """The run's breaks: class -> {key}."""
    by_class = {}
    for item in document["breaks"]:
        key = item["provider_key"] or item["ledger_key"]
        by_class.setdefault(item["class"], set()).add(key)
    return by_class


def run_fix(app, command):
    """Run a suggested fix as an operator pastes it (one or two `flask ...` joined by &&)."""
    for part in command.split(" && "):
        words = shlex.split(part)
        assert words[0] == "flask", command
        result = cli(app, *words[1:])
        assert result.exit_code == 0, (command, result.output)


def test_the_seeded_account_reports_exactly_the_injected_breaks_and_classifies_every_non_user_transaction(
        app, db, stand_in, tmp_path):
    seed = seeded(int(time.time()), **SEED)
    fill(app, stand_in, seed)
    before = money(db)
    code, document, output = audit(app, tmp_path, "--grace", "0s")
    assert money(db) == before  # read-only
    assert code == 2, output  # incomplete: transactions of a type the adapter does not know
    unknown = len(seed.injected["unknown_provider_type"])
    assert document["header"]["verdict"] == "incomplete" and f"{unknown} record(s)" in document["header"]["reason"]
    assert found(document) == {klass: seed.injected[klass] for klass in INJECTED_CLASSES}
    usd = document["statements"]["usd"]
    assert {category: (usd["non_user_count"][category], usd["non_user"][category])
            for category in seed.non_user} == seed.non_user
    assert usd["residual"] == 0 and document["statements"]["eur"]["residual"] == 0
    assert usd["unknown_types"] == 5 * unknown
    assert document["pending"] == []
    verified = cli(app, "ledger", "verify")
    assert verified.exit_code == 0 and "ledger consistent" in verified.output, verified.output


def test_reruns_add_no_break_and_keep_the_ids_and_fixing_some_resolves_exactly_those(app, db, stand_in, tmp_path):
    seed = seeded(int(time.time()))
    fill(app, stand_in, seed)
    _, first, _ = audit(app, tmp_path, "--grace", "0s")
    ids = {item["break_id"] for item in first["breaks"]}
    for _ in range(3):
        _, again, _ = audit(app, tmp_path, "--grace", "0s")
        assert {item["break_id"] for item in again["breaks"]} == ids
    assert db.execute("SELECT count(*), min(runs_seen), max(runs_seen) FROM audit_breaks").fetchone() == \
        (len(ids), 4, 4)
    assert {status for (status,) in db.execute("SELECT status FROM audit_breaks")} == {"persisting"}
    # Ten fixed with the command each break names: four recovered, four and two corrected.
    chosen = ([item for item in first["breaks"] if item["class"] == "missing_in_ledger"]
              + [item for item in first["breaks"] if item["class"] == "missing_at_provider"]
              + [item for item in first["breaks"] if item["class"] == "amount_mismatch"][:2])
    stand_in.add(*(seed.withheld[item["provider_key"]] for item in chosen if item["class"] == "missing_in_ledger"))
    for item in chosen:
        run_fix(app, item["fix"])
    before = money(db)
    code, after, output = audit(app, tmp_path, "--grace", "0s")
    assert money(db) == before
    assert {item["break_id"] for item in after["breaks"]} == ids - {item["break_id"] for item in chosen}, output
    resolved = {row[0] for row in db.execute("SELECT break_id FROM audit_breaks WHERE status = 'resolved'")}
    assert resolved == {item["break_id"] for item in chosen}
    assert after["statements"]["usd"]["residual"] == 0
    shown = cli(app, "audit", "show", str(after["header"]["run"]), "--open")
    assert shown.exit_code == 0 and all(item["break_id"] not in shown.output for item in chosen), shown.output
    assert_ledger_consistent(db)


def test_fixing_the_remaining_money_breaks_reconciles_the_account(app, db, stand_in, tmp_path):
    seed = seeded(int(time.time()), payments=40, refunds=6, failed=1, disputes=3, reinstated=1, non_user=8)
    fill(app, stand_in, seed)
    _, first, _ = audit(app, tmp_path, "--grace", "0s")
    stand_in.add(*seed.withheld.values())  # the lost refund.failed and payment events, for the reconciles
    for item in first["breaks"]:
        if item["class"] != "unknown_provider_type":
            run_fix(app, item["fix"])
    code, after, output = audit(app, tmp_path, "--grace", "0s")
    assert found(after) == {"unknown_provider_type": seed.injected["unknown_provider_type"]}, output
    assert code == 2


def test_a_clean_account_is_reconciled_and_exit_zero(app, db, stand_in, tmp_path):
    seed = seeded(int(time.time()), payments=30, refunds=5, failed=1, disputes=2, reinstated=1, non_user=8,
                  per_class=0)
    fill(app, stand_in, seed)
    code, document, output = audit(app, tmp_path)
    assert (code, document["header"]["verdict"], document["breaks"]) == (0, "reconciled", []), output


def test_a_money_break_is_verdict_breaks_and_exit_one(app, db, stand_in, tmp_path):
    now = int(time.time())
    stand_in.balance.add(transaction("txn_lost1", now - 7200, "charge", "charge", 500,
                                     charge("pi_lost1", 500, user=str(ALICE), created=now - 7200)))
    code, document, output = audit(app, tmp_path)
    assert (code, document["header"]["verdict"]) == (1, "breaks"), output
    assert found(document) == {"missing_in_ledger": {"pi_lost1"}}
    assert document["breaks"][0]["fix"].startswith("flask reconcile default --since ")


def test_a_transaction_inside_the_grace_is_pending_never_a_break(app, db, stand_in, tmp_path):
    now = int(time.time())
    stand_in.balance.add(transaction("txn_young", now - 60, "charge", "charge", 500,
                                     charge("pi_young", 500, user=str(ALICE), created=now - 60)))
    code, document, output = audit(app, tmp_path)
    assert (code, document["header"]["verdict"]) == (0, "reconciled_with_pending"), output
    assert document["breaks"] == [] and [item["key"] for item in document["pending"]] == ["pi_young"]
    assert db.execute("SELECT count(*) FROM audit_breaks").fetchone()[0] == 0
    code, document, _ = audit(app, tmp_path, "--grace", "0s")
    assert code == 1 and found(document) == {"missing_in_ledger": {"pi_young"}}


def test_a_429_storm_makes_the_run_incomplete_never_reconciled(app, db, stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(stripe_list, "RATE_LIMIT_RETRIES", 2)
    monkeypatch.setattr(stripe_list, "RATE_LIMIT_FIRST_DELAY", 0.01)
    seed = seeded(int(time.time()), payments=30, refunds=0, disputes=0, non_user=0, per_class=0)
    fill(app, stand_in, seed)
    _, clean, _ = audit(app, tmp_path)
    assert clean["header"]["verdict"] == "reconciled"
    stand_in.fail_next(429, times=3)
    code, document, output = audit(app, tmp_path)
    assert code == 2, output
    assert document["header"]["verdict"] == "incomplete" and "429" in document["header"]["reason"]
    assert db.execute("SELECT verdict FROM audit_runs ORDER BY id DESC LIMIT 1").fetchone()[0] == "incomplete"


def test_a_partial_read_resolves_nothing(app, db, stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(stripe_list, "RATE_LIMIT_RETRIES", 0)
    now = int(time.time())
    stand_in.balance.add(transaction("txn_lost2", now - 7200, "charge", "charge", 500,
                                     charge("pi_lost2", 500, user=str(ALICE), created=now - 7200)))
    assert audit(app, tmp_path)[0] == 1
    stand_in.fail_next(429)
    assert audit(app, tmp_path)[0] == 2
    assert db.execute("SELECT status FROM audit_breaks").fetchall() == [("new",)]


def test_a_connected_accounts_breaks_are_its_own(app, db, stand_in, tmp_path):
    account = "acct_1ConnectedAudit"
    stand_in.add_account(account)
    platform = seeded(int(time.time()), payments=20, refunds=2, failed=0, disputes=1, reinstated=0, non_user=4,
                      per_class=0)
    fill(app, stand_in, platform)
    connected = seeded(int(time.time()), payments=20, refunds=2, failed=0, disputes=1, reinstated=0, non_user=4,
                       per_class=1, account=account)
    fill(app, stand_in, connected, account)
    code, mine, output = audit(app, tmp_path)
    assert (code, mine["breaks"]) == (0, []), output
    code, theirs, output = audit(app, tmp_path, "--account", account, "--grace", "0s")
    assert code == 2, output
    assert found(theirs) == connected.injected
    assert all(key.startswith(f"{account}/") for klass, keys in found(theirs).items()
               if klass != "unknown_provider_type" for key in keys)
    rows = db.execute("SELECT DISTINCT account FROM audit_breaks").fetchall()
    assert rows == [(account,)]
    every = cli(app, "audit", "default", "--all-accounts", "--grace", "0s", "--since",
                iso(int(time.time()) - 3 * 86400))
    assert every.exit_code == 2 and f"audit default (connected account {account})" in every.output, every.output


def test_an_audit_never_writes_money_and_verify_stays_clean(app, db, stand_in, tmp_path):
    seed = seeded(int(time.time()), payments=30, refunds=4, failed=1, disputes=2, reinstated=1, non_user=4,
                  per_class=1)
    fill(app, stand_in, seed)
    before = money(db)
    for args in ((), ("--grace", "0s"), ("--grace", "1d")):
        audit(app, tmp_path, *args)
    assert money(db) == before
    assert_ledger_consistent(db)


@pytest.mark.parametrize(("args", "message"), [
    (["audit", "nosuch"], "no source named 'nosuch'"),
    (["audit", "default", "--account", "bogus"], "not a Stripe account id"),
    (["audit", "default", "--grace", "soon"], "is not a duration"),
    (["audit", "default", "--since", "2026-12-02", "--until", "2026-12-01"], "--since must be before --until"),
    (["audit", "show", "999"], "no audit run 999"),
    (["audit", "default", "--grace", "99999999999d"], "longer than a duration can be"),
    (["audit", "default", "--until", "0001-01-01"], "--until is too early to be a window's end"),
    (["audit", "default", "--json", "/nonexistent/audit.json"], "not a file this user can write"),
])
def test_bad_arguments_are_refused_in_one_line(app, db, args, message):
    result = cli(app, *args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # click's refusal, not a traceback
    assert db.execute("SELECT count(*) FROM audit_runs").fetchone()[0] == 0


def test_a_since_before_the_unix_epoch_lists_from_the_epoch(app, db, tmp_path):
    result = cli(app, "audit", "default", "--since", "0001-01-01", "--json", str(tmp_path / "run.json"))
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads((tmp_path / "run.json").read_text())["header"]["verdict"] == "reconciled"


def test_the_stand_in_lists_balance_transactions_newest_first_by_cursor_and_expands_the_source(stand_in):
    now = int(time.time())
    stand_in.balance.add(*(transaction(f"txn_{n:03d}", now - 1000 + n // 3, "charge", "charge", 100 + n,
                                       charge(f"pi_{n:03d}", 100 + n)) for n in range(250)))
    client = stripe.StripeClient(API_KEY, base_addresses={"api": stand_in.url})
    listed = client.v1.balance_transactions.list({"created": {"gte": now - 1000, "lt": now}, "limit": 100,
                                                  "expand": ["data.source"]})
    ids = [txn.id for txn in listed.auto_paging_iter()]
    assert ids == [f"txn_{n:03d}" for n in reversed(range(250))]
    assert listed.data[0].source.object == "charge"
    bare = client.v1.balance_transactions.list({"limit": 1})
    assert bare.data[0].source == "ch_249"


def _gauges(client):
    text = client.get("/metrics").get_data(as_text=True)
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name.startswith("webhook_ledger_audit_")}


def test_metrics_show_open_breaks_by_class_what_persists_and_the_last_complete_run(app, client, db, stand_in,
                                                                                    tmp_path):
    seed = seeded(int(time.time()), payments=20, refunds=2, failed=0, disputes=1, reinstated=0, non_user=4,
                  per_class=1)
    fill(app, stand_in, seed)
    before = _gauges(client)
    assert before[("webhook_ledger_audit_last_complete_timestamp_seconds", (("source", "default"),))] == 0
    audit(app, tmp_path, "--grace", "0s")
    once = _gauges(client)
    for klass in ("missing_in_ledger", "missing_at_provider", "amount_mismatch", "currency_mismatch",
                  "state_mismatch", "user_mismatch", "unknown_provider_type"):
        assert once[("webhook_ledger_audit_open_breaks", (("class", klass), ("source", "default")))] == 1
    assert once[("webhook_ledger_audit_open_breaks", (("class", "matched_by_amount_only"), ("source", "default")))] \
        == 0
    assert once[("webhook_ledger_audit_priority_breaks_persisting", (("source", "default"),))] == 0
    # An incomplete run (a type the adapter does not know) is no complete audit: the time stays 0.
    assert once[("webhook_ledger_audit_last_complete_timestamp_seconds", (("source", "default"),))] == 0
    audit(app, tmp_path, "--grace", "0s")
    twice = _gauges(client)
    assert twice[("webhook_ledger_audit_priority_breaks_persisting", (("source", "default"),))] == 6


def test_payouts_are_checked_against_the_transactions_they_paid_out(app, db, stand_in, tmp_path):
    now = int(time.time())
    seed = seeded(now, payments=12, refunds=2, failed=0, disputes=0, non_user=0, per_class=0)
    # Two automatic payouts of the account's transactions (https://docs.stripe.com/payouts/reconciliation): the
    # first pays out exactly their net, the second 1 cent more than its transactions add up to.
    for n, transactions in enumerate((seed.transactions[:7], seed.transactions[7:])):
        created, payout_id = now - 5 * 3600 + n, f"po_test{n}"
        net = sum(txn["net"] for txn in transactions)
        for txn in transactions:
            txn["payout"] = payout_id
        stand_in.balance.add_payout(payout(payout_id, net + n, created))
        own = transaction(f"txn_po{n}", created, "payout", "payout", -(net + n), payout_id)
        own["payout"] = payout_id
        seed.transactions.append(own)
    fill(app, stand_in, seed)
    code, document, output = audit(app, tmp_path, "--payouts")
    assert code == 1, output
    assert [(check["payout"], check["transactions"], check["net"] == check["amount"])
            for check in sorted(document["payouts"], key=lambda check: check["payout"])] == \
        [("po_test0", 7, True), ("po_test1", len(seed.transactions) - 9, False)]
    assert found(document) == {"amount_mismatch": {"payout/po_test1"}}
    assert "payouts: 2 checked against their transactions, 1 add up" in output
    _, without, _ = audit(app, tmp_path)
    assert without["payouts"] is None and without["breaks"] == []
    assert db.execute("SELECT provider_key, status FROM audit_breaks").fetchall() == [("payout/po_test1", "new")]


def test_a_refund_the_ledger_gave_back_but_stripe_kept_is_a_state_mismatch_fixed_by_an_adjustment(
        app, db, stand_in, tmp_path):
    now = int(time.time())
    seed = seeded(now, payments=3, refunds=1, failed=1, disputes=0, non_user=0, per_class=0)
    seed.transactions = [txn for txn in seed.transactions if txn["type"] != "refund_failure"]  # Stripe: succeeded
    fill(app, stand_in, seed)
    code, document, output = audit(app, tmp_path)
    assert code == 1 and found(document) == {"state_mismatch": {"re_plat00000"}}, output
    fix = document["breaks"][0]["fix"]
    assert fix.startswith(f"flask ledger adjust {ALICE} -") and "audit brk_" in fix
    run_fix(app, fix)
    code, document, output = audit(app, tmp_path)
    assert (code, document["breaks"]) == (0, []), output
    assert_ledger_consistent(db)


def test_a_payment_refused_for_want_of_its_user_is_fixed_by_assign_user_one_naming_a_key_by_replay(
        app, db, client, stand_in, tmp_path):
    """A payment whose event named no user waits for an operator's assignment; one whose event names the
    application's key of a user waits for that key (`flask users add --key`), then its replay: assigning it a
    user would not apply it."""
    now = int(time.time())
    unnamed, keyed = intent_succeeded("pi_unnamed", metadata={}, cents=500), \
        intent_succeeded("pi_keyed", metadata={"user_id": "5150"}, cents=700)
    for evt in (unnamed, keyed):
        assert send_stripe(client, evt).status == 422
    stand_in.balance.add(transaction("txn_unnamed", now - 7200, "charge", "charge", 500,
                                     charge("pi_unnamed", 500, created=now - 7200)),
                         transaction("txn_keyed", now - 7200, "charge", "charge", 700,
                                     charge("pi_keyed", 700, user="5150", created=now - 7200)))
    code, document, output = audit(app, tmp_path)
    assert code == 1 and found(document) == {"missing_in_ledger": {"pi_unnamed", "pi_keyed"}}, output
    fixes = {item["provider_key"]: item["fix"] for item in document["breaks"]}
    assert fixes["pi_unnamed"] == "flask payments assign-user default pi_unnamed USER_ID", fixes
    assert fixes["pi_keyed"] == f"flask events replay {keyed.id} --source default", fixes
