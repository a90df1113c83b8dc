"""money.sql's give_back, called as the application calls it: a spend (or a hold's capture) given back once by
its reference, in a journal row of its own that the change feed carries and `flask ledger verify` proves against
the spend it names; concurrent calls give back once. Real PostgreSQL."""

from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.rows import namedtuple_row

from app.store import verify
from app.store.ledger import Entry, GiveBackOutcome
from tests.application import call, hold
from tests.helpers import ALICE, BOB, assert_ledger_consistent, balance, db_url

pytestmark = pytest.mark.core


def give_back(conn, reference):
    return call(conn, "give_back", reference=reference)


def _give_backs(db):
    return db.execute("SELECT id, user_id, amount_cents, reference FROM ledger_journal WHERE kind = %s ORDER BY id",
                      [Entry.GIVE_BACK]).fetchall()


def test_a_give_back_returns_the_spends_amount_in_a_journal_row_of_its_own(db):
    call(db, "spend", user=ALICE, cents=300, reference="order-1")
    given = give_back(db, "order-1")
    assert (given.outcome, given.balance_cents) == (GiveBackOutcome.GIVEN_BACK, 1000)
    assert _give_backs(db) == [(given.journal_id, ALICE, 300, "order-1")]
    assert_ledger_consistent(db)


def test_a_second_give_back_returns_the_first_and_changes_nothing(db):
    call(db, "spend", user=ALICE, cents=300, reference="order-1")
    first = give_back(db, "order-1")
    again = give_back(db, "order-1")
    assert (again.outcome, again.journal_id, again.given_back_at, again.balance_cents) == \
        (GiveBackOutcome.DUPLICATE, first.journal_id, first.given_back_at, 1000)
    assert len(_give_backs(db)) == 1
    assert_ledger_consistent(db)


def test_a_captured_hold_is_given_back_as_its_spend(db):
    hold(db, ALICE, 400, "job-1")
    call(db, "capture_hold", reference="job-1", cents=250)
    assert give_back(db, "job-1").balance_cents == 1000
    assert_ledger_consistent(db)


def test_a_give_back_of_no_spend_is_refused_changing_nothing(db):
    hold(db, ALICE, 400, "job-1")  # a hold not captured spent nothing
    with pytest.raises(psycopg.errors.NoDataFound, match="no spend job-1"):
        give_back(db, "job-1")
    with pytest.raises(psycopg.errors.NoDataFound, match="no spend order-1"):
        give_back(db, "order-1")
    assert (_give_backs(db), balance(db, ALICE)) == ([], 1000)


def test_a_give_back_beyond_bigints_range_is_refused(db):
    call(db, "spend", user=BOB, cents=5, reference="order-1", allow_negative=True)
    for cents in (2**63 - 1, 1):  # 2**63 - 5 cents, then one more: giving 5 back would pass 2**63 - 1
        db.execute("SELECT adjust(p_user => %s, p_cents => %s, p_reason => 'top', p_actor => 't')", [BOB, cents])
    with pytest.raises(psycopg.errors.NumericValueOutOfRange, match="giving back 5 cents would overflow"):
        give_back(db, "order-1")


def test_concurrent_give_backs_of_one_spend_give_back_once(db):
    call(db, "spend", user=ALICE, cents=300, reference="order-1")

    def give_back_alone(_):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            return give_back(conn, "order-1").outcome

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(give_back_alone, range(8)))
    assert outcomes == [GiveBackOutcome.DUPLICATE] * 7 + [GiveBackOutcome.GIVEN_BACK]
    assert balance(db, ALICE) == 1000
    assert_ledger_consistent(db)


def test_the_change_feed_carries_a_give_back(db):
    spent = call(db, "spend", user=ALICE, cents=300, reference="order-1")
    given = give_back(db, "order-1")
    rows = db.cursor(row_factory=namedtuple_row).execute(
        "SELECT id, user_id, amount_cents, kind, reference FROM journal_changes(NULL, 100)").fetchall()
    assert [tuple(r) for r in rows] == [(spent.journal_id, ALICE, -300, Entry.SPEND, "order-1"),
                                        (given.journal_id, ALICE, 300, Entry.GIVE_BACK, "order-1")]


@pytest.mark.parametrize("forged, problem", [
    ("UPDATE ledger_journal SET amount_cents = 301 WHERE kind = 'give_back'",
     "gives back 301 cents to user {ALICE}: spend 'order-1' took 300 cents from user {ALICE}"),
    ("UPDATE ledger_journal SET user_id = '{BOB}' WHERE kind = 'give_back'",
     "gives back 300 cents to user {BOB}: spend 'order-1' took 300 cents from user {ALICE}"),
    ("UPDATE ledger_journal SET reference = 'order-2' WHERE kind = 'give_back'",
     "gives back 300 cents to user {ALICE}: no spend 'order-2'"),
], ids=["another-amount", "another-user", "no-spend"])
def test_verify_reports_a_give_back_that_is_not_its_spends(db, forged, problem):
    call(db, "spend", user=ALICE, cents=300, reference="order-1")
    given = give_back(db, "order-1")
    db.execute(forged.format(ALICE=ALICE, BOB=BOB))
    assert f"journal row {given.journal_id} (give_back) " + problem.format(ALICE=ALICE, BOB=BOB) in \
        verify.check(db).problems
