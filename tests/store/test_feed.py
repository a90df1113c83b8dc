"""The change feed (money.sql's journal_changes and the notification at commit): every journal row once, after it
commits, a user's rows in the order their balance changed, for the consumer docs/operations.md prints, which
this module runs as printed; real PostgreSQL, writers on their own connections."""

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.rows import dict_row

from devservers import ROOT
from tests.helpers import ALICE, BOB, db_url

pytestmark = pytest.mark.core

WRITERS, WRITES = 4, 25  # rows written at once by each of four connections


def _consumer():
    """The consumer of docs/operations.md ("Following the journal"), as printed: its `follow`."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page[page.index("### Following the journal"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(code, "docs/operations.md", "exec"), namespace)  # noqa: S102 - the page's own code
    return namespace["follow"]


def _adjust(conn, user, cents=1, reason="feed test"):
    return conn.execute("SELECT journal_id FROM adjust(p_user => %s, p_cents => %s, p_reason => %s,"
                        " p_actor => 'test')", [user, cents, reason]).fetchone()[0]


def _changes(db, cursor=None, limit=1000):
    return db.cursor(row_factory=dict_row).execute("SELECT * FROM journal_changes(%s, %s)", [cursor, limit]).fetchall()


def _all_ids(db):
    return [row[0] for row in db.execute("SELECT id FROM ledger_journal ORDER BY id")]


def _read_all(db, cursor=None, limit=1000):
    """Every row the feed has now, from cursor, and the cursor after them."""
    rows = []
    while batch := _changes(db, cursor, limit):
        rows += batch
        cursor = batch[-1]["cursor"]
    return rows, cursor


def test_a_row_whose_transaction_commits_after_a_later_ids_is_read_once_it_commits(db):
    early = psycopg.connect(db_url(db))  # its row takes the lower id, and commits last
    try:
        first = _adjust(early, ALICE)
        with psycopg.connect(db_url(db)) as late:
            second = _adjust(late, BOB)
        assert second > first
        rows, cursor = _read_all(db)
        assert [row["id"] for row in rows] == [second]  # only what has committed
        # A poll "after the last id seen" would never see the first row: the feed does once it commits.
        early.commit()
        rows, cursor = _read_all(db, cursor)
        assert [row["id"] for row in rows] == [first]
        assert _read_all(db, cursor)[0] == []
    finally:
        early.close()


def test_a_users_rows_come_in_the_order_their_balance_changed(db):
    """The transaction that began first (the lower transaction id) waits for the user's row and commits second."""
    waiting = psycopg.connect(db_url(db))
    holding = psycopg.connect(db_url(db))
    try:
        waiting.execute("SELECT pg_current_xact_id()")  # its transaction id first
        held = _adjust(holding, ALICE, reason="holds the row")
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(_adjust, waiting, ALICE, 1, "waited for the row")
            db.execute("SELECT 1")  # let the waiter reach the lock
            holding.commit()
            waited = second.result(timeout=30)
        waiting.commit()
        rows, _ = _read_all(db)
        assert [row["id"] for row in rows if row["user_id"] == ALICE] == [held, waited]
    finally:
        waiting.close()
        holding.close()


def test_every_row_is_read_once_while_writers_commit(db):
    """Four writers on their own connections, each committing row by row, while the consumer follows."""
    follow, seen, done = _consumer(), [], threading.Event()

    def write(n):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            for i in range(WRITES):
                _adjust(conn, (ALICE, BOB)[(n + i) % 2], reason=f"writer {n} row {i}")

    def handle(row, conn):
        seen.append(row["id"])

    consumer = threading.Thread(target=follow, args=(db_url(db), None, handle),
                                kwargs={"batch": 7, "wake_every": 0.5, "running": lambda: not done.is_set()})
    consumer.start()
    try:
        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(write, range(WRITERS)))
        expected = _all_ids(db)
        assert len(expected) == WRITERS * WRITES
        deadline = threading.Event()
        for _ in range(600):  # until it has read them all (60 s at most)
            if len(seen) >= len(expected) or deadline.wait(0.1):
                break
    finally:
        done.set()
        consumer.join(timeout=30)
    assert sorted(seen) == expected  # each row, once
    assert len(seen) == len(set(seen))


def test_a_consumer_that_restarts_goes_on_after_its_stored_cursor(db):
    for i in range(10):
        _adjust(db, ALICE, reason=f"row {i}")
    ids = _all_ids(db)
    db.execute("CREATE TABLE consumer_state (cursor text, handled bigint[] NOT NULL)")
    db.execute("INSERT INTO consumer_state VALUES (NULL, '{}')")
    follow, crash_at = _consumer(), [ids[4]]

    def handle(row, conn):  # the application's work and its cursor, in one transaction
        conn.execute("UPDATE consumer_state SET cursor = %s, handled = handled || %s", [row["cursor"], row["id"]])
        if row["id"] in crash_at:
            raise KeyboardInterrupt  # the process dies here: this batch's transaction is rolled back

    with pytest.raises(KeyboardInterrupt):
        follow(db_url(db), None, handle, batch=3, wake_every=0.1)
    cursor, handled = db.execute("SELECT cursor, handled FROM consumer_state").fetchone()
    assert handled == ids[:3]  # the first batch committed; the second died at its second row

    crash_at.clear()
    passes = iter(range(100))  # a bound, should the consumer never get there

    def running():
        return next(passes, None) is not None and len(_handled(db)) < len(ids)

    follow(db_url(db), cursor, handle, batch=3, wake_every=0.1, running=running)
    assert _handled(db) == ids  # each once, in order


def _handled(db):
    return db.execute("SELECT handled FROM consumer_state").fetchone()[0]


@pytest.mark.parametrize("feed_notify", ["on", None])
def test_a_commit_that_writes_the_journal_notifies_listeners_where_the_database_says_so(db, feed_notify):
    if feed_notify:
        db.execute("SELECT set_config('webhook_ledger.feed_notify', %s, false)", [feed_notify])
    with psycopg.connect(db_url(db), autocommit=True) as listener:
        listener.execute("LISTEN ledger_journal")
        _adjust(db, ALICE)
        notified = list(listener.notifies(timeout=2 if feed_notify is None else 10, stop_after=1))
    assert [(n.channel, n.payload) for n in notified] == ([("ledger_journal", "")] if feed_notify else [])


@pytest.mark.parametrize("cursor", ["nonsense", "1:1:|1:1:", "x|y|1"])
def test_a_cursor_that_is_not_the_feeds_is_refused(db, cursor):
    with pytest.raises(psycopg.Error):
        _changes(db, cursor)
