"""The README and the settings table stay true: every setting in docs/configuration.md's table, with the code's
default; the README's curl is make run's; every test docs/design.md and tests/proofs.py name exists."""

import re

import pytest

from app.settings.config import SETTINGS
from devservers import ROOT
from devservers.demo import DEMO_SECRET, DEMO_USER

from .proofs import PROOFS

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


def _missing(refs):
    """The refs ("tests/x.py" or "tests/x.py::test_y") whose module or top-level test function does not exist."""
    missing = []
    for ref in sorted(set(refs)):
        path, _, name = ref.partition("::")
        module = ROOT / path
        if not module.is_file() or (name and not re.search(rf"^def {name}\(", module.read_text(), re.M)):
            missing.append(ref)
    return missing


def _named_in_design():
    """Every test module and test that docs/design.md names, in backquotes."""
    design = (ROOT / "docs" / "design.md").read_text()
    return {f"{path}::{name}" if name else path
            for path, name in re.findall(r"`(tests/[\w/]+\.py)(?:::(test_\w+))?`", design)}


def test_every_test_that_docs_design_names_exists():
    """docs/design.md names the principal tests of each invariant: a renamed or split test must be renamed there."""
    named = _named_in_design()
    assert any("::" in ref for ref in named), "docs/design.md names no test"
    assert not _missing(named), _missing(named)


def test_every_test_of_the_proof_map_exists_and_holds_what_design_names():
    """tests/proofs.py holds every test of each claim of docs/design.md: each exists, and each test the page names
    is in it (the page names a few, the map all)."""
    listed = {ref for refs in PROOFS.values() for ref in refs}
    assert not _missing(listed), _missing(listed)
    named = {ref for ref in _named_in_design() if "::" in ref}
    assert named <= listed, sorted(named - listed)
    invariants = {f"Invariant {n}" for n in re.findall(r"^### Invariant (\d+)$",
                                                      (ROOT / "docs" / "design.md").read_text(), re.M)}
    assert invariants and invariants <= set(PROOFS), sorted(invariants - set(PROOFS))
