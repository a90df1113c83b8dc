"""`flask reconcile` (app/commands/reconcile.py, app/providers/stripe/api.py): lost deliveries recovered from Stripe's
event list, applied exactly once beside live deliveries, retries and other runs. The real stripe-python talks over
HTTP to devservers/stripe_stand_in.py, Stripe's List Events on loopback; nothing is mocked."""

import gc
import itertools
import os
import signal
import statistics
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.commands import reconcile as reconcile_module
from app.settings import config as config_module
from devservers import ROOT, wait_until
from devservers.stripe_stand_in import API_KEY, StripeStandIn
from tests.helpers import ALICE, BOB, OPENING, assert_ledger_consistent, balance, scrape
from tests.providers.stripe.events import charge_refunded, dispute, intent_succeeded, refund, send_stripe

pytestmark = pytest.mark.core

DAY = 86400


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


def at(evt, seconds_ago):
    """evt, created seconds_ago."""
    evt["created"] = int(time.time()) - seconds_ago
    return evt


def payments(count, span=2 * DAY, user=ALICE, cents=10, prefix="pi"):
    """count payment_intent.succeeded events spread over the last span seconds, oldest first."""
    return [at(intent_succeeded(f"{prefix}_{n:05d}", user=user, cents=cents), span - span * n // count + 60)
            for n in range(count)]


def run(app, *args):
    return app.test_cli_runner().invoke(args=["reconcile", "default", *args])


def runs(db):
    return db.execute("SELECT status, pages, listed, applied, duplicates, refused FROM reconcile_runs"
                      " ORDER BY id").fetchall()


def origins(db):
    return dict(db.execute("SELECT origin, count(*) FROM webhook_events GROUP BY origin").fetchall())


def flask_env(config):
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **{name: str(v) for name, v in config.items()}}


def _a_gap(client, db, stand_in):
    """Of 240 events over two days, the first 80 were delivered; then the endpoint was down."""
    events = payments(240)
    stand_in.add(*events)
    for evt in events[:80]:
        assert send_stripe(client, evt).json["status"] == "processed"
    assert balance(db) == OPENING[ALICE] + 80 * 10


def test_a_run_applies_only_the_events_whose_deliveries_were_lost(app, client, db, stand_in):
    _a_gap(client, db, stand_in)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert "240 listed: 160 applied (recovered: their deliveries were lost), 80 duplicates, 0 refused" \
        in result.output
    assert balance(db) == OPENING[ALICE] + 240 * 10
    assert origins(db) == {"delivery": 80, "reconcile": 160}
    assert runs(db) == [("completed", 3, 240, 160, 80, 0)]
    assert_ledger_consistent(db)
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0 and "ledger consistent" in verified.output, verified.output


def test_a_second_run_over_a_recovered_gap_applies_nothing(app, client, db, stand_in):
    _a_gap(client, db, stand_in)
    assert run(app).exit_code == 0
    again = run(app)
    assert again.exit_code == 0, again.output
    assert balance(db) == OPENING[ALICE] + 240 * 10
    assert runs(db)[-1][3] == 0  # nothing applied twice


def test_more_than_a_hundred_events_in_the_same_second_across_page_boundaries_each_apply_once(app, db, stand_in):
    now = int(time.time())
    events = [intent_succeeded(f"pi_same_{n:03d}", cents=1) for n in range(250)]
    for evt in events:
        evt["created"] = now - 30  # one second for all: the cursor, not the time, separates pages
    stand_in.add(*events)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert runs(db) == [("completed", 3, 250, 250, 0, 0)]
    assert balance(db) == OPENING[ALICE] + 250
    assert db.execute("SELECT count(DISTINCT event_id) FROM webhook_events").fetchone()[0] == 250
    # Stripe's own limit, pages walked by cursor: the first pass newest first, the second oldest first.
    assert {request["limit"] for request in stand_in.requests} == {"100"}
    assert any("ending_before" in request for request in stand_in.requests)


def test_a_second_event_object_for_one_payment_intent_credits_once(app, db, stand_in):
    first = at(intent_succeeded("pi_twice", cents=300), 600)
    second = at(intent_succeeded("pi_twice", cents=300), 500)  # another Event object, another id
    stand_in.add(first, second)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert balance(db) == OPENING[ALICE] + 300
    assert runs(db) == [("completed", 1, 2, 1, 1, 0)]
    assert_ledger_consistent(db)


def _movements_of_one_payment(app, stand_in):
    """A payment's refunds and disputes, and a refund of a payment outside the window; one run over them."""
    stand_in.add(
        at(intent_succeeded("pi_r", user=BOB, cents=1000), 900),
        at(refund("re_1", "pi_r", 200, event_type="refund.created"), 800),
        at(charge_refunded("pi_r", 200, cents=1000), 790),  # the same refund as a running total: once
        at(dispute("du_1", "pi_r", 300), 700),
        at(dispute("du_1", "pi_r", 300, event_type="charge.dispute.funds_reinstated", status="won"), 600),
        at(refund("re_2", "pi_r", 100, "failed"), 500),  # first seen failed: nets zero
        at(refund("re_lost", "pi_outside", 50, event_type="refund.created"), 400),
    )
    result = run(app)
    assert result.exit_code == 0, result.output
    return result


def test_refunds_and_disputes_apply_after_their_payment(app, db, stand_in):
    _movements_of_one_payment(app, stand_in)
    assert balance(db, BOB) == 1000 - 200
    # status, pages, listed, applied, duplicates: the seventh event is the refused one
    assert [row[:5] for row in runs(db)] == [("completed", 1, 7, 6, 0)]
    assert_ledger_consistent(db)


def test_a_refund_of_a_payment_outside_the_window_is_refused(app, db, stand_in):
    result = _movements_of_one_payment(app, stand_in)
    assert "refused" in result.output and "unknown payment pi_outside" in result.output
    assert db.execute("SELECT status, last_error FROM webhook_events_json WHERE payload->'data'->'object'->>'id' ="
                      " 're_lost'").fetchone() == ("failed", "unknown payment pi_outside")
    assert [row[5] for row in runs(db)] == [1]  # refused


def test_a_listed_event_with_ids_of_255_characters_is_applied_and_one_of_256_is_not_stored(app, db, stand_in):
    """Stripe's ids may be 255 characters long (docs/providers/stripe.md): a delivery of one over is refused 400, and so
    the run does not store it."""
    longest = at(intent_succeeded("pi_" + "7" * 252, cents=40, event_id="evt_" + "7" * 251), 600)
    over = at(intent_succeeded("pi_over", cents=50, event_id="evt_" + "8" * 252), 500)
    stand_in.add(longest, over)
    result = run(app)
    assert "'id' must be 1 to 255 characters" in result.output, result.output
    assert balance(db) == OPENING[ALICE] + 40
    assert db.execute("SELECT event_id FROM webhook_events").fetchall() == [(longest.id,)]
    assert [row[3:] for row in runs(db)] == [(1, 0, 1)]  # applied, duplicates, refused


def test_a_listed_event_stored_before_with_another_effect_is_refused_and_kept_as_stored(app, client, db, stand_in):
    """A payload mismatch leaves the stored event completed: the summary says so, not 'recorded failed'."""
    delivered = intent_succeeded("pi_kept", cents=300)
    assert send_stripe(client, delivered).json["status"] == "processed"
    listed = at(intent_succeeded("pi_kept", cents=500, event_id=delivered["id"]), 60)
    stand_in.add(listed)
    result = run(app)
    assert f"refused {delivered['id']} (payment_intent.succeeded): payload_mismatch: stored before with another " \
           "effect, which it keeps (not recorded failed" in result.output, result.output
    assert "recorded failed unless its line says otherwise" in result.output
    assert db.execute("SELECT status FROM webhook_events WHERE event_id = %s", [delivered["id"]]).fetchone() == \
        ("completed",)
    assert balance(db) == OPENING[ALICE] + 300


def test_a_refund_listed_before_its_payment_in_the_same_second_is_applied_at_the_end(app, db, stand_in):
    now = int(time.time()) - 60
    refund_first = refund("re_early", "pi_same", 40, event_type="refund.created")
    payment = intent_succeeded("pi_same", user=BOB, cents=100)
    refund_first["created"] = payment["created"] = now
    stand_in.add(refund_first, payment)  # the list's order within one second is Stripe's, not ours
    result = run(app)
    assert result.exit_code == 0, result.output
    assert balance(db, BOB) == 60
    assert runs(db) == [("completed", 1, 2, 2, 0, 0)]


def held_at_each_applied_page(stand_in, action):
    """The memory Python held, garbage collected, when each page to apply was asked for during action(), in order.

    Measured at the second pass's requests (`ending_before`: the pages applied, oldest first), tracemalloc
    counting every thread: what the run keeps from page to page, not the cyclic garbage that the collector
    frees on its own schedule.
    """
    held = []

    def measure(number):
        if "ending_before" in stand_in.requests[number - 1]:
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])

    gc.collect()
    tracemalloc.start()
    stand_in.on_request = measure
    try:
        action()
        return held
    finally:
        stand_in.on_request = None
        tracemalloc.stop()


def test_a_runs_memory_does_not_grow_with_its_window(app, db, stand_in):
    # A window of 3,000 payments (30 pages), and one of 20 days before it that warms the command up.
    windows = {"warm": 20, "large": 3000}
    for days_ago, (prefix, count) in zip((6, 2), windows.items(), strict=True):
        stand_in.add(*(at(intent_succeeded(f"pi_{prefix}_{n:05d}", cents=1), days_ago * DAY - n * 20)
                       for n in range(count)))

    def reconcile(days_ago):
        moment = datetime.now(UTC) - timedelta(days=days_ago)
        since, until = (moment - timedelta(hours=1)).isoformat()[:19], (moment + timedelta(days=1)).isoformat()[:19]
        result = run(app, "--since", since, "--until", until)
        assert result.exit_code == 0, result.output

    held_at_each_applied_page(stand_in, lambda: reconcile(6))  # the first run's imports and pool are not the window's
    held = held_at_each_applied_page(stand_in, lambda: reconcile(2))
    assert [row[3] for row in runs(db)] == list(windows.values())
    assert len(held) == 30
    # What the run holds when its first ten pages are asked for, and when its last ten are (medians: at
    # any one moment the four appliers and the page fetched ahead hold a few hundred kB more or less).
    # A run that kept 300 bytes (an Event object is more) for each event applied would hold 0.6 MB more
    # at the last ten than at the first ten; about 0.05 MB is measured here.
    first, last = statistics.median(held[:10]), statistics.median(held[-10:])
    assert last - first < 300_000, held


def _five_refusals(app, stand_in, monkeypatch):
    """A run that refuses five refunds (of payments it does not know) and keeps three of them to name."""
    monkeypatch.setattr(reconcile_module, "REFUSED_KEPT", 3)
    stand_in.add(*(at(refund(f"re_{n}", f"pi_elsewhere_{n}", 10, event_type="refund.created"), 600 - n)
                   for n in range(5)))
    result = run(app)
    assert result.exit_code == 0, result.output
    return result


def test_a_run_names_at_most_refused_kept_refusals(app, db, stand_in, monkeypatch):
    result = _five_refusals(app, stand_in, monkeypatch)
    assert result.output.count("  refused evt_") == 3


def test_the_refusals_a_run_does_not_name_are_still_counted(app, db, stand_in, monkeypatch):
    result = _five_refusals(app, stand_in, monkeypatch)
    assert "and 2 more refused, not named here" in result.output
    assert "5 listed: 0 applied (recovered: their deliveries were lost), 0 duplicates, 5 refused" in result.output
    assert runs(db) == [("completed", 1, 5, 0, 0, 5)]
    assert db.execute("SELECT count(*) FROM webhook_events WHERE status = 'failed'").fetchone()[0] == 5


def test_a_signed_live_delivery_of_a_recovered_event_afterwards_is_a_duplicate(app, client, db, stand_in):
    evt = at(intent_succeeded("pi_late", cents=70), 300)
    stand_in.add(evt)
    assert run(app).exit_code == 0
    answer = send_stripe(client, evt)  # Stripe's own bytes (pretty-printed), not the listed ones
    assert (answer.status, answer.json["status"]) == (200, "duplicate")
    assert balance(db) == OPENING[ALICE] + 70
    shown = app.test_cli_runner().invoke(args=["events", "show", evt.id])
    assert "reconcile (the provider's event list: its delivery was lost)" in shown.output, shown.output
    assert "stored bytes:   match" in shown.output


def test_a_stripe_retry_arriving_during_a_run_is_applied_once(make_app, app, config, db, stand_in):
    events = payments(300, cents=5)
    stand_in.add(*events)
    live = make_app(config).test_client()
    answers = []

    def retry_arrives(number):
        if number == 5:  # the second pass has begun: these events are being applied now
            answers.extend(send_stripe(live, evt).json["status"] for evt in events[:150:10])

    stand_in.on_request = retry_arrives
    result = run(app)
    assert result.exit_code == 0, result.output
    assert len(answers) == 15 and set(answers) <= {"processed", "duplicate"}
    assert balance(db) == OPENING[ALICE] + 300 * 5
    (status, _, listed, applied, duplicates, refused), = runs(db)
    assert (status, listed, applied + duplicates, refused) == ("completed", 300, 300, 0)
    assert applied + answers.count("processed") == 300
    assert_ledger_consistent(db)


def test_two_runs_at_once_apply_each_event_once(config, db, stand_in):
    stand_in.add(*payments(400, cents=3))
    stand_in.delay = 0.05
    commands = [subprocess.Popen([sys.executable, "-m", "flask", "--app", "app", "reconcile", "default"], cwd=ROOT,
                                 env=flask_env(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    outcomes = [(command.wait(timeout=120), *command.communicate()) for command in commands]
    assert sorted(code for code, _, _ in outcomes) in ([0, 0], [0, 75]), outcomes
    for code, out, err in outcomes:
        assert "Traceback" not in err
        if code == 75:
            assert out.splitlines()[-1].endswith("this one yields"), out
    assert balance(db) == OPENING[ALICE] + 400 * 3
    assert sum(row[3] for row in runs(db)) == 400  # each event applied by exactly one of them
    assert_ledger_consistent(db)


def _a_run_killed_midway(config, db, stand_in):
    """A `flask reconcile` of 600 events SIGKILLed after its first pages, once PostgreSQL has seen it gone."""
    stand_in.add(*payments(600, cents=2))
    stand_in.delay = 0.1
    command = subprocess.Popen([sys.executable, "-m", "flask", "--app", "app", "reconcile", "default"], cwd=ROOT,
                               env=flask_env(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: db.execute("SELECT coalesce(max(applied), 0) FROM reconcile_runs").fetchone()[0] >= 200,
                   timeout=60, what="the run's first pages")
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=10)
    finally:
        command.kill()
    # Statements it had sent may still commit until PostgreSQL sees it gone (CLIENT_CHECK_MS): wait for that.
    wait_until(lambda: db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                  [f"webhook-ledger:{command.pid}"]).fetchone()[0] == 0,
               timeout=30, what="the killed run's backends to end")
    stand_in.delay = 0


def test_a_run_killed_midway_leaves_nothing_half_applied(config, db, stand_in):
    _a_run_killed_midway(config, db, stand_in)
    applied_before = balance(db) - OPENING[ALICE]
    assert 0 < applied_before < 1200 and applied_before % 2 == 0  # whole events, some of them
    # The watermark's row, made by the killed run's transaction, went with it.
    assert db.execute("SELECT reconciled_until FROM reconcile_watermarks").fetchone() is None
    assert_ledger_consistent(db)


def test_the_run_after_a_killed_one_completes_its_window(app, config, db, stand_in):
    _a_run_killed_midway(config, db, stand_in)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert [row[0] for row in runs(db)] == ["interrupted", "completed"]
    assert balance(db) == OPENING[ALICE] + 600 * 2
    assert_ledger_consistent(db)


def test_a_purged_event_listed_again_moves_no_money(app, client, db, stand_in):
    evt = at(intent_succeeded("pi_purged", cents=90), 3600)
    assert send_stripe(client, evt).json["status"] == "processed"
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    purged = app.test_cli_runner().invoke(args=["events", "purge", "--older-than", "35"])
    assert purged.exit_code == 0 and "purged 1 " in purged.output, purged.output
    stand_in.add(evt)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert runs(db) == [("completed", 1, 1, 0, 1, 0)]
    assert balance(db) == OPENING[ALICE] + 90
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone() == (0,)  # not stored again


def _a_window_older_than_thirty_days(app, stand_in):
    """A run from 40 days ago: one payment 45 days old, beyond Stripe's list, and one of yesterday."""
    stand_in.add(at(intent_succeeded("pi_old", cents=5), 45 * DAY), at(intent_succeeded("pi_new", cents=7), DAY))
    since = (datetime.now(UTC) - timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%S")
    return run(app, "--since", since)


def test_a_window_older_than_thirty_days_is_reported_not_provable(app, db, stand_in):
    result = _a_window_older_than_thirty_days(app, stand_in)
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.output.splitlines() if "NOT PROVABLE" in line]
    assert "30-day limit" in line


def test_a_window_older_than_thirty_days_is_never_recorded_completed(app, db, stand_in):
    result = _a_window_older_than_thirty_days(app, stand_in)
    assert "completed" not in result.output
    assert runs(db) == [("incomplete", 1, 1, 1, 0, 0)]
    assert balance(db) == OPENING[ALICE] + 7


WRONG_KEY = "rk_test_notTheKeyStripeKnows0123456789"


def test_a_wrong_key_is_refused_in_one_line_without_the_key(make_app, config, db, stand_in):
    result = run(make_app({**config, "WEBHOOK_API_KEY": WRONG_KEY}))
    assert result.exit_code == 1
    assert result.output == ("Error: Stripe refused the key in WEBHOOK_API_KEY (401): it must be a restricted key "
                             "with read access to Events\n")
    assert WRONG_KEY[8:] not in result.output


def test_a_run_with_a_wrong_key_is_recorded_failed(make_app, config, db, stand_in):
    run(make_app({**config, "WEBHOOK_API_KEY": WRONG_KEY}))
    assert [row[0] for row in runs(db)] == ["failed"]


def test_a_missing_key_is_one_line_naming_the_setting(make_app, config, db):
    app = make_app({name: value for name, value in config.items() if name != "WEBHOOK_API_KEY"})
    result = run(app)
    assert result.exit_code == os.EX_CONFIG
    assert result.output.startswith("Error: configuration error: WEBHOOK_API_KEY is not set")
    assert result.output.count("\n") == 1


def _gaps(stand_in):
    """Seconds between one request to the stand-in and the next."""
    return [later - earlier for earlier, later in itertools.pairwise(stand_in.arrivals)]


def test_a_run_through_a_429_and_two_500s_applies_every_event(app, db, stand_in):
    stand_in.add(*payments(150, cents=1))
    stand_in.fail_next(429)
    stand_in.fail_next(500, times=2)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert balance(db) == OPENING[ALICE] + 150


def test_a_429_is_tried_again_after_a_second(app, stand_in):
    stand_in.add(*payments(3))
    stand_in.fail_next(429)
    assert run(app).exit_code == 0
    # stripe-python does not retry a 429: app/providers/stripe/api.py waits 1 s, then 2 s, 4 s, ...
    assert _gaps(stand_in)[0] >= 1.0


def test_a_500_is_tried_again_after_stripe_pythons_backoff(app, stand_in):
    stand_in.add(*payments(3))
    stand_in.fail_next(500, times=2)
    assert run(app).exit_code == 0
    # stripe-python sleeps at least its INITIAL_DELAY (0.5 s) before each retry.
    assert min(_gaps(stand_in)[:2]) >= 0.5


def test_dry_run_changes_nothing(app, client, db, stand_in):
    events = payments(30)
    stand_in.add(*events)
    send_stripe(client, events[0])
    tables = ("webhook_events", "ledger_journal", "payments", "user_balances", "reconcile_runs",
              "reconcile_watermarks")
    before = {table: db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in tables}
    result = run(app, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "30 listed: 29 not stored (would be applied), 0 stored failed (would be tried again), 1 already applied" \
        in result.output
    assert {table: db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in tables} == before


def test_the_next_run_starts_at_the_watermark_minus_the_overlap(app, db, stand_in):
    stand_in.add(*payments(5))
    assert run(app).exit_code == 0
    (until,) = db.execute("SELECT reconciled_until FROM reconcile_watermarks").fetchone()
    stand_in.add(at(intent_succeeded("pi_after", cents=11), 1))
    time.sleep(1.1)
    result = run(app)
    assert result.exit_code == 0, result.output
    assert f"(the watermark {until.strftime('%Y-%m-%d %H:%M:%SZ')} minus 0:15:00)" in result.output
    created = stand_in.requests[-1]["created"]
    assert int(created["gte"]) == int(until.timestamp()) - 15 * 60
    assert balance(db) == OPENING[ALICE] + 50 + 11


@pytest.mark.unit
def test_the_stand_in_implements_list_events_as_documented():
    now = int(time.time())
    stand_in = StripeStandIn(clock=lambda: now)
    stand_in.add(*({"id": f"evt_{n}", "type": kind, "created": now - 10 + n, "data": {"object": {}}}
                   for n, kind in enumerate(["charge.succeeded", "charge.dispute.created", "refund.created"])),
                 {"id": "evt_old", "type": "charge.succeeded", "created": now - 31 * DAY, "data": {"object": {}}})

    def ids(**params):
        return [event["id"] for event in stand_in.list_events(params)["data"]]

    assert ids() == ["evt_2", "evt_1", "evt_0"]  # newest first; evt_old beyond the 30 days
    assert ids(type="charge.*") == ["evt_1", "evt_0"]
    assert ids(types=["refund.created", "charge.succeeded"]) == ["evt_2", "evt_0"]
    assert ids(created={"gte": str(now - 9), "lt": str(now - 8)}) == ["evt_1"]
    assert ids(created=str(now - 8)) == ["evt_2"]
    assert ids(limit="1", starting_after="evt_2") == ["evt_1"]
    assert ids(limit="1", ending_before="evt_0") == ["evt_1"]
    assert stand_in.list_events({"limit": "1", "ending_before": "evt_0"})["has_more"] is True
    for bad in ({"limit": "0"}, {"limit": "101"}, {"type": "a", "types": ["b"]}, {"starting_after": "evt_none"}):
        with pytest.raises(ValueError):
            stand_in.list_events(bad)
    assert stand_in.answer("/v1/events", "", "Bearer sk_wrong")[0] == 401
    stand_in.fail_next(429)
    assert stand_in.answer("/v1/events", "", f"Bearer {API_KEY}")[0] == 429


@pytest.mark.unit
def test_no_api_key_reaches_the_settings_repr():
    settings = config_module.from_env({"DATABASE_URL": "postgresql://x@127.0.0.1/x",
                                       "REDIS_URL": "redis://127.0.0.1:6379/0",
                                       "WEBHOOK_SECRET": "default-secret-0123456789", "WEBHOOK_API_KEY": API_KEY})
    assert settings.sources["default"].api_key == API_KEY
    assert API_KEY not in repr(settings)


def _reconcile_samples(client):
    """The default source's reconcile samples of GET /metrics, by (name, status label)."""
    return {(sample.name, sample.labels.get("status")): sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            if family.name.startswith("webhook_ledger_reconcile") for sample in family.samples
            if sample.labels.get("source") == "default"}


def _samples_around_a_run(app, client, stand_in):
    """The reconcile samples before and after a run that recovers 12 events."""
    before = _reconcile_samples(client)
    stand_in.add(*payments(12))
    assert run(app).exit_code == 0
    return before, _reconcile_samples(client)


def test_the_metrics_say_when_a_source_last_reconciled(app, client, db, stand_in):
    before, after = _samples_around_a_run(app, client, stand_in)
    assert before[("webhook_ledger_reconcile_last_success_timestamp_seconds", None)] == 0  # never: the alert fires
    assert before[("webhook_ledger_reconcile_max_age_seconds", None)] == 10800
    assert time.time() - after[("webhook_ledger_reconcile_last_success_timestamp_seconds", None)] < 60


def test_the_metrics_count_the_events_a_source_recovered(app, client, db, stand_in):
    before, after = _samples_around_a_run(app, client, stand_in)
    assert before[("webhook_ledger_reconcile_recovered_events_total", None)] == 0
    assert after[("webhook_ledger_reconcile_recovered_events_total", None)] == 12


def test_the_metrics_count_a_sources_runs_by_how_they_ended(app, client, db, stand_in):
    _, after = _samples_around_a_run(app, client, stand_in)
    assert after[("webhook_ledger_reconcile_runs_total", "completed")] == 1
    assert after[("webhook_ledger_reconcile_runs_total", "failed")] == 0


def test_what_a_run_applies_reaches_the_services_metrics(gunicorn, config, db, stand_in, tmp_path):
    """A real gunicorn and a real `flask reconcile` process, sharing the service's PROMETHEUS_MULTIPROC_DIR."""
    metrics_dir = tmp_path / "metrics"
    server = gunicorn(workers=2, threads=2, PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    stand_in.add(*payments(5, cents=7))
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", "reconcile", "default"], cwd=ROOT,
                          env={**flask_env(config), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done
    credited = ("webhook_ledger_payments_credited_total", (("source", "default"),))
    assert scrape(server.base)[credited] == 5
    assert scrape(server.base)[credited] == 5
    assert list(metrics_dir.glob("commands-*")) == []


# -- a list Stripe's contract rules out (the stand-in's `hostile` modes) ----------------------------------------------
# Each run is a `flask reconcile` process with a timeout: the guard that ends a run that would not end.

RUN_TIMEOUT = 60  # a healthy run here takes a few seconds
# The longest error line a run may print: its message and an excerpt of at most 200 characters of what it received.
SHORT_LINE = 500


def reconcile_process(config, *args):
    """A `flask reconcile default` process: (exit code, stdout, stderr); TimeoutExpired if it has not ended."""
    done = subprocess.run([sys.executable, "-m", "flask", "--app", "app", "reconcile", "default", *args], cwd=ROOT,
                          env=flask_env(config), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    return done.returncode, done.stdout, done.stderr


def between(hostile):
    """Two good events and hostile created between them (neither first nor last: no cursor is taken from it)."""
    first, last = payments(2, cents=100, prefix="pi_around")
    hostile["created"] = first["created"] + 1
    return [first, hostile, last]


def assert_one_line_error(code, out, err, says):
    assert code == 1, (code, out, err)
    assert "Traceback" not in err
    lines = (out + err).splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert says in lines[-1], lines[-1]
    assert len(lines[-1]) <= SHORT_LINE, lines[-1]


# -- a bad listed event: refused as its delivery would be, and the run goes on ------------------------------------


def test_a_listed_event_holding_a_lone_surrogate_escape_is_applied_as_its_delivery_is(app, client, db, stand_in,
                                                                                         config):
    odd = intent_succeeded("pi_surrogate", cents=7)
    odd.data.object["description"] = "\ud800"  # JSON "\ud800": valid JSON, no UTF-8 for it
    stand_in.add(*between(odd))
    code, out, err = reconcile_process(config)
    assert (code, err) == (0, ""), out
    assert runs(db) == [("completed", 1, 3, 3, 0, 0)]
    assert balance(db) == OPENING[ALICE] + 207
    # Stripe's own delivery of it, afterwards, is the same event with the same effect.
    assert send_stripe(client, odd).json["status"] == "duplicate"
    assert_ledger_consistent(db)


def test_a_listed_event_whose_id_cannot_be_stored_is_refused_and_the_run_goes_on(app, client, db, stand_in, config):
    bad = intent_succeeded("pi_bad_id", cents=7, event_id="evt_\ud800bad")
    assert send_stripe(client, bad).status == 400  # as delivered: refused, nothing written
    stand_in.add(*between(bad))
    code, out, err = reconcile_process(config)
    assert (code, err) == (0, ""), out
    assert "refused evt_\\ud800bad (payment_intent.succeeded): not stored: 'id' contains characters that cannot be " \
           "stored" in out
    assert runs(db) == [("completed", 1, 3, 2, 0, 1)]
    assert balance(db) == OPENING[ALICE] + 200
    assert db.execute("SELECT count(*) FROM webhook_events").fetchone()[0] == 2


def test_a_listed_event_whose_created_is_not_an_integer_is_applied_as_its_delivery_is(app, db, stand_in, config):
    first, odd, last = between(intent_succeeded("pi_created", cents=7))
    stand_in.add(first, last)
    odd["created"] = "yesterday"  # a delivery does not read it
    stand_in.add_as_created(first["created"] + 1, odd)
    code, out, err = reconcile_process(config)
    assert (code, err) == (0, ""), out
    assert runs(db) == [("completed", 1, 3, 3, 0, 0)]
    assert balance(db) == OPENING[ALICE] + 207


def test_a_listed_event_larger_than_a_delivery_may_be_is_refused_and_the_run_goes_on(make_app, db, stand_in,
                                                                                      config):
    config = {**config, "MAX_BODY_BYTES": "4000"}
    large = intent_succeeded("pi_large", cents=7)
    large.data.object["description"] = "x" * 5000
    assert send_stripe(make_app(config).test_client(), large).status == 413
    stand_in.add(*between(large))
    code, out, err = reconcile_process(config)
    assert (code, err) == (0, ""), out
    assert f"refused {large['id']} (payment_intent.succeeded): not stored: the body is larger than 4000 bytes " \
           "(MAX_BODY_BYTES)" in out
    assert runs(db) == [("completed", 1, 3, 2, 0, 1)]


@pytest.mark.parametrize("description, event_id", [("\ud800", None), ("plain", "evt_\ud800dry")])
def test_a_dry_run_over_a_bad_listed_event_ends(db, stand_in, config, description, event_id):
    odd = intent_succeeded("pi_dry", cents=7, event_id=event_id)
    odd.data.object["description"] = description
    stand_in.add(*between(odd))
    code, out, err = reconcile_process(config, "--dry-run")
    assert (code, err) == (0, ""), out
    assert "3 listed" in out


# -- a page that cannot be followed: the run stops in one line ------------------------------------------------------


def test_an_empty_page_that_says_it_has_more_stops_the_run_in_one_line(db, stand_in, config):
    stand_in.add(*payments(3, prefix="pi_empty"))
    stand_in.hostile = "empty_with_more"
    code, out, err = reconcile_process(config)
    assert_one_line_error(code, out, err, "an empty page that says it has more (has_more: true)")
    assert [row[0] for row in runs(db)] == ["failed"]


def test_a_list_that_ignores_the_cursor_stops_the_run_in_one_line(db, stand_in, config):
    stand_in.add(*payments(150, prefix="pi_ignored"))
    stand_in.hostile = "ignore_cursor"
    code, out, err = reconcile_process(config)
    assert_one_line_error(code, out, err, "a page it answered before")
    assert [row[0] for row in runs(db)] == ["failed"]
    assert balance(db) == OPENING[ALICE]  # the first pass applies nothing


def test_a_list_that_ignores_the_cursor_of_its_second_pass_stops_the_run_in_one_line(db, stand_in, config):
    stand_in.add(*payments(150, prefix="pi_second"))
    stand_in.hostile = "ignore_ending_before"
    code, out, err = reconcile_process(config)
    assert_one_line_error(code, out, err, "a page it answered before")
    assert [row[0] for row in runs(db)] == ["failed"]
    assert db.execute("SELECT reconciled_until FROM reconcile_watermarks").fetchone() == (None,)
    assert_ledger_consistent(db)


def _customers_payments(count):
    """count payments, each with about 2 kB of its customer's data: a page of them is some 200 kB."""
    events = payments(count, prefix="pi_customer")
    for evt in events:
        evt.data.object["shipping"] = {"name": "Jenny Rosen", "phone": "+15555550100",
                                       "address": {"line1": "510 Townsend St", "city": "San Francisco"}}
        evt.data.object["description"] = "jenny.rosen@example.com " * 80
    return events


@pytest.mark.parametrize("hostile, says", [("cut_short", "a page that is not JSON"),
                                           ("not_a_page", "a page that is not a list of events")])
def test_a_malformed_page_stops_the_run_quoting_a_short_excerpt(db, stand_in, config, hostile, says):
    stand_in.add(*_customers_payments(100))
    stand_in.hostile = hostile
    code, out, err = reconcile_process(config)
    assert_one_line_error(code, out, err, says)
    assert (out + err).count("jenny.rosen@example.com") <= 2
    assert [row[0] for row in runs(db)] == ["failed"]


@pytest.mark.unit
def test_an_excerpt_is_one_short_printable_line():
    received = "jenny\n\x1b[31m\ud800\\" + "x" * 1000
    shown = reconcile_module.excerpt(received)
    assert shown == "jenny\\n\\x1b[31m\\ud800\\\\" + "x" * 187 + "... (813 more characters)"
