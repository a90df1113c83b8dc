"""Reading in pages when behind: the records of many waiting notifications of one source read from pages of its
provider's lists (its Fetcher, when a PagedFetcher), then applied by the drain through the same fetch path a single
read takes (docs/design.md, "The provider's pace")."""

from collections.abc import Sequence

from ..core.provider import PagedFetcher
from ..intake.events import Event, StoredBodyError, stored_event
from ..store.waiting import Claimed
from .fetch import Providers


def read(calls: Providers, claimed: Sequence[Claimed]) -> dict[tuple[str, str], bytes]:
    """The records of claimed found in pages, by (source, event id); one not found (or a page its provider could not
    answer) is absent, and read singly by the drain."""
    by_source: dict[str, tuple[PagedFetcher, list[Event]]] = {}
    for item in claimed:
        placed = _placed(calls, item)
        if placed is not None:
            name, fetcher, event = placed
            by_source.setdefault(name, (fetcher, []))[1].append(event)
    found: dict[tuple[str, str], bytes] = {}
    for fetcher, events in by_source.values():
        listed = fetcher.listed(events)
        found.update(((event.source, event.id), listed[event.id]) for event in events if event.id in listed)
    return found


def pageable(calls: Providers, item: Claimed) -> bool:
    """Whether item's record is one a page of its provider's lists could carry."""
    return _placed(calls, item) is not None


def _placed(calls: Providers, item: Claimed) -> tuple[str, PagedFetcher, Event] | None:
    """The source that reads item's record in pages, its fetcher, and item's event; None: read singly."""
    source = calls.serving(item.source)
    fetcher = None if source is None else calls.fetchers.get(source.name)
    if source is None or not isinstance(fetcher, PagedFetcher):
        return None
    try:
        event = stored_event(item.source, item.event_id, item.event_type, item.body, item.payload_sha256)
    except StoredBodyError:
        return None  # the drain says why, singly
    return (source.name, fetcher, event) if fetcher.pageable(event) else None
