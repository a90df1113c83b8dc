"""Every shell block of README.md and docs/*.md runs as printed, and answers what the page shows.

A page is one terminal session against a real stack: a fresh database, the
tests' Redis, and `make run`'s own script serving on a free port, which the
blocks' `127.0.0.1:8000` is replaced with (as devservers/readme.py does for
the README's curl; the ports and folders of PayPal's and Stripe's local
stand-ins likewise, and `.run/env`: make run's folder is the page's, never the checkout's .run/). A block
`NAME=value ... make run` (re)starts it with those settings, on the
page's database of its LEDGER_CURRENCY (make run keeps one per currency), with an empty Redis as
make run's; a page's first other block starts it as plain `make run` does.
The pages run alone (each from an empty ledger), and then all of them one
after another in the order the README's "Where to read on" lists them, in
one session on one ledger, as a reader who follows them does.
The other blocks run in bash, one after the other, keeping the variables and
functions the earlier ones set, with the service's settings in the
environment (as where the app's environment is set); each `output` block
after one is the answer of one run of it, compared line by line (`...`
stands for any text, or alone on a line for any lines). A block without an
answer must exit 0 and print nothing: what a block prints, the page shows.
What a block leaves running in the background is stopped when the page
ends. docs/testing.md says how to write one."""

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
import redis

from app.intake.events import RULES
from app.providers import stripe
from devservers import ROOT, free_port, readme, wait_until
from devservers.demo import DEMO_SECRET

from .helpers import checkout_run_state, db_url, http_get

pytestmark = pytest.mark.core

PAGES = [page for page in readme.DOCS if any(not e.exempt for e in readme.examples(page))]
MAKE_RUN_PORT = "127.0.0.1:8000"  # where the docs' examples find `make run`
# Where the docs' PayPal and Stripe recipes find devservers/paypal_local.py's and stripe_local.py's stand-ins and
# files, and the variables that move them: each page's are its own, so that pages and checkouts tested at once do
# not share them.
STAND_INS = {"localhost:8443": "PAYPAL_LOCAL_CERT_PORT", "127.0.0.1:8088": "PAYPAL_LOCAL_API_PORT",
             ".run/paypal": "PAYPAL_LOCAL_DIR", "127.0.0.1:12111": "STRIPE_LOCAL_PORT",
             ".run/stripe": "STRIPE_LOCAL_DIR"}
BLOCK_TIMEOUT = 60  # a block is a few commands on loopback
# Settings of the test process that are not the page's: the service gets those its blocks give.
NOT_INHERITED = ("WEBHOOK_", "DATABASE_URL", "REDIS_", "STRIPE_", "LEDGER_", "FLASK_", "PROMETHEUS_", "PORT",
                 "BIND", "PG_", "VIRTUAL_ENV")
# What a session keeps from one block to the next: what the block set, not bash's own variables.
KEEP_STATE = textwrap.dedent("""\
    __keep() {
      local __rc=$?
      { declare -p $(compgen -v | grep -v '^__' | grep -vxF -f "$__BASH_OWN"); declare -f; } >"$__STATE" 2>/dev/null
      exit $__rc
    }
    source "$__STATE"
    trap __keep EXIT
    source "$__SCRIPT"
""")


def matches(expected, actual):
    """Whether actual is the answer expected shows: lines compared without trailing spaces, `...` any text."""
    lines = [line.rstrip() for line in expected.strip("\n").splitlines()]
    pattern = "".join(r"(?:[^\n]*\n)*?" if line == "..." else re.escape(line).replace(r"\.\.\.", r"[^\n]*") + r"\n"
                      for line in lines)
    got = "".join(line.rstrip() + "\n" for line in actual.strip("\n").splitlines())
    return re.fullmatch(pattern, got) is not None


class Session:
    """One page's terminal: the service as `make run` starts it, and the shell's state between blocks."""

    def __init__(self, postgresql, redis_url, workdir):
        self.port = free_port()
        self.base_env = {name: value for name, value in os.environ.items() if not name.startswith(NOT_INHERITED)}
        self.base_env["PATH"] = f"{Path(sys.executable).parent}:{self.base_env.get('PATH', '/usr/bin:/bin')}"
        self.postgresql = postgresql
        self.databases = {"usd": db_url(postgresql)}  # by currency, as make run keeps them (devservers/run_dir.py)
        self.servers = {"DATABASE_URL": self.databases["usd"], "REDIS_URL": redis_url}
        self.places = {MAKE_RUN_PORT: f"127.0.0.1:{self.port}", "localhost:8000": f"localhost:{self.port}"}
        for place, variable in STAND_INS.items():
            folder = variable.endswith("_DIR")
            value = str(workdir / place.rsplit("/", 1)[1]) if folder else str(free_port())
            self.base_env[variable] = value
            self.places[place] = value if folder else f"{place.split(':')[0]}:{value}"
        # make run's folder (its env file, metrics), the page's own: never the checkout's .run/, the user's.
        self.base_env["MAKE_RUN_DIR"] = str(workdir / "make-run")
        self.places[".run/env"] = str(workdir / "make-run" / "env")
        self.groups = []  # the process group of each block run: what it left running is stopped at the end
        self.dir = workdir
        self.state = workdir / "state.sh"
        self.state.write_text("")
        self.bash_own = workdir / "bash-own"
        self.bash_own.write_text(subprocess.run(["bash", "-c", "compgen -v"], env={}, capture_output=True,
                                                text=True, check=True).stdout)
        self.service, self.settings, self.log = None, None, workdir / "make-run.log"

    def here(self, text):
        """text with the docs' ports and folders replaced by this page's."""
        for place, value in self.places.items():
            text = text.replace(place, value)
        return text

    def make_run(self, settings):
        """`make run` with settings, as `make run` execs it (scripts/run.py), on this page's servers and port: on the
        database of its LEDGER_CURRENCY (a new one for a currency not seen yet, as make run's cluster gets), and with
        an empty Redis, as make run's own redis-server starts."""
        self.stop()
        currency = (settings.get("LEDGER_CURRENCY") or "usd").strip().lower()
        if currency not in self.databases:
            name = f"{self.postgresql.info.dbname}_{currency}"
            info = self.postgresql.info
            with psycopg.connect(host=info.host, port=info.port, user=info.user, dbname="postgres",
                                 autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name}")
                conn.execute(f"CREATE DATABASE {name}")
            self.databases[currency] = f"postgresql://{info.user}@{info.host}:{info.port}/{name}"
        self.servers["DATABASE_URL"] = self.databases[currency]
        with redis.Redis.from_url(self.servers["REDIS_URL"]) as client:
            client.flushall()
        settings = {name: self.here(value) for name, value in settings.items()}
        env = {**self.base_env, **self.servers, **settings, "PORT": str(self.port)}
        self.service = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env=env,
                                        stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.settings = {"WEBHOOK_SECRET": DEMO_SECRET, **settings}  # make run's demo secret unless one is set
        wait_until(self._up, timeout=60, what=f"make run {settings} (its log: {self.log})")

    def _up(self):
        if self.service.poll() is not None:
            raise RuntimeError(f"make run exited {self.service.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            return http_get(f"http://127.0.0.1:{self.port}", "/health", timeout=1)[0] == 200
        except OSError:
            return False

    def run(self, example):
        """Run the block once in bash, after the earlier ones; return (exit status, stdout and stderr)."""
        script = self.dir / "block.sh"
        script.write_text(self.here(example.script))
        env = {**self.base_env, **self.servers, **self.settings,
               "__STATE": str(self.state), "__SCRIPT": str(script), "__BASH_OWN": str(self.bash_own)}
        block = subprocess.Popen(["bash", "-c", KEEP_STATE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.groups.append(block.pid)
        output, _ = block.communicate(timeout=BLOCK_TIMEOUT)
        return block.returncode, output

    def verify(self):
        """`flask ledger verify` on each database of the page: the answers, with the settings its service last ran
        with (the currency of the last one's: LEDGER_CURRENCY, of each database in turn)."""
        answers = []
        for database in self.databases.values():
            env = {**self.base_env, **self.servers, **(self.settings or {}), "DATABASE_URL": database}
            with psycopg.connect(database) as conn:
                row = conn.execute("SELECT currency FROM ledger_currency").fetchone()
            if row:
                env["LEDGER_CURRENCY"] = row[0]
            answers.append(subprocess.run([sys.executable, "-m", "flask", "--app", "app", "ledger", "verify"],
                                          cwd=self.dir, env=env, capture_output=True, text=True,
                                          timeout=BLOCK_TIMEOUT))
        return answers

    def stop(self):
        if self.service and self.service.poll() is None:
            os.killpg(self.service.pid, signal.SIGTERM)  # Ctrl-C's way: make run stops what it started
            self.service.wait(30)
        self.service = None

    def close(self):
        """Stop the service, and what the blocks left running (as closing the terminal does)."""
        self.stop()
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass


def run_page(session, page, first=False):
    """Run every block of page in session, checking each answer; return where each ran. first: the session's first
    page, whose first block other than a `make run` starts the service as plain `make run` does."""
    ran = []
    for example in readme.examples(page):
        if example.exempt:
            continue
        settings = example.service_settings()
        if settings is not None:
            session.make_run(settings)
            ran.append(example.where)
            continue
        if first and session.service is None:
            session.make_run({})
        for number, answer in enumerate(example.answers or [None], start=1):
            status, output = session.run(example)
            run = f"{example.where} (run {number})"
            if answer is None:
                assert status == 0, f"{run} exited {status}:\n{output}"
                assert not output.strip(), f"{run} printed what the page does not show (```output):\n{output}"
            else:
                answer = session.here(answer)
                assert matches(answer, output), f"{run} answered:\n{output}\nwhere the page shows:\n{answer}"
        ran.append(example.where)
    return ran


def _listed(page, text):
    """The pages a list of links in text (of page) names, in order."""
    return [page.parent / path for path in re.findall(r"^- \[[^]]+\]\(([^)#]+)\)", text, re.M)]


def reading_order():
    """The pages with examples as a reader meets them: the README, then those its "Where to read on" lists, in order,
    an index among them (docs/providers/README.md) followed by the pages it lists."""
    section = readme.README.read_text().split("## Where to read on\n", 1)[1].split("\n## ", 1)[0]
    pages = []
    for page in _listed(readme.README, section):
        pages.append(page)
        if page.name == "README.md":
            pages += _listed(page, page.read_text())
    return [page for page in [readme.README, *pages] if page in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_example_of_the_page_runs_and_answers_what_it_shows(page, postgresql, redis_server, redis_client,
                                                                 tmp_path):
    # The schema alone, no user: `make run` adds its demo user, as on a new checkout.
    checkout_before = checkout_run_state()
    session = Session(postgresql, redis_server.url, tmp_path)
    try:
        ran = run_page(session, page, first=True)
    finally:
        session.close()
    for verified in session.verify():
        assert verified.returncode == 0, verified.stdout + verified.stderr
    assert checkout_run_state() == checkout_before, "the page's make run or blocks wrote the checkout's .run/"
    print(f"\n[docs] {page.relative_to(ROOT)}: {len(ran)} examples ran: {', '.join(ran)}")  # noqa: T201


def test_every_page_runs_after_the_ones_before_it_in_reading_order(postgresql, redis_server, redis_client, tmp_path):
    """One reader, one ledger: each page's answers hold after what the pages before it did (their users, events and
    balances kept), so no page may count on an empty ledger or reuse another page's users."""
    checkout_before = checkout_run_state()
    session = Session(postgresql, redis_server.url, tmp_path)
    pages = reading_order()
    assert set(pages) == set(PAGES), f"pages with examples the README's list does not reach: {set(PAGES) - set(pages)}"
    try:
        for number, page in enumerate(pages):
            run_page(session, page, first=number == 0)
    finally:
        session.close()
    for verified in session.verify():
        assert verified.returncode == 0, verified.stdout + verified.stderr
    assert checkout_run_state() == checkout_before, "the pages' make run or blocks wrote the checkout's .run/"


# -- what a page may hold (no server: in `make check`) -------------------------------

# What a block run as root on the test machine must never do: install packages, drive systemd, write
# under /etc or /opt. (One did, before it was marked: it replaced the machine's haproxy.cfg.)
HOST_CHANGES = re.compile(r"\b(?:apt-get|apt|dpkg|systemctl|useradd)\b|\s/(?:etc|opt)/")


@pytest.mark.unit
@pytest.mark.parametrize("page", readme.DOCS, ids=[str(page.relative_to(ROOT)) for page in readme.DOCS])
def test_a_block_that_changes_the_host_is_marked_not_run(page):
    for example in readme.examples(page):
        if example.exempt is None:
            assert not HOST_CHANGES.search(example.script), \
                f"{example.where}: it would change the test machine; mark it `<!-- example: not run, because ... -->`"


def _marker(example):
    """The match of a block's marker, group 2 the test module that runs it; None if the marker says neither
    `not run, because ...` nor `run by tests/...`."""
    return re.fullmatch(r"not run, because (.{12,})|run by (tests/(?:\w+/)*test_\w+\.py)\b.*", example.exempt,
                        re.S)


@pytest.mark.unit
@pytest.mark.parametrize("page", readme.DOCS, ids=[str(page.relative_to(ROOT)) for page in readme.DOCS])
def test_no_block_deletes_the_readers_ledger(page):
    # A reader pastes the pages one after another: a block that removes .run/ loses what the pages before it did.
    for example in readme.examples(page):
        assert not readme.DELETES_READERS_DATA.search(example.script), \
            f"{example.where}: it deletes what make run keeps in .run/ (the reader's ledger)"


@pytest.mark.unit
@pytest.mark.parametrize("page", readme.DOCS, ids=[str(page.relative_to(ROOT)) for page in readme.DOCS])
def test_a_block_not_run_says_why(page):
    for example in readme.examples(page):
        if example.exempt is not None:
            assert _marker(example), \
                f"{example.where}: the marker says neither `not run, because ...` nor `run by tests/...`"


@pytest.mark.unit
@pytest.mark.parametrize("page", readme.DOCS, ids=[str(page.relative_to(ROOT)) for page in readme.DOCS])
def test_a_block_run_elsewhere_names_a_test_that_reads_the_page(page):
    for example in readme.examples(page):
        marker = example.exempt is not None and _marker(example)
        if marker and marker.group(2):
            module = (ROOT / marker.group(2)).read_text()
            assert str(page.relative_to(ROOT)) in module, f"{example.where}: {marker.group(2)} does not read the page"


@pytest.mark.unit
@pytest.mark.parametrize("page", readme.DOCS, ids=[str(page.relative_to(ROOT)) for page in readme.DOCS])
def test_a_block_that_starts_make_run_holds_nothing_else(page):
    for example in readme.examples(page):
        if example.exempt is None:
            example.service_settings()  # a block that starts make run is only that: ValueError if it holds more


@pytest.mark.unit
@pytest.mark.parametrize(("expected", "actual", "same"), [
    ('{"status":"processed"}', '{"status":"processed"}', True),
    ('{"status":"processed"}\n', '{"status":"processed"}  \n\n', True),
    ('{"status":"processed"}', '{"status":"duplicate"}', False),
    ('{"event_id":"...","status":"processed"}', '{"event_id":"0b3e","status":"processed"}', True),
    ('{"event_id":"...","status":"processed"}', '{"event_id":"0b3e","status":"duplicate"}', False),
    ("first\n...\nlast", "first\nmore\nand more\nlast", True),
    ("first\n...\nlast", "first\nlast", True),
    ("first\nlast", "first\nmore\nlast", False),
    ("a.b", "aXb", False),
])
def test_an_answer_is_compared_line_by_line_with_dots_for_any_text(expected, actual, same):
    assert matches(expected, actual) is same


@pytest.mark.unit
def test_a_block_that_starts_make_run_gives_its_settings():
    example = readme.Example(ROOT / "README.md", 1, "A=1 B='two words' \\\n  make run   # a comment\n")
    assert example.service_settings() == {"A": "1", "B": "two words"}
    assert readme.Example(ROOT / "README.md", 1, "curl http://127.0.0.1:8000/health\n").service_settings() is None
    inr = readme.Example(ROOT / "README.md", 1, "LEDGER_CURRENCY=inr make run  # its own ledger\n")
    assert inr.service_settings() == {"LEDGER_CURRENCY": "inr"}
    with pytest.raises(ValueError, match="holds only"):
        readme.Example(ROOT / "README.md", 1, "rm -rf .run/pg\nLEDGER_CURRENCY=inr make run\n").service_settings()
    with pytest.raises(ValueError, match="holds only"):
        readme.Example(ROOT / "README.md", 1, "make run\nrm -rf .run/pg\n").service_settings()
    with pytest.raises(ValueError, match="holds only"):
        readme.Example(ROOT / "README.md", 1, "make run\nmake test\n").service_settings()


# -- the Stripe events to subscribe to ------------------------------------------------

STRIPE_PAGE = ROOT / "docs" / "providers" / "stripe.md"


def _stripe_types():
    """The Stripe snapshot event types RULES reads: those whose fields include Stripe's livemode."""
    return sorted(event_type for event_type, rule in RULES.items()
                  if rule.labels.livemode == "livemode" and event_type not in stripe.THIN_RULES)


@pytest.mark.unit
def test_providers_lists_every_stripe_event_that_rules_reads_for_the_dashboard():
    text = STRIPE_PAGE.read_text()
    section = text.split("### The events to subscribe to\n", 1)[1].split("\n#", 1)[0]
    dashboard = re.search(r"^In the Dashboard.*?\n\n", section, re.S | re.M).group(0)
    assert sorted(re.findall(r"`([a-z_.]+\.[a-z_.]+)`", dashboard)) == _stripe_types()


@pytest.mark.unit
def test_providers_stripe_listen_forwards_every_stripe_event_that_rules_reads():
    (listen,) = [e for e in readme.examples(STRIPE_PAGE)
                 if "stripe listen" in e.script and "--thin-events" not in e.script]
    events = shlex.split(listen.script.replace("\\\n", " "))
    assert sorted(events[events.index("--events") + 1].split(",")) == _stripe_types()
