"""devservers/packages.py stays the one list: every program that the tests,
devservers and the scripts run by name is in it (or is Python, bash, or
PostgreSQL's, found by pg_bindir), and its names are real Debian packages'
programs on this machine once `make test` has run."""

import re

import pytest

from devservers import ROOT
from devservers.packages import BENCH, GROUPS, IMAGE, SERVERS, find, image_test_skipped

pytestmark = pytest.mark.deploy

SOURCES = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("devservers/*.py"), *ROOT.glob("scripts/*.py")]
# Run by name but not installed by the list: the shell, and apt itself.
NOT_LISTED = {"bash", "sh", "apt-get", "git", "env", "flask"}  # shells, apt, git, coreutils; flask: the venv's
CALLS = [re.compile(r'program\("([\w.-]+)"\)'), re.compile(r'subprocess\.(?:run|Popen)\(\s*\["([\w.-]+)"')]


def programs_run():
    found = {}
    for path in SOURCES:
        for pattern in CALLS:
            for name in pattern.findall(path.read_text()):
                found.setdefault(name, path.relative_to(ROOT))
    return found


@pytest.mark.unit
def test_every_program_run_by_name_is_listed():
    listed = {**SERVERS, **IMAGE, **BENCH}
    unlisted = {name: str(where) for name, where in programs_run().items()
                if name not in listed and name not in NOT_LISTED}
    assert unlisted == {}, "add them to devservers/packages.py"
    assert {"haproxy", "pgbouncer", "redis-cli", "podman", "wrk"} <= set(programs_run())


@pytest.mark.unit
def test_cluster_needs_a_subset_of_the_tests():
    assert set(GROUPS["cluster"].items()) <= set(GROUPS["test"].items())


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_each_server_program_is_installed(name):
    """`make test` installed it before pytest ran (or said it could not and stopped)."""
    assert find(name), f"{name} (Debian package {SERVERS[name]}) is not installed"


@pytest.mark.skipif(image_test_skipped(), reason="IMAGE_TEST=skip")
@pytest.mark.parametrize("name", sorted(IMAGE))
def test_each_image_test_program_is_installed_where_podman_may_run(name):
    assert find(name), f"{name} (Debian package {IMAGE[name]}) is not installed: the image test would be skipped"
