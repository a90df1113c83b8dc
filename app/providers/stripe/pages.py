"""A backlog read in pages (Records.listed, for app/receiver/pages.py): the records of many waiting notifications
read from a page of Stripe's lists, List Events or a thin event's object list, not one request each
(docs/design.md, "The provider's pace")."""

import json
import logging
import math
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ...core.errors import NoSlotError, OverBudgetError, ProviderUnavailableError
from ...core.vocabulary import Event, InvalidJSONError, load
from .accounts import account_of, is_account, is_thin
from .api import LISTS, StripeAPI
from .thin import related_object

log = logging.getLogger(__name__)

# Stripe's largest page: `limit` 1 to 100 (https://docs.stripe.com/api/pagination).
PAGE = 100
# A group (one list and account) is read in pages from a page's worth of notifications: below it, its single reads
# cost fewer requests than PAGED_AFTER and are exact, while a list also holds the merchant's other objects and
# events, so a page could find few of the group's records and save little.
PAGED_AFTER = PAGE
# A thin event's object was created before its event (a PaymentIntent at checkout, a Refund when asked for): the
# pages list the objects created from this long before the group's oldest event to its newest. One created earlier
# (a Charge refunded days after its payment) is not in them and is read singly.
LOOKBACK_SECONDS = 3600
# A group's pages cost at most one request per this many of its records, found or not: a list also carries the
# merchant's other records (and, newest first, objects created before the group's newest event whose own events
# come later), so a group may need several pages per page of its own; past this bound reading in pages could no
# longer keep a backlog under 0.1 requests a record, and what is left is read singly.
RECORDS_PER_PAGE = 10
# Stripe's `types` takes at most 20 names (https://docs.stripe.com/api/events/list); a group of more lists every type.
MAX_TYPES = 20


class Wanted(NamedTuple):
    """A waiting notification whose record a group's pages may carry."""

    event_id: str  # read()'s answer's key
    record_id: str  # the record's id in the list: the event's own, or a thin event's related object's
    created: int  # Unix seconds: the event's creation
    event_type: str


class Group(NamedTuple):
    """The notifications one list answers for: their source, the list (LISTS' key) and account."""

    source: str  # in log lines
    listed: str
    account: str | None  # Stripe-Account: a fetched event's connected account
    context: str | None  # Stripe-Context: a thin event's account context


def read(api: StripeAPI, events: Sequence[Event], every_event: bool) -> dict[str, bytes]:
    """The records of events found in pages, by event id, for each group of at least PAGED_AFTER; a record not found
    (or a page Stripe could not answer) is absent, and read singly by the drain."""
    groups: dict[Group, list[Wanted]] = {}
    for event in events:
        placed = wanted(event, every_event)
        if placed is not None:
            groups.setdefault(placed[0], []).append(placed[1])
    found: dict[str, bytes] = {}
    for group, of_group in groups.items():
        if len(of_group) >= PAGED_AFTER:
            found.update(_read_group(api, group, of_group))
    return found


def wanted(event: Event, every_event: bool) -> tuple[Group, Wanted] | None:
    """The group event's record is listed in, and what is wanted of it; None: read singly."""
    if is_thin(event.document):
        related, created = related_object(event), _unix(event.document.get("created"))
        if related is None or created is None:
            return None
        return Group(event.source, related.type, None, related.context), \
            Wanted(event.id, related.id, created, event.type)
    account, created = account_of(event), event.document.get("created")
    if not every_event or not isinstance(created, int) or isinstance(created, bool) \
            or account is not None and not is_account(account):
        return None
    return Group(event.source, "event", account, None), Wanted(event.id, event.id, created, event.type)


def _unix(created: object) -> int | None:
    """A thin event's `created` (RFC 3339, https://docs.stripe.com/api/v2/core/events/object) in Unix seconds."""
    if not isinstance(created, str):
        return None
    try:
        return math.floor(datetime.fromisoformat(created).timestamp())
    except ValueError:
        return None


def _read_group(api: StripeAPI, group: Group, wanted: list[Wanted]) -> dict[str, bytes]:
    """Page through group's list over its notifications' creation times, newest first, until every record is found,
    the list ends, or one page per RECORDS_PER_PAGE of its records was read."""
    by_record: dict[str, list[Wanted]] = {}
    for one in wanted:
        by_record.setdefault(one.record_id, []).append(one)
    thin = group.listed != "event"
    low = min(one.created for one in wanted) - (LOOKBACK_SECONDS if thin else 0)
    params = [("limit", str(PAGE)), ("created[gte]", str(low)),
              ("created[lte]", str(max(one.created for one in wanted)))]
    types = sorted({one.event_type for one in wanted})
    if not thin and len(types) <= MAX_TYPES:
        params += [("types[]", name) for name in types]
    expected = "event" if not thin else group.listed
    found: dict[str, bytes] = {}
    left, after = set(by_record), None
    for _ in range(math.ceil(len(by_record) / RECORDS_PER_PAGE)):
        page = _page(api, group, params + ([("starting_after", after)] if after else []))
        if page is None:
            break
        records, has_more = page
        for record in records:
            record_id = record.get("id")
            # A record of another kind or account than the single read's is not taken: that read decides it.
            if record_id in left and record.get("object") == expected \
                    and (thin or record.get("account") == group.account):
                left.discard(record_id)
                body = json.dumps(record, separators=(",", ":")).encode()
                found.update((one.event_id, body) for one in by_record[record_id])
        if not left or not has_more or not records or not isinstance(records[-1].get("id"), str):
            break
        after = records[-1]["id"]
    log.info("drain: read %d of %d records of source %s in pages of %s", len(by_record) - len(left), len(by_record),
             group.source, LISTS[group.listed])
    return found


def _page(api: StripeAPI, group: Group, params: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], bool] | None:
    """One page's records and has_more, waiting for the budget and a slot as a single read does; None when Stripe
    could not answer it as a list (its records are then read singly, which says why)."""
    while True:
        try:
            body = api.page(group.listed, params, group.account, group.context)
            break
        except OverBudgetError as exc:
            time.sleep(exc.wait_seconds)
        except NoSlotError:
            time.sleep(0.05)
        except ProviderUnavailableError as exc:
            log.warning("drain: a page of %s for source %s could not be read (%s): read singly",
                        LISTS[group.listed], group.source, exc)
            return None
    try:
        document = load(body)
    except InvalidJSONError:
        document = {}
    records, has_more = document.get("data"), document.get("has_more")
    if document.get("object") != "list" or not isinstance(records, list) or not isinstance(has_more, bool):
        log.warning("drain: Stripe answered a page of %s that is not a list: read singly", LISTS[group.listed])
        return None
    return [record for record in records if isinstance(record, dict)], has_more
