"""requirements.lock (the image's) and requirements-test.lock (CI's and
`make test`'s) stay true to setup.cfg: every range is met by its pin, the two
files pin the same versions, every pin is hash-checked, and nothing points at
this machine (PIP_FIND_LINKS and a local index are set here)."""

import configparser
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devservers import ROOT

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

LOCKS = {"runtime": ROOT / "requirements.lock", "test": ROOT / "requirements-test.lock"}
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\;]+)", re.M)


def pins(path):
    return {canonicalize_name(name): version for name, version in PIN.findall(path.read_text())}


def declared(extra=None):
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    text = setup["options.extras_require"][extra] if extra else setup["options"]["install_requires"]
    lines = (line.split("#")[0].strip() for line in text.splitlines())
    return [Requirement(line) for line in lines if line]


@pytest.mark.parametrize(("lock", "requirements"), [
    ("runtime", declared()),
    ("test", declared() + declared("test")),
])
def test_every_declared_range_is_met_by_its_pin(lock, requirements):
    pinned = pins(LOCKS[lock])
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not in {LOCKS[lock].name}: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"{LOCKS[lock].name} pins {name}=={pinned[name]}, setup.cfg asks {requirement}: run `make lock`"


def test_both_locks_pin_the_same_versions():
    runtime, test = pins(LOCKS["runtime"]), pins(LOCKS["test"])
    assert {name: test.get(name) for name in runtime} == runtime


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_is_hashed(lock):
    text = LOCKS[lock].read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 1)[1])
    pinned = [entry for entry in entries if PIN.match(entry)]
    assert len(pinned) == len(pins(LOCKS[lock])) > 10
    for entry in pinned:
        assert "--hash=sha256:" in entry, entry.splitlines()[0]


@pytest.mark.parametrize("lock", LOCKS)
def test_nothing_in_a_lock_points_at_this_machine(lock):
    commands = [line for line in LOCKS[lock].read_text().splitlines() if not line.startswith("#")]
    for line in commands:
        assert not re.search(r"file:|/opt/|--find-links|--index-url|--extra-index-url|^-e ", line), line
