"""deploy/prometheus/alerts.yml: valid rules (promtool check rules), each alert
firing on the traffic it is written for and quiet otherwise (promtool test
rules, deploy/prometheus/alerts_test.yml), and every metric and outcome it
names served by the app's real GET /metrics."""

import re
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.store.outcome import Outcome
from devservers import ROOT
from devservers.packages import program

pytestmark = pytest.mark.deploy

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"


@pytest.fixture(scope="module")
def promtool():
    """promtool's path (`make test` installs it); without it the tests are skipped, saying why."""
    try:
        return program("promtool")
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_rules_are_valid(promtool):
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 15 rules found" in done.stdout


def test_each_alert_fires_on_its_traffic_and_only_then(promtool):
    done = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.unit
def test_every_alert_is_tested():
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
    tested = set(re.findall(r"^\s+alertname: (\w+)$", RULE_TESTS.read_text(), re.M))
    assert alerts == tested and len(alerts) == 15


def test_the_rules_name_only_metrics_and_outcomes_the_app_serves(client):
    """Scraped from the app: a counter's samples end in _total, a histogram's in _bucket, _sum and _count."""
    served = set()
    for family in text_string_to_metric_families(client.get("/metrics").text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        served |= {family.name + suffix for suffix in suffixes}
    rules = RULES.read_text()
    named = set(re.findall(r"\bwebhook_ledger_\w+", rules))
    assert named and named <= served, named - served
    outcomes = {o for group in re.findall(r'outcome=~?"([^"]+)"', rules) for o in group.split("|")}
    assert outcomes and outcomes <= {o.value for o in Outcome}, outcomes
