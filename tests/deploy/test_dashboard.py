"""deploy/grafana/webhook-ledger.json: every panel's query returns data from a
real Prometheus (Debian's `prometheus`) that scraped the app under gunicorn
through a short load meant to give every panel something to show (each
outcome, a Redis fault and outage, a 500 from a database that refuses a
write, payments announced twice, refunds); and the dashboard names only
metrics and outcomes the app serves.
"""

import json
import logging
import re
import threading
import uuid

import psycopg
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from app.store.db import apply_schema
from app.store.outcome import Outcome
from devservers import ROOT, Gunicorn, Prometheus, Redis, packages, wait_until

from ..helpers import (
    BOB,
    OPENING,
    SECRET,
    UNKNOWN_USER,
    debian_program,
    encode,
    payment,
    send,
    signed_headers,
    source_secret,
    sources_config,
)

# One worker of `make test` (pytest-xdist) runs Prometheus through its load, once for the module.
pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group("dashboard")]

DASHBOARD = ROOT / "deploy" / "grafana" / "webhook-ledger.json"
# Grafana's variables, as the test queries them: every source, a window over the whole load.
VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$source": ".*"}
NAMED_SOURCE = "billing"
# A payment to this user breaks a CHECK constraint added for the test: the 500 that a misconfigured database gives.
BLOCKED_USER = uuid.UUID("44444444-4444-4444-8444-444444444444")
# Spent elsewhere in the product, so that a refund takes the balance below zero.
SPENDER = uuid.UUID("55555555-5555-4555-8555-555555555555")

log = logging.getLogger(__name__)


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def _targets():
    """(row title, panel, target) of every query, in order."""
    row, found = None, []
    for panel in _dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        found += [(row, panel, target) for target in panel["targets"]]
    return found


def _expr(target):
    expr = target["expr"]
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _metrics(expr):
    return set(re.findall(r"\bwebhook_ledger_\w+", expr))


def _outcomes(expr):
    return {o for group in re.findall(r'outcome=~?"([^"]+)"', expr) for o in group.split("|")}


TARGETS = _targets()


@pytest.fixture(scope="module")
def served(pg_server):
    """Every metric name the app serves at /metrics (a counter's as <name>_total), samples or not yet."""
    app = create_app({"DATABASE_URL": pg_server.url(), "REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SECRET": SECRET})
    try:
        text = app.test_client().get("/metrics").text
    finally:
        app.extensions["db_pool"].close()
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes}
    return names


@pytest.mark.unit
def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_variable():
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for _, panel, target in TARGETS:
        assert panel["datasource"] == target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    assert len({(p["id"], t["refId"]) for _, p, t in TARGETS}) == len(TARGETS)


def test_the_dashboard_names_only_metrics_and_outcomes_the_app_serves(served):
    named = set().union(*(_metrics(_expr(t)) for _, _, t in TARGETS))
    assert named and named <= served, named - served
    outcomes = set().union(*(_outcomes(_expr(t)) for _, _, t in TARGETS))
    assert outcomes <= {o.value for o in Outcome}, outcomes


# -- a real Prometheus scraping the app under a short load --------------------

@pytest.fixture(scope="module")
def prometheus_binary():
    found = debian_program("prometheus")
    if not found:
        pytest.skip(f"prometheus not found: apt-get install {packages.package('prometheus')} (make test does, as root)")
    return found


@pytest.fixture(scope="module")
def scraped(prometheus_binary, pg_server, tmp_path_factory):
    """Prometheus, after it scraped gunicorn (2 workers) through the load below, every second."""
    workdir = tmp_path_factory.mktemp("dashboard")
    dbname = f"dashboard_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = pg_server.url(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        apply_schema(conn)
        for user, cents in {**OPENING, BLOCKED_USER: 0, SPENDER: 0}.items():
            conn.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, %s)", [user, cents])
        conn.execute(f"ALTER TABLE user_balances ADD CONSTRAINT dashboard_test_blocked "
                     f"CHECK (user_id <> '{BLOCKED_USER}') NOT VALID")
    own_redis = Redis().start()  # stopped half way: not the session's
    # WEBHOOK_API_KEY: the default source is one that `flask reconcile` lists, so its reconcile series exist.
    settings = sources_config({"DATABASE_URL": url, "REDIS_URL": own_redis.url, "WEBHOOK_SECRET": SECRET,
                               "WEBHOOK_API_KEY": "rk_test_dashboard0123456789"},
                              {NAMED_SOURCE: "hmac-sha256"},
                              # Long enough for a twin to meet the held lock (409) before this one's 503.
                              PG_LOCK_TIMEOUT_MS="1500")
    server = Gunicorn(settings, workers=2, threads=4, log_path=workdir / "gunicorn.log").start()
    prometheus = Prometheus(workdir / "prometheus", [f"127.0.0.1:{server.port}"], binary=prometheus_binary).start()
    try:
        # Prometheus finds its targets a few seconds after it starts: a series first scraped after the
        # load would stay flat, and its rate 0 (a latency quantile NaN).
        wait_until(lambda: [t for t in prometheus.api("targets")["activeTargets"] if t["health"] == "up"],
                   timeout=30, what="prometheus's first scrape")
        _load(server.base, url, own_redis)
        yield prometheus
    finally:
        prometheus.stop()
        server.stop()
        own_redis.stop()
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{dbname}" WITH (FORCE)')


def _send(base, event, source=None, secret=None):
    body = encode(event)
    secret = secret or (source_secret(source, "hmac-sha256") if source else SECRET)
    return send(base, body, signed_headers(body, secret), source=source).status


def _load(base, url, own_redis):
    """Deliveries that give each panel data; each answer checked, so a load that misses its aim says so."""
    for i in range(20):
        for _ in range(2):  # processed, then duplicate
            _send(base, payment(f"evt_load_{i}", cents=100 + i))
            _send(base, payment(f"evt_load_{i}", cents=100 + i), source=NAMED_SOURCE)
    assert _send(base, payment("evt_load_0", cents=999)) == 409  # payload_mismatch
    assert _send(base, payment("evt_unknown_user", user=UNKNOWN_USER)) == 422  # failed
    assert _send(base, payment("evt_forged"), secret="not-the-secret") == 401  # rejected
    assert _send(base, payment("evt_blocked", user=BLOCKED_USER)) == 500  # the database refuses the write

    # Payments and refunds: one payment announced three times (credited, duplicate, mismatch), refunded
    # in part; another credited, spent, then refunded in full: below zero.
    assert _send(base, payment("evt_pay_1", cents=500, paymentId="pay_1")) == 200
    assert _send(base, payment("evt_pay_1_again", cents=500, paymentId="pay_1")) == 200
    _send(base, payment("evt_pay_1_other", cents=501, paymentId="pay_1"))  # 409 payment_mismatch, once it exists
    refund = {"type": "payment.refunded", "data": {"paymentId": "pay_1", "amountRefundedCents": 200}}
    assert _send(base, {"id": "evt_refund_1", **refund}) == 200
    assert _send(base, payment("evt_pay_2", user=SPENDER, cents=300, paymentId="pay_2")) == 200
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE user_balances SET balance_cents = 0 WHERE user_id = %s", [SPENDER])
    refund = {"type": "payment.refunded", "data": {"paymentId": "pay_2", "amountRefundedCents": 300}}
    assert _send(base, {"id": "evt_refund_2", **refund}) == 200
    # A refund object that fails, and a dispute won (Stripe's types, relayed by this sender: keyed by type).
    assert _send(base, payment("evt_pay_3", cents=400, paymentId="pay_3")) == 200
    for n, (event_type, obj) in enumerate([
            ("refund.created", {"id": "re_3", "object": "refund", "status": "succeeded"}),
            ("refund.failed", {"id": "re_3", "object": "refund", "status": "failed"}),
            ("charge.dispute.funds_withdrawn", {"id": "du_3", "object": "dispute", "status": "needs_response"}),
            ("charge.dispute.funds_reinstated", {"id": "du_3", "object": "dispute", "status": "won"})]):
        obj = {**obj, "payment_intent": "pay_3", "amount": 100, "currency": "usd"}
        assert _send(base, {"id": f"evt_move_{n}", "type": event_type, "livemode": True,
                            "data": {"object": obj}}) == 200

    # Two runs of `flask reconcile` (a timer, outside gunicorn: the metrics read their records): one
    # recovered 3 events, one yielded to it. tests/commands/test_reconcile.py runs the command itself.
    with psycopg.connect(url, autocommit=True) as conn:
        for status, applied in (("completed", 3), ("yielded", 0)):
            conn.execute("INSERT INTO reconcile_runs (source, since, until, status, pages, listed, applied,"
                         " finished_at) VALUES ('default', now() - interval '1 hour', now(), %s, 1, %s, %s, now())",
                         [status, applied, applied])

    # 409 in_progress and 503: a delivery waits on BOB's balance row, held here, past PG_LOCK_TIMEOUT_MS,
    # while its twin finds the Redis lock taken.
    held = payment("evt_held", user=BOB)
    answers = []
    with psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM user_balances WHERE user_id = %s FOR UPDATE", [BOB])
        first = threading.Thread(target=lambda: answers.append(_send(base, held)))
        first.start()
        wait_until(lambda: _lock_waiters(url) > 0, timeout=10, what="a delivery waiting on the row")
        assert _send(base, held) == 409
        first.join(10)
    assert answers == [503]

    # Redis out of memory (a fault), then gone (degraded): PostgreSQL decides alone.
    client = redis.Redis.from_url(own_redis.url)
    client.config_set("maxmemory", 1)
    assert _send(base, payment("evt_redis_oom")) == 200
    own_redis.stop()
    client.close()
    assert _send(base, payment("evt_redis_down")) == 200


def _lock_waiters(url):
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]


def test_the_source_variable_lists_every_source(scraped):
    wait_until(lambda: len(scraped.api("label/source/values", **{"match[]": "webhook_ledger_deliveries_total"})) == 2,
               timeout=15, what="both sources in Prometheus")


@pytest.mark.parametrize(("row", "panel", "target"), TARGETS,
                         ids=[f"{panel['title']}/{target['refId']}" for _, panel, target in TARGETS])
def test_every_panel_returns_data(scraped, served, row, panel, target):
    expr = _expr(target)
    found = []

    def has_data():
        # A rate needs two scrapes of a series: the last ones created may need a second or two more.
        found[:] = [r for r in scraped.query(expr) if r["value"][1] != "NaN"]
        return bool(found)

    wait_until(has_data, timeout=15, interval=0.5, what=f"data for {panel['title']!r}: {expr}")
    log.info("%s / %s: %d series", panel["title"], target["refId"], len(found))
