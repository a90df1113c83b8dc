"""What the README tells a user to type, read from the README itself, for
the tests and checks that do as a user would: its Debian prerequisites and
its signed curl smoke test."""

import re

from . import ROOT

README = ROOT / "README.md"
SMOKE_URL = "http://127.0.0.1:8000"  # where the README's curl sends its delivery


def _section(title):
    return README.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _apt_packages(text):
    return [name for line in re.findall(r"`apt-get install ([^`]+)`", text) for name in line.split()]


def prerequisites():
    """The Debian packages the README asks for: the two commands', then the smoke test's."""
    return _apt_packages(_section("The two commands")) + _apt_packages(_section("Smoke test with curl"))


def smoke_test(base_url=SMOKE_URL):
    """The README's curl command (a bash script), sending to base_url instead of make run's port."""
    script = re.search(r"```sh\n(.*?)```", _section("Smoke test with curl"), re.S).group(1)
    if SMOKE_URL not in script:
        raise ValueError(f"the README's curl no longer sends to {SMOKE_URL}")
    return script.replace(SMOKE_URL, base_url)
