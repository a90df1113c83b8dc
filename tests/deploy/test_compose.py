"""docker-compose.yml, read (no container engine runs compose here; the
image itself is built and run by test_image.py): the image is built once and
reused by `migrate`, never pulled; no service repeats the image's CMD; the
app's stop grace period outlasts gunicorn's graceful timeout; PostgreSQL is
the major version the tests run; the schema is applied before the app
starts; the daily audit is off by default (its own profile), with the app's
settings and Redis; every setting passed is one the app knows, the service's own from an
env file whose documented example names the README's settings; only the
proxy's port is published, in front of the app's, with deploy/haproxy.cfg
(tests/deploy/test_slow_senders.py runs that file)."""

import json
import re
import subprocess

import psycopg
import pytest
import yaml

from app.settings.config import SETTINGS
from devservers import ROOT, packages

pytestmark = pytest.mark.deploy

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
GUNICORN_CONF = (ROOT / "gunicorn.conf.py").read_text()


def image_cmd():
    return json.loads(re.search(r"^CMD (\[.*\])$", DOCKERFILE, re.M).group(1))


def seconds(duration):
    """A compose duration ("30s", "1m30s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def builders():
    return {name: service for name, service in SERVICES.items() if "build" in service}


def app_image_services():
    image = next(iter(builders().values()))["image"]
    return {name: service for name, service in SERVICES.items() if service.get("image") == image}


@pytest.mark.unit
def test_the_image_is_built_once_from_the_dockerfile_and_reused():
    assert list(builders()) == ["app"]
    assert builders()["app"]["build"] == "." and (ROOT / "Dockerfile").exists()
    assert set(app_image_services()) == {"app", "migrate", "audit"}
    for name, service in app_image_services().items():
        if "build" not in service:
            assert service.get("pull_policy") == "never", f"{name} would try to pull the locally built image"


@pytest.mark.unit
def test_no_service_repeats_the_images_cmd():
    for name, service in app_image_services().items():
        assert service.get("command") != image_cmd(), name
    assert "command" not in SERVICES["app"]


@pytest.mark.unit
def test_the_app_outlasts_gunicorns_graceful_timeout_before_sigkill():
    graceful = int(re.search(r"^graceful_timeout = (\d+)$", GUNICORN_CONF, re.M).group(1))
    assert seconds(SERVICES["app"]["stop_grace_period"]) > graceful


def test_postgres_is_the_major_version_the_tests_run(pg_server):
    with psycopg.connect(pg_server.url()) as conn:
        major = conn.info.server_version // 10000
    assert SERVICES["postgres"]["image"] == f"postgres:{major}"


@pytest.mark.unit
def test_the_schema_is_applied_before_the_app_starts():
    migrate, app = SERVICES["migrate"], SERVICES["app"]
    assert migrate["command"] == ["flask", "--app", "app", "init-db"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert app["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert migrate["restart"] == "no"


@pytest.mark.unit
@pytest.mark.parametrize("name", ["migrate", "app", "audit"])
def test_every_setting_passed_is_one_the_app_reads(name):
    environment = SERVICES[name]["environment"]
    assert set(environment) <= set(SETTINGS), set(environment) - set(SETTINGS)
    assert set(environment) == {"DATABASE_URL", "REDIS_URL"}  # compose's own servers; the rest: the env file


@pytest.mark.unit
@pytest.mark.parametrize("name", ["migrate", "app", "audit"])
def test_the_services_settings_come_from_the_env_file_whose_example_is_documented(name):
    assert SERVICES[name]["env_file"] == ["webhook-ledger.env"]
    example = (ROOT / "webhook-ledger.env.example").read_text()
    values = dict(re.findall(r"^#?([A-Z][A-Z0-9_]+)=(.*)$", example, re.M))
    sources = values.get("WEBHOOK_SOURCES", "").split(",")
    # A setting of docs/configuration.md's table, or one of a source the example names (WEBHOOK_<NAME>_...).
    readme = (ROOT / "docs" / "configuration.md").read_text()  # the settings table
    unknown = [n for n in values if n not in SETTINGS and f"| `{n}` |" not in readme
               and not any(n.startswith(f"WEBHOOK_{source.upper()}_") for source in sources if source)]
    assert "WEBHOOK_SECRET" in values and unknown == []
    assert "webhook-ledger.env" in (ROOT / ".gitignore").read_text().splitlines()  # it holds the secrets


def test_the_daily_audit_is_off_by_default_and_shares_the_apps_settings_and_redis():
    audit = SERVICES["audit"]
    # `docker compose up` starts only the services of no profile: the audit is not one of them.
    assert [name for name, service in SERVICES.items() if "profiles" in service] == ["audit"]
    assert audit["profiles"] == ["audit"]
    assert (audit["env_file"], audit["environment"]) == (SERVICES["app"]["env_file"], SERVICES["app"]["environment"])
    for needed, condition in (("migrate", "service_completed_successfully"), ("postgres", "service_healthy"),
                              ("redis", "service_healthy")):  # Redis: the request budget every host shares
        assert audit["depends_on"][needed]["condition"] == condition
    shell, flag, script = audit["command"]
    assert (shell, flag) == ("sh", "-c") and "flask --app app audit default;" in script
    assert "sleep 86400" in script  # daily, as deploy/systemd/webhook-ledger-audit@.timer
    # compose passes the script as it is ($$ would be its escape of a $): the shell reads it.
    assert "$" not in script
    subprocess.run(["sh", "-n", "-c", script], check=True)


@pytest.mark.unit
def test_only_the_proxy_is_published_in_front_of_the_apps_port():
    exposed = re.search(r"^EXPOSE (\d+)$", DOCKERFILE, re.M).group(1)
    bind = re.search(r"^ENV BIND=0\.0\.0\.0:(\d+)$", DOCKERFILE, re.M).group(1)
    assert exposed == bind
    published = {name: service["ports"] for name, service in SERVICES.items() if "ports" in service}
    assert published == {"proxy": ["127.0.0.1:8080:8080"]}
    proxy = SERVICES["proxy"]
    assert SERVICES["app"]["expose"] == [exposed]
    assert proxy["environment"]["HAPROXY_BIND"] == "0.0.0.0:8080"
    assert {proxy["environment"][f"APP_HOST_{i}"] for i in (1, 2, 3)} == {f"app:{exposed}"}
    assert proxy["volumes"] == ["./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    assert proxy["depends_on"]["app"]["condition"] == "service_healthy"


def test_the_proxy_image_is_the_haproxy_major_version_the_tests_run():
    haproxy = packages.find("haproxy")
    if not haproxy:
        pytest.skip("haproxy not installed")
    version = subprocess.run([haproxy, "-v"], capture_output=True, text=True, check=True).stdout
    major = re.search(r"version (\d+\.\d+)", version)[1]
    assert SERVICES["proxy"]["image"] == f"haproxy:{major}"
