"""Following a listing's cursors: every page of resources/list (or templates/list) into one `Listing`, capped in
entries (`maxEntries`) and pages, cut short when the cursors loop.

Each page is made into the records kept (`items`) as it arrives and its SDK models dropped, so a listing holds
what it keeps, not the messages; after a big one the heap is trimmed (`aggregator.heap`), since the process would
otherwise keep the peak of the largest page it ever parsed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client

from aggregator import heap
from aggregator.upstream.answers import Listing, hints

__all__ = ["MAX_ENTRIES", "CutNotice", "pages_for", "paginate"]

logger = logging.getLogger("aggregator.upstream")

MAX_ENTRIES = 1_000_000
"""The default cap on the entries of one listing (the manifest's `maxEntries`)."""
ENTRIES_PER_PAGE = 10
"""`maxEntries / ENTRIES_PER_PAGE` pages at most: an upstream giving tiny pages cannot keep a listing going."""


def pages_for(max_entries: int) -> int:
    """How many pages a listing capped at `max_entries` follows at most."""
    return max(1, max_entries // ENTRIES_PER_PAGE)


async def paginate(client: Client, what: str, page: Callable[[Client, str | None], Awaitable[Any]],
                   items: Callable[[Any], list[Any]], max_pages: int, max_entries: int) -> Listing:
    """The records (`items` of each page) of every page `page` gives from the first cursor on, at most
    `max_entries`; `truncated` (and `cut` says where) when cut there, past `max_pages` pages, or when a cursor
    comes again. The caller logs it (`CutNotice`)."""
    found: list[Any] = []
    ttls: list[int] = []
    scopes: set[str] = set()
    seen: set[str] = set()
    cursor: str | None = None
    parsed = 0
    cut: str | None = None
    for _ in range(max_pages):
        result = await page(client, cursor)
        batch = items(result)
        ttl, scope = hints(client, result)
        cursor = result.next_cursor
        del result  # the page's SDK models go now: only the records are kept
        parsed += len(batch)
        if ttl is not None:
            ttls.append(ttl)
        if scope is not None:
            scopes.add(scope)
        room = max_entries - len(found)
        found.extend(batch if len(batch) <= room else batch[:room])
        del batch
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
