"""The application's role, webhook_ledger_app, as `flask init-db` (money.sql) makes it: a login role granted it
may call each of the application's functions and read what it needs, and every direct write to a table of the
ledger is refused, as is a call of a function that writes as its caller (adjust, apply_event); a role not
granted it may call none of them. Real PostgreSQL."""

import re
import subprocess
import uuid

import psycopg
import pytest
from psycopg import sql

from devservers import ROOT
from tests.application import call, delivery, hold
from tests.helpers import ALICE, BOB, db_url

pytestmark = pytest.mark.core

APP_ROLE = "webhook_ledger_app"
CAROL = uuid.UUID("44444444-4444-4444-8444-444444444444")


@pytest.fixture
def login(db):
    """connect(granted): a connection as a new login role, granted webhook_ledger_app or not."""
    made = []

    def connect(granted=True, url=False):
        name = f"app_{uuid.uuid4().hex[:12]}"
        db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        if granted:
            db.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(APP_ROLE), sql.Identifier(name)))
        made.append(name)
        conninfo = db_url(db).replace(f"//{db.info.user}@", f"//{name}@")
        if url:
            return conninfo
        conn = psycopg.connect(conninfo, autocommit=True)
        assert conn.execute("SELECT current_user").fetchone() == (name,)
        made.append(conn)
        return conn

    yield connect
    for item in reversed(made):
        if isinstance(item, str):
            db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(item)))
        else:
            item.close()


def _tables(db):
    return [name for (name,) in db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")]


def test_the_role_may_call_each_of_the_applications_functions(login):
    app = login()
    assert call(app, "add_user", user=CAROL, opening=500).added is True
    assert call(app, "link_customer", source="default", customer="cus_1", user=CAROL, by="app").linked_at
    assert call(app, "spend", user=CAROL, cents=100, reference="order-1").outcome == "spent"
    assert call(app, "give_back", reference="order-1").outcome == "given_back"
    assert hold(app, CAROL, 300, "job-1").outcome == "held"
    assert tuple(call(app, "available_balance", user=CAROL)) == (500, 300, 200)
    assert call(app, "capture_hold", reference="job-1", cents=200).balance_cents == 300
    assert hold(app, CAROL, 50, "job-2").outcome == "held"
    assert call(app, "release_hold", reference="job-2").available_cents == 300
    rows = app.execute("SELECT kind, amount_cents FROM journal_changes(NULL, 10)").fetchall()
    assert rows == [("spend", -100), ("give_back", 100), ("spend", -200)]


def test_the_role_may_read_balances_the_journal_holds_and_available_balances(login, db):
    hold(db, ALICE, 300, "job-1")
    app = login()
    assert app.execute("SELECT count(*) FROM user_balances").fetchone() == (2,)
    assert app.execute("SELECT count(*) FROM ledger_journal").fetchone() == (0,)
    assert app.execute("SELECT reference FROM holds").fetchall() == [("job-1",)]
    assert app.execute("SELECT available_cents FROM user_available WHERE user_id = %s", [ALICE]).fetchone() == (700,)


def test_the_role_may_not_read_the_events(login):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        login().execute("SELECT count(*) FROM webhook_events")


@pytest.mark.parametrize("write", ["INSERT INTO {} DEFAULT VALUES", "UPDATE {} SET {} = {}", "DELETE FROM {}",
                                   "TRUNCATE {}"], ids=["insert", "update", "delete", "truncate"])
def test_every_direct_write_to_a_table_of_the_ledger_is_refused(login, db, write):
    hold(db, ALICE, 300, "job-1")
    app = login()
    tables = _tables(db)
    assert {"user_balances", "ledger_journal", "holds", "payments", "movements", "webhook_events"} <= set(tables)
    before = {table: db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
              for table in tables}
    refused = []
    for table in tables:
        (column,) = db.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                               " AND NOT attisdropped AND attidentity = '' ORDER BY attnum LIMIT 1",
                               [table]).fetchone()
        statement = sql.SQL(write).format(sql.Identifier(table), sql.Identifier(column), sql.Identifier(column))
        try:
            app.execute(statement)
        except psycopg.errors.InsufficientPrivilege as exc:
            refused.append((table, str(exc).split("\n")[0]))
    assert [table for table, _ in refused] == tables
    assert all(message == f"permission denied for table {table}" for table, message in refused), refused
    assert before == {table: db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
                      for table in tables}


def test_a_function_that_writes_as_its_caller_is_refused(login):
    app = login()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table user_balances"):
        app.execute("SELECT adjust(p_user => %s, p_cents => 5, p_reason => 'mine', p_actor => 'app')", [BOB])
    row = "ROW(" + ", ".join(f"%({name})s" for name in delivery("e", "credit", "p", 1)) + ")::ledger_delivery"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table"):
        app.execute(f"SELECT * FROM apply_event({row})", delivery("evt_forged", "credit", "pay_1", 10**6, user=BOB))


def test_a_role_not_granted_it_may_call_none_of_the_applications_functions(login, db):
    stranger = login(granted=False)
    names = ["add_user", "link_customer", "spend", "journal_changes", "available_balance", "place_hold",
             "capture_hold", "release_hold", "give_back"]
    functions = db.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE proname = ANY(%s)"
                           " AND pronamespace = current_schema()::regnamespace", [names]).fetchall()
    assert len(functions) == len(names)
    for (function,) in functions:
        assert stranger.execute("SELECT has_function_privilege(%s, 'EXECUTE')", [function]).fetchone() == (False,)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function spend"):
        call(stranger, "spend", user=ALICE, cents=1, reference="order-1")


def test_the_applications_functions_run_with_a_fixed_search_path(db):
    configs = db.execute("SELECT proname, prosecdef, proconfig FROM pg_proc WHERE proname IN ('spend', 'place_hold')"
                         " AND pronamespace = current_schema()::regnamespace ORDER BY proname").fetchall()
    schema = db.execute("SELECT current_schema()").fetchone()[0]
    assert configs == [("place_hold", True, [f"search_path={schema}, pg_temp"]),
                       ("spend", True, [f"search_path={schema}, pg_temp"])]


def test_the_operations_pages_psql_session_runs_as_the_role(login, db):
    """docs/operations.md's connection of an application in another language: its three calls, as printed, with
    the test's connection string (the role's, without the password the test cluster does not ask for)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page[page.index("### The application's role"):]
    script = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    psql = f'psql --no-psqlrc --quiet --tuples-only --no-align "{login(url=True)}"'
    script = re.sub(r'psql "postgresql://[^"]+"', psql, script)
    done = subprocess.run(["bash", "-c", "set -o pipefail; " + script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (user,) = db.execute("SELECT user_id FROM user_keys WHERE app_key = '4217'").fetchone()
    assert done.stdout.split() == [f"{user}|t", "held|1500", "captured|1680"]
    assert db.execute("SELECT kind, amount_cents, reference FROM ledger_journal").fetchall() == \
        [("spend", -320, "job-81")]
