"""The README stays true: every setting in its table, with the code's default."""

import re

import pytest

from app.config import SETTINGS
from devservers import ROOT

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

README = (ROOT / "README.md").read_text()


def _table_defaults():
    rows = re.findall(r"^\| `([A-Z_]+)` \| .* \| (.*) \|$", README, re.M)
    return {name: default for name, default in rows}


def test_every_setting_is_documented_with_its_default():
    documented = _table_defaults()
    for name, (_, default) in SETTINGS.items():
        assert name in documented, f"{name} missing from README's configuration table"
        if default == "":
            assert "none" in documented[name], name
        elif default is not None:
            assert f"`{default}`" in documented[name], (name, default, documented[name])
        else:
            assert "required" in documented[name], name


def test_readme_curl_example_matches_make_run():
    script = (ROOT / "scripts" / "run.py").read_text()
    assert "dev-secret-change-me" in script and "dev-secret-change-me" in README
    assert "00000000-0000-4000-8000-000000000001" in script
