"""One version everywhere: app.__version__, the package's metadata, the image's label, openapi.json, the changelog's
newest release and GET /health."""

import configparser
import json
import re

import pytest

from app import __version__
from devservers import ROOT

pytestmark = pytest.mark.unit


def test_the_package_takes_its_version_from_the_app():
    metadata = configparser.ConfigParser()
    metadata.read(ROOT / "setup.cfg")
    assert metadata["metadata"]["version"] == "attr: app.version.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_the_image_label_says_the_version():
    labels = re.findall(r'org\.opencontainers\.image\.version="([^"]+)"', (ROOT / "Dockerfile").read_text())
    assert labels == [__version__]


def test_the_openapi_document_says_the_version():
    assert json.loads((ROOT / "app" / "receiver" / "openapi.json").read_text())["info"]["version"] == __version__


def test_the_changelogs_newest_release_is_the_version():
    releases = re.findall(r"^## (\d+\.\d+\.\d+) - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases[0] == __version__


def test_health_says_the_version(make_app):
    app = make_app({"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "REDIS_URL": "redis://127.0.0.1:1/0",
                    "WEBHOOK_SECRET": "whsec_version"})
    assert app.test_client().get("/health").json == {"status": "ok", "version": __version__}
