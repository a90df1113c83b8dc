"""The README and the settings table stay true: every setting in docs/configuration.md's table, with the code's
default; the README's curl is make run's."""

import re

import pytest

from app.settings.config import SETTINGS
from devservers import ROOT
from devservers.demo import DEMO_SECRET, DEMO_USER

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

README = (ROOT / "README.md").read_text()
SETTINGS_TABLE = (ROOT / "docs" / "configuration.md").read_text()


def _table_defaults():
    """Each setting's default, from the groups' tables: | setting | default | what it does |."""
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*?) \| .* \|$", SETTINGS_TABLE, re.M)
    return {name: default for name, default in rows}


def test_every_setting_is_documented_with_its_default():
    documented = _table_defaults()
    for name, (_, default, _) in SETTINGS.items():
        assert name in documented, f"{name} missing from settings table (docs/configuration.md)"
        if default == "":
            assert "none" in documented[name], name
        elif default is not None:
            assert f"`{default}`" in documented[name], (name, default, documented[name])
        else:
            assert "required" in documented[name], name


def test_readme_curl_example_matches_make_run():
    assert DEMO_SECRET == "dev-secret-change-me" and DEMO_SECRET in README
    assert DEMO_USER in README


def test_every_test_that_docs_design_names_exists():
    """docs/design.md lists the tests that prove each invariant: a renamed or split test must be renamed there too."""
    design = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", design))
    assert named, "docs/design.md names no test"
    missing = [f"{path}::{name}" for path, name in sorted(named)
               if not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M)]
    assert not missing, missing
