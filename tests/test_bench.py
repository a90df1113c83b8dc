"""scripts/bench.py (`make bench`) installs nothing on the host: a program it
needs and cannot find stops it at once, with one line naming the Debian
packages to install (devservers/packages.py's "bench" group)."""

import subprocess
import sys

import pytest

from devservers import ROOT

pytestmark = pytest.mark.unit


def test_a_missing_program_is_named_in_one_line_and_nothing_starts(tmp_path):
    done = subprocess.run([sys.executable, "scripts/bench.py"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": str(tmp_path), "BENCH_PEER": "off", "HOME": str(tmp_path)})
    assert done.returncode == 1, done.stderr
    assert done.stderr == "bench: missing Debian packages: wrk (as root: apt-get install wrk)\n"
    assert done.stdout == ""
