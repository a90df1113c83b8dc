"""What the docs tell a user to type, read from the pages themselves, for
the tests and checks that do as a user would: the README's Debian
prerequisites and its signed curl smoke test, and every shell block of the
README and docs/ with the answers shown after it
(tests/test_docs_examples.py runs them; docs/testing.md says how)."""

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

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


# -- every example of the docs ---------------------------------------------------------

DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]  # docs/providers/ holds a page per provider
SHELLS = ("sh", "bash", "shell")  # the fences whose blocks are run
ANSWER = "output"  # the fence of an answer: what the shell block before it prints
# Before a block that is not run: `<!-- example: not run, because <why> -->`,
# or `<!-- example: run by tests/[deploy/]<module>.py <how> -->` for one a test module runs itself.
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->\s*\Z", re.S)
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MAKE_RUN = re.compile(r"(?:^|\s)make run(?:\s|$)")
# What a block a reader pastes must never do: delete what make run keeps in .run/ (their ledger, its cluster).
# make run keeps a ledger per LEDGER_CURRENCY, so a page in rupees needs no empty cluster.
DELETES_READERS_DATA = re.compile(r"\brm\s+-\w*\s+[^\n;&|]*\.run\b|\bmake\s+clean\b")


@dataclass
class Example:
    """A shell block of a page: where it is, its script, the answers shown after it, and why it is not run."""

    page: Path
    line: int
    script: str
    answers: list[str] = field(default_factory=list)
    exempt: str | None = None  # the marker's text

    @property
    def where(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def service_settings(self):
        """The settings of a block that starts the service (`NAME=value ... make run`), else None."""
        commands = [line for line in _commands(self.script) if line]
        if not any(_MAKE_RUN.search(line) for line in commands):
            return None
        settings = {}
        for command in commands:
            words = shlex.split(command)
            if words[-2:] != ["make", "run"] or not all("=" in word for word in words[:-2]):
                raise ValueError(f"{self.where}: a block that starts `make run` holds only `NAME=value ... make run`"
                                 f" lines, not {command!r}")
            settings = dict(word.split("=", 1) for word in words[:-2])
        return settings


def _commands(script):
    """The script's command lines: continuations joined, comments and blank lines left out."""
    joined = script.replace("\\\n", " ")
    return [re.sub(r"(^|\s)#.*$", "", line).strip() for line in joined.splitlines()]


def examples(page):
    """Every shell block of page, in order, with the answers shown after it."""
    text = page.read_text()
    found, last = [], None
    for fence in _FENCE.finditer(text):
        lang, body = fence.group(1), fence.group(2)
        line = text.count("\n", 0, fence.start()) + 1
        if lang == ANSWER:
            if last is None:
                raise ValueError(f"{page.relative_to(ROOT)}:{line}: an ```{ANSWER} block answers the shell block"
                                 " before it, and there is none")
            last.answers.append(body)
            continue
        last = None
        if lang in SHELLS:
            before = text[:fence.start()].rstrip().rsplit("\n\n", 1)[-1]
            marker = MARKER.search(before)
            last = Example(page, line, body, exempt=marker.group(1) if marker else None)
            found.append(last)
    return found


DEPLOYING = ROOT / "docs" / "deploying.md"
HOST_PREFIX = "/opt/webhook-ledger"  # where deploying.md installs the wheel


def wheel_install():
    """docs/deploying.md's install of the wheel, as printed: (the checkout's build lines, the host's install lines)."""
    section = DEPLOYING.read_text().split("## With gunicorn\n", 1)[1]
    script = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    lines = [line for line in _commands(script) if line]
    build = [line for line in lines if line.startswith("pip wheel ")]
    host = [line for line in lines if line.startswith((f"python3 -m venv {HOST_PREFIX}", f"{HOST_PREFIX}/bin/pip "))]
    if not build or len(host) < 2:
        raise ValueError(f"docs/deploying.md's install no longer builds and installs the wheel: {lines}")
    return build, host
