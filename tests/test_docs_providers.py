"""The provider pages (docs/providers/) stay true to the code: each page's event table lists exactly its provider's
rules, every page has the same headings in the same order, and links into and out of the pages find their heading."""

import re

import pytest

from app.providers import PROVIDERS as REGISTRY
from app.providers import RULES
from devservers import ROOT, readme

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit


PROVIDERS = ROOT / "docs" / "providers"


def rule_types():
    """{page: the event types its table must list}, from the registry: a provider's page is named after its scheme,
    and the schemes of no one provider share generic.md."""
    pages: dict[str, set[str]] = {}
    for scheme, provider in REGISTRY.items():
        page = f"{scheme}.md" if (PROVIDERS / f"{scheme}.md").exists() else "generic.md"
        pages.setdefault(page, set()).update(provider.rules)
    return pages
HEADINGS = ["Configure", "What it signs", "What is fetched", "Its events and what each does", "Reconcile and audit",
            "Limits", "Sources"]
MOST_LINES = 420  # "at most about 400" (issue 45)
EVENT_TYPE = re.compile(r"`([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)+)`")


def _section(text, heading):
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table_types(page):
    """The event types the first column of the page's event table names."""
    rows = [line for line in _section(page.read_text(), HEADINGS[3]).splitlines() if line.startswith("|")]
    assert rows[0].startswith("| event type |"), f"{page.name}: its events are a table: | event type | ... |"
    return {name for row in rows[2:] for name in EVENT_TYPE.findall(row.split("|")[1])}


@pytest.mark.parametrize("name", sorted(rule_types()))
def test_the_event_table_lists_exactly_the_providers_rules(name):
    assert table_types(PROVIDERS / name) == rule_types()[name]


def test_every_rule_is_on_a_providers_page():
    assert set().union(*rule_types().values()) == set(RULES)


@pytest.mark.parametrize("name", sorted(rule_types()))
def test_every_provider_page_has_the_same_headings_in_the_order_its_code_reads(name):
    text = (PROVIDERS / name).read_text()
    assert re.findall(r"^## (.+)$", text, re.M) == HEADINGS
    assert len(text.splitlines()) <= MOST_LINES


def slug(heading):
    """The anchor a heading gets where the docs are read (GitHub): lower case, punctuation dropped, spaces as -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # a `#` in a block is no heading
    return {slug(heading) for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page):
    """(target page, anchor or None) of each relative markdown link of page."""
    for target, anchor in re.findall(r"\]\(((?!https?:)[^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
        yield (page.parent / target).resolve() if target else page, anchor or None


def test_links_into_and_out_of_the_provider_pages_find_their_page_and_heading():
    pages = set(readme.DOCS) | set(PROVIDERS.glob("*.md"))
    broken = [f"{page.relative_to(ROOT)}: {target.relative_to(ROOT)}#{anchor}"
              for page in pages for target, anchor in links(page)
              if (PROVIDERS in (page.parent, target.parent) or target == ROOT / "docs" / "providers.md")
              and (not target.exists() or anchor and target.suffix == ".md" and anchor not in anchors(target))]
    assert broken == []
