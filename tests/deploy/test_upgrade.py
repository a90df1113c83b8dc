"""The upgrade from release 1.0.0 as released: the commit tagged 1.0.0 (CHANGELOG.md names it), taken from git
history by its hash, runs its own `flask init-db`, gunicorn and commands on a throwaway PostgreSQL; then today's
`init-db` upgrades that database and today's gunicorn takes the later deliveries. Stripe events as Stripe sends them
(tests/providers/stripe/events.py); a connected account's carry `account` (https://docs.stripe.com/connect/webhooks)."""

import io
import os
import subprocess
import sys
import tarfile
import uuid

import psycopg
import pytest

from devservers import ROOT, Gunicorn
from tests.providers.stripe.events import deliver, dispute, intent_succeeded, invoice_intent_succeeded, refund

from ..helpers import ALICE, BOB, SECRETS

pytestmark = pytest.mark.deploy

# The commit tagged 1.0.0: it set app.__version__ to 1.0.0 and is named the release (CHANGELOG.md, "1.0.0").
RELEASE = "5f9fb701abc975ae8f9b2269d23345fd51c7569b"
# The last build whose schema or rule differs from the tag's that still said 1.0.0 (the CHANGELOG's 1.0.0 section
# was completed by it; the builds after it up to the first migration change only tests and docs).
LAST_1_0_0 = "c9a5d21fbe151d0bd8dc859b4b856e3ed777ebaf"
ACCOUNT = "acct_1Upgrade"
OPENING = {ALICE: 1000, BOB: 0}


def _tree(commit, folder):
    """commit's files (git archive) in folder; the test fails in one line when this clone lacks the commit."""
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.fail(f"commit {commit} (release 1.0.0) is not in this clone's history: `git fetch --unshallow` "
                    "or clone it whole", pytrace=False)
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


class Build:
    """One checkout's `flask` and gunicorn on the test's database: today's (root ROOT, its editable install) or an
    old commit's tree, imported first through PYTHONPATH (its dependencies are today's, razorpay aside: 1.0.0's
    requirements.lock pins the same versions of the rest)."""

    def __init__(self, root, settings, tmp_path):
        self.root, self.tmp_path = root, tmp_path
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("WEBHOOK_", "FLASK_", "PROMETHEUS_", "PYTHON"))}
        self.env = {**env, **settings, "FLASK_APP": "app"}
        if root != ROOT:
            self.env["PYTHONPATH"] = str(root)

    def flask(self, *args, check=True):
        done = subprocess.run([sys.executable, "-m", "flask", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=120)
        if check:
            assert done.returncode == 0, f"flask {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def gunicorn(self):
        return Gunicorn(self.env, workers=1, threads=4, root=self.root,
                        log_path=self.tmp_path / f"gunicorn-{self.root.name}.log").start()


@pytest.fixture
def database(pg_server):
    """An empty database of its own on the session's cluster."""
    name = f"upgrade_{uuid.uuid4().hex[:12]}"
    url = pg_server.createdb(name)
    yield url
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _balances(url):
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT user_id, balance_cents FROM user_balances").fetchall())


def _journal(url):
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT id, source, event_id, user_id, amount_cents, kind, payment_id, movement_id"
                            " FROM ledger_journal ORDER BY id").fetchall()


def _connected(evt):
    evt["account"] = ACCOUNT
    return evt


def _id(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


@pytest.mark.parametrize("commit", [RELEASE, LAST_1_0_0], ids=["tagged-1.0.0", "last-1.0.0-build"])
def test_a_ledger_made_by_release_1_0_0_upgrades_with_balances_kept_and_each_later_delivery_applied_once(
        commit, database, redis_server, tmp_path):
    settings = {"DATABASE_URL": database, "REDIS_URL": redis_server.url, "WEBHOOK_SIGNATURE_SCHEME": "stripe",
                "WEBHOOK_SECRET": SECRETS["stripe"]}
    old = Build(_tree(commit, tmp_path / commit[:7]), settings, tmp_path)
    today = Build(ROOT, settings, tmp_path)

    # -- release 1.0.0: its own init-db, users, bare links and deliveries ------------------------------------------
    assert "created the schema" in old.flask("init-db").stdout
    for user, cents in OPENING.items():
        old.flask("users", "add", str(user), "--opening", str(cents))
    old.flask("users", "link", "default", "cus_renews", str(BOB), "--by", "ops")  # 1.0 read it in any account
    old.flask("users", "link", "default", "cus_purged", str(BOB), "--by", "ops")
    bob_pi, purged_pi, paid_pi, disputed_pi = _id("pi"), _id("pi"), _id("pi"), _id("pi")
    refund_id, dispute_id = _id("re"), _id("du")
    server = old.gunicorn()
    try:
        # A connected account's payment credited by the customer's bare link, whose events are then purged.
        first = _connected(invoice_intent_succeeded(purged_pi, "cus_purged", cents=2500))
        assert deliver(server.base, first).json["status"] == "processed"
        old.flask("events", "purge", "--older-than", "0", "--force")
        released = [
            intent_succeeded(paid_pi, cents=5000),
            refund(refund_id, paid_pi, 1000),
            intent_succeeded(disputed_pi, cents=3000),
            dispute(dispute_id, disputed_pi, 3000, balance_transactions=[-3000]),
            _connected(invoice_intent_succeeded(bob_pi, "cus_renews", cents=4000)),
        ]
        for evt in released:
            answer = deliver(server.base, evt)
            assert (answer.status, answer.json.get("status")) == (200, "processed"), answer.json
    finally:
        server.stop()
    assert "consistent" in old.flask("ledger", "verify").stdout
    before = _balances(database)
    assert before == {ALICE: 1000 + 5000 - 1000 + 3000 - 3000, BOB: 2500 + 4000}
    journal = _journal(database)

    # -- today's init-db: balances and the journal as they were ---------------------------------------------------
    upgrade = today.flask("init-db", check=False)
    assert upgrade.returncode == 0 and "Traceback" not in upgrade.stderr, upgrade.stdout + upgrade.stderr
    assert "applied migration 005_connect_accounts.sql" in upgrade.stdout
    assert today.flask("init-db").stdout.startswith("schema up to date")
    assert _balances(database) == before
    # The journal is append-only: its rows as they were, and one row saying the move of the connected payment whose
    # events were kept (the purged one stays bare: nothing names its account).
    upgraded = _journal(database)
    assert upgraded[:len(journal)] == journal
    assert [row[2:] for row in upgraded[len(journal):]] == [
        (None, BOB, 0, "payment_moved", f"{ACCOUNT}/{bob_pi}", None)]
    journal = upgraded

    # -- today's deliveries: the released ones again, then the later ones, each twice ------------------------------
    renewal, purged_renewal, account_refund = _id("pi"), _id("pi"), _id("re")
    later = [
        _connected(refund(account_refund, bob_pi, 500)),  # the connected payment, keyed in its account by 005
        dispute(dispute_id, disputed_pi, 3000, event_type="charge.dispute.funds_reinstated", status="won",
                balance_transactions=[-3000, 3000]),
        _connected(invoice_intent_succeeded(renewal, "cus_renews", cents=1200)),  # its link copied into the account
        _connected(invoice_intent_succeeded(purged_renewal, "cus_purged", cents=2500)),  # 1.0's bare link, read
    ]
    server = today.gunicorn()
    try:
        for evt in released:
            answer = deliver(server.base, evt)
            assert (answer.status, answer.json.get("status")) == (200, "duplicate"), answer.json
        for evt in later:
            answer = deliver(server.base, evt)
            assert (answer.status, answer.json.get("status")) == (200, "processed"), answer.json
            assert deliver(server.base, evt).json["status"] == "duplicate"
    finally:
        server.stop()
    assert _balances(database) == {ALICE: before[ALICE] + 3000, BOB: before[BOB] - 500 + 1200 + 2500}
    rows = _journal(database)
    assert rows[:len(journal)] == journal
    assert sorted(row[2] for row in rows[len(journal):]) == sorted(evt["id"] for evt in later)  # each once
    verify = today.flask("ledger", "verify", check=False)
    assert verify.returncode == 0 and "consistent" in verify.stdout, verify.stdout + verify.stderr
