"""money.sql's holds, called as the application calls them: place_hold reserves credit (the available balance
is the balance less the active holds, and spend and place_hold are bounded by it), capture_hold spends what the
work cost (one spend journal row, the rest freed), release_hold frees it, and a hold past its expiry counts for
nothing when read; each idempotent by the application's reference; refunds and disputes are never blocked by
holds, and a capture racing them takes the locks in the documented order (no deadlock). Real PostgreSQL."""

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.rows import namedtuple_row

from app.store import verify
from app.store.ledger import Entry, HoldOutcome, HoldState
from devservers import wait_until
from tests.application import available, call, credit, dispute, hold, refund
from tests.helpers import ALICE, BOB, UNKNOWN_USER, assert_ledger_consistent, balance, db_url, samples

pytestmark = pytest.mark.core


def assert_verified(db):
    """`flask ledger verify`'s checks clean (the SQL-made deliveries here have no provider's bytes to read)."""
    assert verify.check(db).problems == []


def capture(conn, reference, cents, **options):
    return call(conn, "capture_hold", reference=reference, cents=cents, **options)


def release(conn, reference):
    return call(conn, "release_hold", reference=reference)


def expire(conn, reference):
    """Time passes: the hold's expiry is now behind (what a clock would do; the owner's write, not the app's)."""
    conn.execute("UPDATE holds SET expires_at = now() - interval '1 microsecond' WHERE reference = %s", [reference])


def _hold(conn, reference):
    return conn.cursor(row_factory=namedtuple_row).execute(
        "SELECT * FROM holds WHERE reference = %s", [reference]).fetchone()


def _spends(conn):
    return conn.execute("SELECT user_id, amount_cents, reference FROM ledger_journal WHERE kind = %s ORDER BY id",
                        [Entry.SPEND]).fetchall()


# -- place ------------------------------------------------------------------------

def test_a_hold_takes_its_amount_from_the_available_balance_not_the_balance(db):
    placed = hold(db, ALICE, 400, "job-1")
    assert (placed.outcome, placed.available_cents) == (HoldOutcome.HELD, 600)
    assert tuple(available(db, ALICE)) == (1000, 400, 600)
    assert balance(db, ALICE) == 1000
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone() == (0,)  # no money moved
    assert_ledger_consistent(db)


def test_a_hold_beyond_the_available_balance_is_refused(db):
    hold(db, ALICE, 600, "job-1")
    with pytest.raises(psycopg.errors.CheckViolation, match=f"the available balance of user {ALICE} is 400 cents "
                                                            r"\(600 cents held\): holding 401 would take it below"):
        hold(db, ALICE, 401, "job-2")
    assert hold(db, ALICE, 400, "job-2").available_cents == 0


def test_a_hold_allowed_below_zero_takes_the_available_balance_below_zero(db):
    assert hold(db, BOB, 300, "job-1", allow_negative=True).available_cents == -300
    assert tuple(available(db, BOB)) == (0, 300, -300)


def test_a_spend_is_bounded_by_the_available_balance(db):
    hold(db, ALICE, 600, "job-1")
    with pytest.raises(psycopg.errors.CheckViolation, match=f"the available balance of user {ALICE} is 400 cents "
                                                            r"\(600 cents held\): spending 401"):
        call(db, "spend", user=ALICE, cents=401, reference="order-1")
    assert call(db, "spend", user=ALICE, cents=400, reference="order-1").balance_cents == 600


def test_a_second_hold_with_the_same_reference_returns_the_first(db):
    first = hold(db, ALICE, 400, "job-1")
    again = hold(db, ALICE, 400, "job-1", expires_at=first.expires_at)
    assert (again.outcome, again.expires_at, again.available_cents) == (HoldOutcome.DUPLICATE, first.expires_at, 600)
    assert db.execute("SELECT count(*) FROM holds").fetchone() == (1,)


def test_the_user_view_of_available_balances_reads_every_user(db):
    hold(db, ALICE, 250, "job-1")
    assert db.execute("SELECT user_id, balance_cents, held_cents, available_cents FROM user_available"
                      " ORDER BY user_id").fetchall() == [(ALICE, 1000, 250, 750), (BOB, 0, 0, 0)]


# -- capture and release ----------------------------------------------------------

def test_a_capture_spends_what_the_work_cost_and_frees_the_rest(db):
    hold(db, ALICE, 400, "job-1")
    captured = capture(db, "job-1", 150)
    assert (captured.outcome, captured.balance_cents) == (HoldOutcome.CAPTURED, 850)
    assert _spends(db) == [(ALICE, -150, "job-1")]
    row = _hold(db, "job-1")
    assert (row.state, row.captured_cents, row.journal_id, row.closed_at) == \
        (HoldState.CAPTURED, 150, captured.journal_id, captured.captured_at)
    assert tuple(available(db, ALICE)) == (850, 0, 850)
    assert_ledger_consistent(db)


def test_a_second_capture_of_the_same_amount_returns_the_first(db):
    hold(db, ALICE, 400, "job-1")
    first = capture(db, "job-1", 400)
    again = capture(db, "job-1", 400)
    assert (again.outcome, again.journal_id, again.captured_at, again.balance_cents) == \
        (HoldOutcome.DUPLICATE, first.journal_id, first.captured_at, 600)
    assert len(_spends(db)) == 1


def test_a_release_frees_the_hold_and_takes_nothing(db):
    hold(db, ALICE, 400, "job-1")
    assert tuple(release(db, "job-1")) == (HoldOutcome.RELEASED, 1000)
    assert tuple(release(db, "job-1")) == (HoldOutcome.DUPLICATE, 1000)
    assert (_hold(db, "job-1").state, balance(db, ALICE), _spends(db)) == (HoldState.RELEASED, 1000, [])


def test_an_expired_hold_counts_for_nothing_and_cannot_be_captured(db):
    hold(db, ALICE, 400, "job-1")
    expire(db, "job-1")
    assert tuple(available(db, ALICE)) == (1000, 0, 1000)
    assert hold(db, ALICE, 1000, "job-2").available_cents == 0
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="hold job-1 expired at"):
        capture(db, "job-1", 100)
    assert release(db, "job-1").outcome == HoldOutcome.RELEASED  # closing it is tidying only


def test_tidying_releases_the_expired_holds_only(db):
    for reference in ("job-1", "job-2", "job-3"):
        hold(db, ALICE, 100, reference)
    expire(db, "job-1")
    expire(db, "job-2")
    capture(db, "job-3", 100)
    assert db.execute("SELECT * FROM release_expired_holds()").fetchone() == (2,)
    assert db.execute("SELECT reference, state FROM holds ORDER BY reference").fetchall() == [
        ("job-1", HoldState.RELEASED), ("job-2", HoldState.RELEASED), ("job-3", HoldState.CAPTURED)]


def test_a_refund_takes_held_credit_and_a_capture_then_cannot_take_the_balance_below_zero(db):
    db.execute("UPDATE user_balances SET balance_cents = 0, opening_balance_cents = 0 WHERE user_id = %s", [BOB])
    credit(db, "evt_paid", BOB, 500, "pay_1")
    hold(db, BOB, 500, "job-1")
    assert refund(db, "evt_refund", "pay_1", 300, "re_1").outcome == "processed"  # not blocked by the hold
    assert tuple(available(db, BOB)) == (200, 500, -300)
    with pytest.raises(psycopg.errors.CheckViolation, match=f"the balance of user {BOB} is 200 cents: capturing 500"):
        capture(db, "job-1", 500)
    assert capture(db, "job-1", 200).balance_cents == 0
    assert_verified(db)


def test_a_capture_allowed_below_zero_takes_the_balance_below_zero(db):
    hold(db, BOB, 300, "job-1", allow_negative=True)
    assert capture(db, "job-1", 300, allow_negative=True).balance_cents == -300
    assert_ledger_consistent(db)


# -- refusals ---------------------------------------------------------------------

# Each: the calls made before (function, arguments), the refused call, its error and message.
REFUSALS = {
    "zero": ([], ("place_hold", {"user": ALICE, "cents": 0, "reference": "job-1"}),
             psycopg.errors.InvalidParameterValue, "a hold of 0 cents: the amount must be positive"),
    "empty-reference": ([], ("place_hold", {"user": ALICE, "cents": 5, "reference": ""}),
                        psycopg.errors.InvalidParameterValue, "reference must be 1 to 128 characters"),
    "long-reference": ([], ("place_hold", {"user": ALICE, "cents": 5, "reference": "r" * 129}),
                       psycopg.errors.InvalidParameterValue, "reference must be 1 to 128 characters"),
    "expired-already": ([], ("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1", "expires_in": "-1 s"}),
                        psycopg.errors.InvalidParameterValue, "a hold must expire after now"),
    "unknown-user": ([], ("place_hold", {"user": UNKNOWN_USER, "cents": 5, "reference": "job-1"}),
                     psycopg.errors.NoDataFound, f"unknown user {UNKNOWN_USER}"),
    "another-amount": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                       ("place_hold", {"user": ALICE, "cents": 6, "reference": "job-1"}),
                       psycopg.errors.UniqueViolation, "reference job-1 was held with another user, amount or expiry"),
    "another-user": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                     ("place_hold", {"user": BOB, "cents": 5, "reference": "job-1", "allow_negative": True}),
                     psycopg.errors.UniqueViolation, "reference job-1 was held with another user"),
    "a-spends-reference": ([("spend", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                           ("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"}),
                           psycopg.errors.UniqueViolation, "reference job-1 was spent"),
    "spend-of-a-holds-reference": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                                   ("spend", {"user": ALICE, "cents": 5, "reference": "job-1"}),
                                   psycopg.errors.UniqueViolation, "reference job-1 is a hold's"),
    "capture-no-hold": ([], ("capture_hold", {"reference": "job-1", "cents": 5}),
                        psycopg.errors.NoDataFound, "no hold job-1"),
    "capture-zero": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                     ("capture_hold", {"reference": "job-1", "cents": 0}),
                     psycopg.errors.InvalidParameterValue, "a capture of 0 cents: the amount must be positive"),
    "capture-more-than-held": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"})],
                               ("capture_hold", {"reference": "job-1", "cents": 6}),
                               psycopg.errors.InvalidParameterValue,
                               "a capture of 6 cents is more than hold job-1's 5"),
    "capture-another-amount": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"}),
                                ("capture_hold", {"reference": "job-1", "cents": 4})],
                               ("capture_hold", {"reference": "job-1", "cents": 5}),
                               psycopg.errors.UniqueViolation, "hold job-1 was captured for 4 cents, not 5"),
    "capture-released": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"}),
                          ("release_hold", {"reference": "job-1"})],
                         ("capture_hold", {"reference": "job-1", "cents": 5}),
                         psycopg.errors.ObjectNotInPrerequisiteState, "hold job-1 was released"),
    "release-captured": ([("place_hold", {"user": ALICE, "cents": 5, "reference": "job-1"}),
                          ("capture_hold", {"reference": "job-1", "cents": 5})],
                         ("release_hold", {"reference": "job-1"}),
                         psycopg.errors.ObjectNotInPrerequisiteState, "hold job-1 was captured"),
    "release-no-hold": ([], ("release_hold", {"reference": "job-1"}), psycopg.errors.NoDataFound, "no hold job-1"),
}


def _make(conn, function, arguments):
    arguments = dict(arguments)
    if function == "place_hold":
        return hold(conn, **arguments)
    return call(conn, function, **arguments)


def _state(db):
    """Every balance, every hold and every journal row."""
    return (db.execute("SELECT user_id, balance_cents FROM user_balances ORDER BY user_id").fetchall(),
            db.execute("SELECT * FROM holds ORDER BY reference").fetchall(),
            db.execute("SELECT * FROM ledger_journal ORDER BY id").fetchall())


@pytest.mark.parametrize("made, refused, error, message", REFUSALS.values(), ids=REFUSALS)
def test_a_refused_hold_call_raises_its_sqlstate_and_changes_nothing(db, made, refused, error, message):
    for function, arguments in made:
        _make(db, function, arguments)
    before = _state(db)
    with pytest.raises(error, match=message):
        _make(db, *refused)
    assert _state(db) == before


# -- concurrency: real connections ------------------------------------------------

def test_concurrent_holds_never_reserve_more_than_the_available_balance(db):
    def hold_alone(n):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            try:
                return hold(conn, ALICE, 300, f"job-{n}").outcome
            except psycopg.errors.CheckViolation:
                return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(hold_alone, range(8)))
    assert outcomes == [HoldOutcome.HELD] * 3 + ["refused"] * 5
    assert tuple(available(db, ALICE)) == (1000, 900, 100)


def test_concurrent_captures_of_one_hold_spend_once(db):
    hold(db, ALICE, 300, "job-1")

    def capture_alone(_):
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            return capture(conn, "job-1", 200).outcome

    with ThreadPoolExecutor(8) as pool:
        outcomes = sorted(pool.map(capture_alone, range(8)))
    assert outcomes == [HoldOutcome.CAPTURED] + [HoldOutcome.DUPLICATE] * 7
    assert (balance(db, ALICE), _spends(db)) == (800, [(ALICE, -200, "job-1")])


def _started_waiting(db, query_like):
    """Whether another connection is waiting for a lock in a query like query_like."""
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                      [query_like]).fetchone()[0] > 0


def _in_thread(work):
    """Run work() in a thread; return a function that joins it and returns (or raises) what it did."""
    done = {}

    def run():
        try:
            done["value"] = work()
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            done["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()

    def join():
        thread.join()
        if "error" in done:
            raise done["error"]
        return done["value"]
    return join


def _connect_and(db, work):
    def run():
        with psycopg.connect(db_url(db), autocommit=True) as conn:
            return work(conn)
    return _in_thread(run)


def _wait_for(db, query_like):
    wait_until(lambda: _started_waiting(db, query_like), what=f"a call of {query_like} waiting for a lock")


def test_a_refund_and_a_dispute_wait_for_a_capture_and_then_apply(db):
    """The capture holds the user's row (and the hold's); the refund and the dispute hold their payments' rows
    and wait for the user's: in the documented order, nobody waits in a circle."""
    credit(db, "evt_paid_1", ALICE, 400, "pay_1")
    credit(db, "evt_paid_2", ALICE, 400, "pay_2")
    hold(db, ALICE, 1500, "job-1")
    with psycopg.connect(db_url(db)) as app:
        assert capture(app, "job-1", 1500).outcome == HoldOutcome.CAPTURED  # its transaction stays open
        refunded = _connect_and(db, lambda conn: refund(conn, "evt_refund", "pay_1", 400, "re_1"))
        disputed = _connect_and(db, lambda conn: dispute(conn, "evt_dispute", "pay_2", 400, "dp_1"))
        _wait_for(db, "%apply_event%")
        app.commit()
    assert (refunded().outcome, disputed().outcome) == ("processed", "processed")
    assert balance(db, ALICE) == 1800 - 1500 - 800
    assert_verified(db)


def test_a_capture_waits_for_a_refund_and_a_dispute_and_sees_what_they_took(db):
    credit(db, "evt_paid_1", ALICE, 400, "pay_1")
    credit(db, "evt_paid_2", ALICE, 400, "pay_2")
    hold(db, ALICE, 1500, "job-1")
    with psycopg.connect(db_url(db)) as refunds:
        refund(refunds, "evt_refund", "pay_1", 400, "re_1")
        dispute(refunds, "evt_dispute", "pay_2", 400, "dp_1")  # both hold ALICE's row until commit
        captured = _connect_and(db, lambda conn: capture(conn, "job-1", 1500))
        _wait_for(db, "%capture_hold%")
        refunds.commit()
    with pytest.raises(psycopg.errors.CheckViolation, match=f"the balance of user {ALICE} is 1000 cents: capturing"):
        captured()
    assert balance(db, ALICE) == 1000
    assert_verified(db)


def test_captures_refunds_and_disputes_on_one_user_never_deadlock(db):
    """Many rounds of a capture, a refund and a dispute of one user, each from its own connection at once:
    every call returns (none is chosen as a deadlock's victim), and the ledger adds up."""
    rounds = 20
    for n in range(rounds):
        credit(db, f"evt_paid_r{n}", ALICE, 100, f"pay_r{n}")
        credit(db, f"evt_paid_d{n}", ALICE, 100, f"pay_d{n}")
        hold(db, ALICE, 40, f"job-{n}")

    def race(n):
        calls = [lambda conn: capture(conn, f"job-{n}", 40),
                 lambda conn: refund(conn, f"evt_refund_{n}", f"pay_r{n}", 100, f"re_{n}"),
                 lambda conn: dispute(conn, f"evt_dispute_{n}", f"pay_d{n}", 100, f"dp_{n}")]
        barrier = threading.Barrier(len(calls))

        def one(work):
            with psycopg.connect(db_url(db), autocommit=True) as conn:
                barrier.wait()
                return work(conn)

        with ThreadPoolExecutor(len(calls)) as pool:
            return [r.outcome for r in pool.map(one, calls)]

    for n in range(rounds):
        assert race(n) == [HoldOutcome.CAPTURED, "processed", "processed"]
    assert balance(db, ALICE) == 1000 + rounds * (200 - 40 - 200)
    assert_verified(db)


def test_a_refused_capture_inside_the_applications_transaction_leaves_the_hold(db):
    hold(db, ALICE, 300, "job-1")
    with psycopg.connect(db_url(db)) as app, contextlib.suppress(psycopg.errors.InvalidParameterValue):
        capture(app, "job-1", 301)
    assert _hold(db, "job-1").state == HoldState.HELD


def test_metrics_show_the_active_holds_what_they_reserve_and_the_expired_open_ones(client, db):
    hold(db, ALICE, 300, "job-1")
    hold(db, ALICE, 200, "job-2")
    hold(db, ALICE, 100, "job-3")
    expire(db, "job-3")
    capture(db, "job-2", 50)
    scraped = samples(client.get("/metrics").get_data(as_text=True))
    assert (scraped[("webhook_ledger_holds_active", ())], scraped[("webhook_ledger_holds_active_cents", ())],
            scraped[("webhook_ledger_holds_expired_open", ())]) == (1, 300, 1)


def test_verify_reports_a_capture_that_is_not_its_holds_spend(db):
    hold(db, ALICE, 300, "job-1")
    captured = capture(db, "job-1", 200)
    db.execute("UPDATE holds SET captured_cents = 250 WHERE reference = 'job-1'")
    assert f"hold 'job-1' of user {ALICE}: captured 250 cents in journal row {captured.journal_id}, its reference " \
           f"has spend row {captured.journal_id} of 200 cents from user {ALICE}" in verify.check(db).problems


def test_verify_reports_a_spend_of_a_hold_not_captured(db):
    hold(db, ALICE, 300, "job-1")
    db.execute("INSERT INTO ledger_journal (kind, user_id, amount_cents, reference) VALUES ('spend', %s, -5, 'job-1')",
               [ALICE])
    (spend_id,) = db.execute("SELECT id FROM ledger_journal WHERE reference = 'job-1'").fetchone()
    assert f"hold 'job-1' of user {ALICE} is held, but its reference has spend row {spend_id} of 5 cents from user " \
           f"{ALICE}" in verify.check(db).problems


def test_metrics_under_gunicorns_multiprocess_mode_show_the_holds_too(client, db, monkeypatch, tmp_path):
    """A worker's scrape (PROMETHEUS_MULTIPROC_DIR set) registers each collector that reads PostgreSQL itself."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    hold(db, ALICE, 300, "job-1")
    scraped = samples(client.get("/metrics").get_data(as_text=True))
    assert (scraped[("webhook_ledger_holds_active", ())], scraped[("webhook_ledger_holds_active_cents", ())],
            scraped[("webhook_ledger_holds_expired_open", ())]) == (1, 300, 0)
