"""scripts/bench.py (`make bench`) installs nothing on the host: a program it
needs and cannot find stops it at once, with one line naming the Debian
packages to install (devservers/packages.py's "bench" group)."""

import subprocess
import sys

import pytest

from devservers import ROOT

pytestmark = pytest.mark.core  # runs scripts/bench.py: a process of its own (docs/testing.md)


def _bench_without_its_programs(tmp_path):
    """`make bench`'s script on a PATH that holds none of its programs; its temporary folders go in tmp_path/tmp."""
    (tmp_path / "tmp").mkdir()
    return subprocess.run([sys.executable, "scripts/bench.py"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": str(tmp_path), "BENCH_PEER": "off", "HOME": str(tmp_path),
                               "TMPDIR": str(tmp_path / "tmp")})


def test_a_missing_program_is_named_in_one_line(tmp_path):
    done = _bench_without_its_programs(tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "bench: missing Debian packages: wrk (as root: apt-get install wrk)\n"


def test_a_missing_program_stops_the_bench_before_anything_starts(tmp_path):
    done = _bench_without_its_programs(tmp_path)
    assert done.stdout == ""
    assert list((tmp_path / "tmp").iterdir()) == []  # not even the bench's own folders were made
