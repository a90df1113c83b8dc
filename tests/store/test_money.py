"""The money rule (money.sql): its SQL speaks the Python enums' words, both ways (the journal's kinds, and
those of adjust and spend, too); for any set of Stripe events of one payment (credits, running totals, refund
objects, disputes), delivered in any order and any number of times, the balance moves by what a small model of
the rule, written here, says that set is due; and each movement changes the balance once under concurrent
deliveries on two hosts, Redis flushed midway. Stripe's events are built and signed by stripe-python; real
PostgreSQL, Redis and gunicorn."""

import re
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.intake import events
from app.intake.events import Kind, State
from app.providers import stripe
from app.store.ledger import Change, Entry, GiveBackOutcome, HoldOutcome, HoldState, SpendOutcome, Status
from app.store.outcome import Outcome
from tests.helpers import ALICE, BOB, OPENING, assert_ledger_consistent, balance, send
from tests.providers.stripe.events import charge_refunded, dispute, intent_succeeded, refund, send_stripe, stripe_signed

pytestmark = pytest.mark.core

ROOT = Path(__file__).parents[2]
STRIPE = pytest.mark.parametrize("scheme", ["stripe"])


# -- the SQL's literals are the enums' values -------------------------------------

def _sql(path):
    """path's SQL without its comments (they quote literals too)."""
    return re.sub(r"--[^\n]*", "", (ROOT / path).read_text())


def _results(expression):
    """The literals an expression can take: itself, or each THEN and ELSE of its CASEs (not the WHENs' operands)."""
    return re.findall(r"(?:^|\bTHEN|\bELSE)\s*'(\w+)'", expression.strip())


def _assigned(sql, variable):
    """Every literal assigned to a PL/pgSQL variable (`variable := ...;`)."""
    return {value for expression in re.findall(rf"\b{variable}\s*:=\s*(.*?);", sql, re.DOTALL)
            for value in _results(expression)}


def _compared(sql, *columns):
    """Every literal a column or variable is compared with or set to (`x = '...'`, `CASE x WHEN '...'`)."""
    names = "|".join(columns)
    found = set(re.findall(rf"(?<![\w.])(?:\w+\.)?(?:{names})\s*=\s*'(\w+)'", sql))
    for whens in re.findall(rf"CASE\s+(?:{names})\s+((?:WHEN\s+'\w+'\s+THEN\s+.*?)+)(?:ELSE|END)", sql, re.DOTALL):
        found |= set(re.findall(r"WHEN\s+'(\w+)'", whens))
    return found


def _in_lists(text):
    """The literals of each `IN (...)` list in text."""
    return {value for values in re.findall(r"\bIN\s*\(([^)]*)\)", text) for value in re.findall(r"'(\w+)'", values)}


def _first(pattern, text, flags=0):
    """The first group of pattern's first match in text; "" when none (the test then names every value missing)."""
    match = re.search(pattern, text, flags)
    return match.group(1) if match else ""


def _table(sql, table):
    """The body of schema.sql's CREATE TABLE of table."""
    return _first(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\);", sql, re.DOTALL)


def _column_check(sql, table, column):
    """The literals a column's own CHECK (column IN (...)) allows."""
    return _in_lists(_first(rf"^\s*{column}\s[^\n]*(CHECK \({column} IN \([^)]*\)\))", _table(sql, table),
                            re.MULTILINE))


def _constraint(sql, table, name):
    """The text of a table's named CONSTRAINT (up to the next one, or the table's end)."""
    return _first(rf"CONSTRAINT {name}\b(.*?)(?:CONSTRAINT|$)", _table(sql, table), re.DOTALL)


def _functions(sql, *names):
    """The text of money.sql's CREATE OR REPLACE FUNCTIONs of these names (every overload)."""
    return "".join(re.findall(rf"CREATE OR REPLACE FUNCTION (?:{'|'.join(names)})\(.*?\$\$.*?\$\$;", sql, re.DOTALL))


def _without_functions(sql, *names):
    """sql without its CREATE OR REPLACE FUNCTIONs of these names."""
    return re.sub(rf"CREATE OR REPLACE FUNCTION (?:{'|'.join(names)})\(.*?\$\$.*?\$\$;", "", sql, flags=re.DOTALL)


def _inserted(sql, table, column):
    """The literals that sql's `INSERT INTO table (...) VALUES (...)` put in column."""
    found = set()
    for columns, values in re.findall(rf"INSERT INTO {table}\s*\(([^)]*)\)\s*VALUES\s*\((.*?)\)\s*(?:RETURNING|;)",
                                      sql, re.DOTALL):
        row = dict(zip([c.strip() for c in columns.split(",")], [v.strip() for v in values.split(",")], strict=True))
        found |= set(re.findall(r"^'(\w+)'$", row.get(column, "")))
    return found


def _webhook_event_statuses(sql):
    """The statuses money.sql gives or compares a webhook_events row's: its insert's CASE and `status = '...'`."""
    insert = _first(r"(INSERT INTO webhook_events.*?;)", sql, re.DOTALL)
    return set(re.findall(r"\b(?:THEN|ELSE)\s+'(\w+)'", insert)) | _compared(sql, "status", "v_status")


MONEY, SCHEMA = _sql("money.sql"), _sql("schema.sql")
# The functions that write the journal rows no event writes (and the holds), and the rule that events move money by.
# move_payment_to_account journals a move ('payment_moved'), as adjust and spend journal theirs.
APPLICATIONS = ("adjust", "spend", "place_hold", "lock_hold", "capture_hold", "release_hold", "release_expired_holds",
                "held_cents", "give_back")
ENTRIES, SPEND = _functions(MONEY, *APPLICATIONS, "move_payment_to_account"), _functions(MONEY, "spend")
HOLDS, GIVE_BACK = _functions(MONEY, "place_hold", "capture_hold", "release_hold"), _functions(MONEY, "give_back")
AVAILABLE = _first(r"(CREATE OR REPLACE VIEW user_available .*?;)", MONEY, re.DOTALL)
RULE = _without_functions(MONEY, *APPLICATIONS).replace(AVAILABLE, "")
ACCOUNTS = _first(r"(CREATE VIEW payment_accounts .*?;)", MONEY, re.DOTALL)
# What apply_event may answer; the other outcomes (in_progress, unavailable, ...) are decided before it.
APPLY_EVENT_OUTCOMES = {Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.FAILED, Outcome.PAYLOAD_MISMATCH,
                        Outcome.PAYMENT_MISMATCH, Outcome.IGNORED}
# Each: where the literals are, those found there, and the enum's values they must be, all of them.
LITERALS = {
    "outcomes": ("money.sql's outcomes (outcome := ...)", _assigned(RULE, "outcome"), APPLY_EVENT_OUTCOMES),
    "changes": ("money.sql's changes (change := ..., change = ...)",
                _assigned(RULE, "change") | _compared(RULE, "change"), set(Change)),
    "kinds": ("money.sql's kinds (ledger_delivery's kind, and movements' kind)", _compared(RULE, "kind"), set(Kind)),
    "movement-kinds": ("money.sql's payment_accounts, which sums movements by kind", _compared(ACCOUNTS, "kind"),
                       {Kind.REFUND, Kind.DISPUTE}),
    "movement-kinds-check": ("schema.sql's movements kind CHECK", _column_check(SCHEMA, "movements", "kind"),
                             {Kind.REFUND, Kind.DISPUTE}),
    "states": ("money.sql's states (ledger_delivery's state, movements' state)", _compared(RULE, "state"), set(State)),
    "states-check": ("schema.sql's movements state CHECK", _column_check(SCHEMA, "movements", "state"), set(State)),
    "statuses": ("money.sql's webhook_events statuses", _webhook_event_statuses(MONEY),
                 set(Status)),
    "statuses-check": ("schema.sql's webhook_events status CHECK", _column_check(SCHEMA, "webhook_events", "status"),
                       set(Status)),
    "journal-kinds": ("schema.sql's ledger_journal_kind_check",
                      _in_lists(_constraint(SCHEMA, "ledger_journal", "ledger_journal_kind_check"))
                      | _compared(_constraint(SCHEMA, "ledger_journal", "ledger_journal_kind_check"), "kind"),
                      (set(Change) - {Change.PAYMENT_DUPLICATE, Change.PAYMENT_USER_DISAGREED}) | set(Entry)),
    "entries": ("money.sql's adjust, spend and move_payment_to_account (the kinds they journal and look up)",
                _inserted(ENTRIES, "ledger_journal", "kind") | _compared(ENTRIES, "kind"), set(Entry)),
    "entries-names-check": ("schema.sql's ledger_journal_names_check",
                            _compared(_constraint(SCHEMA, "ledger_journal", "ledger_journal_names_check"), "kind"),
                            set(Entry)),
    "spend-outcomes": ("money.sql's spend's outcomes (outcome := ...)", _assigned(SPEND, "outcome"),
                       set(SpendOutcome)),
    "hold-outcomes": ("money.sql's holds' outcomes (outcome := ...)", _assigned(HOLDS, "outcome"), set(HoldOutcome)),
    "hold-states": ("money.sql's holds' states", _compared(ENTRIES + AVAILABLE, "state"), set(HoldState)),
    "hold-states-check": ("schema.sql's holds state CHECK", _column_check(SCHEMA, "holds", "state"), set(HoldState)),
    "give-back-outcomes": ("money.sql's give_back's outcomes (outcome := ...)", _assigned(GIVE_BACK, "outcome"),
                           set(GiveBackOutcome)),
}


@pytest.mark.unit
@pytest.mark.parametrize("literals", LITERALS)
def test_the_money_rules_sql_literals_are_the_python_enums_values_both_ways(literals):
    where, found, values = LITERALS[literals]
    unknown = sorted(found - {str(v) for v in values})
    missing = sorted({str(v) for v in values} - found)
    assert not unknown, f"{where}: {', '.join(map(repr, unknown))} in the SQL, but not a value of the Python enum"
    assert not missing, f"{where}: {', '.join(map(repr, missing))} is a value of the Python enum, but never in the SQL"


@pytest.mark.unit
def test_the_schemas_effect_version_default_is_the_rules_effect_version():
    defaults = re.findall(r"\beffect_version\s+SMALLINT\s+DEFAULT\s+(\d+)", SCHEMA)
    assert defaults == [str(events.EFFECT_VERSION)], \
        f"schema.sql's webhook_events.effect_version DEFAULT {defaults} is not events.EFFECT_VERSION = " \
        f"{events.EFFECT_VERSION}"


# -- any set of events, in any order ----------------------------------------------

REFUND_STATUSES = ["pending", "requires_action", "succeeded", "failed", "canceled"]
# Dispute events that carry the dispute but move no money.
DISPUTE_NEWS = ["charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed"]


def due(credited, totals, refunds, disputes):
    """What a payment's refunds and disputes take in all, by the rule of docs/design.md, from the SET of its
    events alone (written apart from money.sql): totals are the running totals seen; refunds maps each
    refund object to (amount, its statuses seen); disputes each dispute to (amount, its event types seen).

    A refund is counted once, and given back if any event saw it failed or canceled; the highest total takes
    what it says beyond the refund objects known (in any state: one refund announced both ways counts once);
    a dispute takes its amount if its funds were withdrawn and not reinstated; never more than the payment.
    """
    known = sum(amount for amount, _ in refunds.values())
    applied = sum(amount for amount, statuses in refunds.values() if not statuses & {"failed", "canceled"})
    withdrawn = sum(amount for amount, types in disputes.values()
                    if stripe.DISPUTE_FUNDS_WITHDRAWN in types and stripe.DISPUTE_FUNDS_REINSTATED not in types)
    return min(credited, applied + max(0, max(totals, default=0) - known) + withdrawn)


def _stripe_events_of_one_payment(data, intent_id):
    """Draw a payment and its events; return (its amount, its events, what the rule says they take)."""
    amount = data.draw(st.integers(1, 10_000), label="amount")
    cents = st.integers(1, amount)
    credits = [intent_succeeded(intent_id, user=BOB, cents=amount)
               for _ in range(data.draw(st.integers(1, 3), label="announcements"))]
    totals = data.draw(st.lists(cents, max_size=3), label="running totals")
    sent = credits + [charge_refunded(intent_id, total, cents=amount) for total in totals]
    refunds, disputes = {}, {}
    for n in range(data.draw(st.integers(0, 3), label="refund objects")):
        refund_id, refund_cents = f"re_{n}_{intent_id}", data.draw(cents, label=f"refund {n}")
        announcement = st.tuples(st.sampled_from(REFUND_STATUSES), st.sampled_from(stripe.REFUND_EVENTS))
        statuses = data.draw(st.lists(announcement, min_size=1, max_size=3), label=f"refund {n}'s events")
        sent += [refund(refund_id, intent_id, refund_cents, status, event_type) for status, event_type in statuses]
        refunds[refund_id] = (refund_cents, {status for status, _ in statuses})
    for n in range(data.draw(st.integers(0, 2), label="disputes")):
        dispute_id, dispute_cents = f"du_{n}_{intent_id}", data.draw(cents, label=f"dispute {n}")
        moves = data.draw(st.sets(st.sampled_from([stripe.DISPUTE_FUNDS_WITHDRAWN, stripe.DISPUTE_FUNDS_REINSTATED]),
                                  min_size=1), label=f"dispute {n}'s funds")
        news = data.draw(st.lists(st.sampled_from(DISPUTE_NEWS), max_size=2), label=f"dispute {n}'s news")
        sent += [dispute(dispute_id, intent_id, dispute_cents, event_type) for event_type in [*moves, *news]]
        disputes[dispute_id] = (dispute_cents, moves)
    return amount, sent, due(amount, totals, refunds, disputes)


@STRIPE
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_for_any_set_of_stripe_events_in_any_order_the_balance_moves_by_what_the_rule_says_is_due(client, db, data):
    amount, sent, taken = _stripe_events_of_one_payment(data, f"pi_{uuid.uuid4().hex[:24]}")
    # Each event delivered at least once, duplicates and reorders included.
    deliveries = data.draw(st.permutations(sent + data.draw(st.lists(st.sampled_from(sent), max_size=6))))
    before = balance(db, BOB)
    for evt in deliveries:
        response = send_stripe(client, evt)
        # 422: a movement before its payment's credit (unknown payment), which the provider retries.
        assert response.status in (200, 422), response.json
    for evt in sent:  # the provider retries what was refused before its payment
        response = send_stripe(client, evt)
        assert response.status == 200, response.json
    assert balance(db, BOB) - before == amount - taken
    assert_ledger_consistent(db)


# -- one movement, delivered concurrently on two hosts --------------------------------

PAID = 900  # the payment's amount
MOVED = 300  # the refund's or the dispute's


# The events that announce a refund counted (refund.failed aside).
ANNOUNCING = ("refund.created", "refund.updated", "charge.refund.updated")


def _a_refund(intent_id):
    return [], [refund("re_x", intent_id, MOVED, "succeeded", ANNOUNCING[n % 3]) for n in range(8)]


def _a_dispute_withdrawal(intent_id):
    return [], [dispute("du_x", intent_id, MOVED) for _ in range(8)]


def _a_refunds_failure(intent_id):
    return [refund("re_x", intent_id, MOVED, "succeeded")], \
        [refund("re_x", intent_id, MOVED, "failed", "refund.failed") for _ in range(8)]


# Each: what is delivered before (one at a time), the eight events delivered at once, the journal row that
# the eight must make once, and what the payment's user has after all.
MOVEMENTS = {
    "a-refund": (_a_refund, ("refund", "re_x", -MOVED), PAID - MOVED),
    "a-dispute-withdrawal": (_a_dispute_withdrawal, ("dispute_withdrawn", "du_x", -MOVED), PAID - MOVED),
    "a-refunds-failure": (_a_refunds_failure, ("refund_reversed", "re_x", MOVED), PAID),
}
ANSWERS = {(200, "processed"), (200, "duplicate"), (409, "in_progress"), (503, "unavailable")}


def _answer(status, body):
    return status, body.get("status") or body.get("error")


@STRIPE
@pytest.mark.parametrize("movement", MOVEMENTS)
def test_eight_concurrent_events_of_one_movement_on_two_hosts_with_redis_flushed_midway_move_money_once(
        gunicorn, db, redis_client, movement):
    hosts = [gunicorn(workers=2, threads=4), gunicorn(workers=1, threads=4)]
    events_of, journal_row, after = MOVEMENTS[movement]
    before, concurrent = events_of("pi_hosts")
    for evt in [intent_succeeded("pi_hosts", user=BOB, cents=PAID), *before]:
        assert _answer(*send(hosts[0].base, *stripe_signed(evt))[:2]) == (200, "processed")
    deliveries = [stripe_signed(evt) for evt in concurrent]
    assert len({evt.id for evt in concurrent}) == 8
    barrier = threading.Barrier(len(deliveries))

    def send_one(i):
        barrier.wait()
        if i == len(deliveries) // 2:
            redis_client.flushall()  # the lock's keys and the done markers, gone while the others run
        return send(hosts[i % 2].base, *deliveries[i])[:2]

    with ThreadPoolExecutor(len(deliveries)) as pool:
        answers = list(pool.map(send_one, range(len(deliveries))))
    retries = []
    for i, answer in enumerate(answers):
        while _answer(*answer) in {(409, "in_progress"), (503, "unavailable")}:  # the provider retries
            answer = send(hosts[i % 2].base, *deliveries[i])[:2]
            retries.append(answer)
        assert answer[0] == 200, answer
    outcomes = Counter(_answer(*answer) for answer in answers + retries)
    assert set(outcomes) <= ANSWERS, outcomes
    # And each once more, as a provider retrying after a timeout would: done, whatever Redis forgot.
    again = [_answer(*send(hosts[i % 2].base, *delivery)[:2]) for i, delivery in enumerate(deliveries)]
    assert again == [(200, "duplicate")] * len(deliveries)
    moved = db.execute("SELECT kind, movement_id, amount_cents FROM ledger_journal WHERE kind <> 'credit'"
                       " AND event_id = ANY(%s)", [[evt.id for evt in concurrent]]).fetchall()
    assert moved == [journal_row]
    assert balance(db, BOB) == OPENING[BOB] + after
    assert balance(db, ALICE) == OPENING[ALICE]
    assert_ledger_consistent(db)


@STRIPE
def test_a_refund_that_would_take_a_balance_below_bigint_is_422_on_every_retry_not_500(client, db):
    """Issue 44: the debit side of a reversal past BIGINT's maximum (test_money_sql.py has both): the provider's
    retry meets the same 422, naming the limit, and nothing moves."""
    pi = f"pi_{uuid.uuid4().hex[:16]}"
    assert send_stripe(client, intent_succeeded(pi, user=ALICE, cents=1000)).json["status"] == "processed"
    db.execute("UPDATE user_balances SET balance_cents = -9223372036854775808 + 100 WHERE user_id = %s", [ALICE])
    evt = refund(f"re_{pi}", pi, 300)
    for _ in range(2):
        response = send_stripe(client, evt)
        assert (response.status, response.json["error"]) == (422, "unprocessable")
        assert response.json["message"].endswith(
            f"refund of 300 cents would take the balance of user {ALICE} below -9223372036854775808 cents")
    assert balance(db, ALICE) == -9223372036854775808 + 100
    assert db.execute("SELECT count(*) FROM movements").fetchone() == (0,)
