"""docker-compose.yml, read (no container engine runs compose here; the
image itself is built and run by test_image.py): the image is built once and
reused by `migrate`, never pulled; no service repeats the image's CMD; the
app's stop grace period outlasts gunicorn's graceful timeout; PostgreSQL is
the major version the tests run; the schema is applied before the app
starts; every setting passed is one the app knows; the published port is the
image's."""

import json
import re

import psycopg
import pytest
import yaml

from app.config import SETTINGS
from devservers import ROOT

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
    assert set(app_image_services()) == {"app", "migrate"}
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
@pytest.mark.parametrize("name", ["migrate", "app"])
def test_every_setting_passed_is_one_the_app_reads(name):
    environment = SERVICES[name]["environment"]
    assert set(environment) <= set(SETTINGS), set(environment) - set(SETTINGS)
    assert {"DATABASE_URL", "REDIS_URL", "WEBHOOK_SECRET"} <= set(environment)


@pytest.mark.unit
def test_the_published_port_is_the_images():
    exposed = re.search(r"^EXPOSE (\d+)$", DOCKERFILE, re.M).group(1)
    bind = re.search(r"^ENV BIND=0\.0\.0\.0:(\d+)$", DOCKERFILE, re.M).group(1)
    assert exposed == bind
    assert SERVICES["app"]["ports"] == [f"127.0.0.1:{exposed}:{exposed}"]
