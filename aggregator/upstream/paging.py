"""Following a listing's cursors: every page of resources/list (or templates/list) into one `Listing`, capped in
entries (`maxEntries`) and pages, cut short when the cursors loop.

Each page is made into the records kept as it arrives (`pages.Page`: its dicts or SDK models dropped), so a listing
holds what it keeps, not the messages; after a big one the heap is trimmed (`aggregator.heap`), since the process would
otherwise keep the peak of the largest page it ever parsed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aggregator import heap
from aggregator.upstream.answers import Listing
from aggregator.upstream.pages import Page

__all__ = ["MAX_ENTRIES", "CutNotice", "pages_for", "paginate"]

logger = logging.getLogger("aggregator.upstream")

MAX_ENTRIES = 1_000_000
"""The default cap on the entries of one listing (the manifest's `maxEntries`)."""
ENTRIES_PER_PAGE = 10
"""`maxEntries / ENTRIES_PER_PAGE` pages at most: an upstream giving tiny pages cannot keep a listing going."""


def pages_for(max_entries: int) -> int:
    """How many pages a listing capped at `max_entries` follows at most."""
    return max(1, max_entries // ENTRIES_PER_PAGE)


async def paginate(what: str, page: Callable[[str | None, int], Awaitable[Page]], max_pages: int,
                   max_entries: int) -> Listing:
    """The records of every page `page` gives (of a cursor, with the room left for records) from the first cursor
    on, at most `max_entries`; `truncated` (and `cut` says where) when cut there, past `max_pages` pages, or when a
    cursor comes again. The caller logs it (`CutNotice`)."""
    found: list[Any] = []
    ttls: list[int] = []
    scopes: set[str] = set()
    seen: set[str] = set()
    cursor: str | None = None
    parsed = 0
    cut: str | None = None
    for _ in range(max_pages):
        got = await page(cursor, max_entries - len(found))
        cursor = got.next_cursor
        parsed += got.parsed
        if got.ttl_ms is not None:
            ttls.append(got.ttl_ms)
        if got.cache_scope is not None:
            scopes.add(got.cache_scope)
        found.extend(got.items)
        del got  # only the records are kept
        if len(found) >= max_entries and (cursor is not None or parsed > max_entries):
            cut = f"at {max_entries:,} entries (maxEntries)"
            break
        if cursor is None:
            break
        if cursor in seen:
            cut = "where its cursors loop"
            break
        seen.add(cursor)
    else:
        cut = f"after {max_pages:,} pages (maxEntries/{ENTRIES_PER_PAGE})"
    if cut is not None:
        cut = f"{what} cut short {cut}: {len(found):,} entries kept, the rest not listed"
    if parsed >= heap.BIG_LISTING:
        heap.trim()
    scope = "private" if "private" in scopes else ("public" if scopes else None)
    return Listing(found, min(ttls) if ttls else None, scope, cut is not None, cut)


class CutNotice:
    """Says in the log that an upstream's listings are cut, once for as long as they are cut the same way (a
    relist every second must not log every second), again when that changes."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._said: dict[str, str | None] = {}

    def heard(self, what: str, listing: Listing) -> None:
        """A listing of `what` came: a warning if it is cut and the last one was not, or was cut otherwise."""
        if listing.cut is not None and self._said.get(what) != listing.cut:
            logger.warning("%s: %s", self.label, listing.cut)
        elif listing.cut is None and self._said.get(what) is not None:
            logger.info("%s: %s is no longer cut short", self.label, what)
        self._said[what] = listing.cut
