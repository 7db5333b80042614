"""Following a listing's cursors: every page of resources/list (or templates/list) into one `Listing`, capped in
pages and entries, cut short when the cursors loop."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import Client

from aggregator.upstream.answers import Listing, hints

__all__ = ["paginate"]

logger = logging.getLogger("aggregator.upstream")


async def paginate(client: Client, label: str, what: str, page: Callable[[Client, str | None], Awaitable[Any]],
                   items: Callable[[Any], list[Any]], max_pages: int, max_entries: int) -> Listing:
    """The entries of every page `page` gives from the first cursor on; `truncated` past `max_pages` pages or
    `max_entries` entries, or when a cursor comes again (each logged, naming `label` and `what`)."""
    found: list[Any] = []
    ttls: list[int] = []
    scopes: set[str] = set()
    seen: set[str] = set()
    cursor: str | None = None
    for _ in range(max_pages):
        result = await page(client, cursor)
        found.extend(items(result))
        ttl, scope = hints(client, result)
        if ttl is not None:
            ttls.append(ttl)
        if scope is not None:
            scopes.add(scope)
        cursor = result.next_cursor
        if len(found) > max_entries or cursor is None:
            break
        if cursor in seen:
            logger.warning("%s: %s: the cursors loop; listing cut short", label, what)
            break
        seen.add(cursor)
    truncated = cursor is not None or len(found) > max_entries
    if truncated:
        logger.warning("%s: %s cut at %d pages / %d entries", label, what, max_pages, max_entries)
    scope = "private" if "private" in scopes else ("public" if scopes else None)
    return Listing(found[:max_entries], min(ttls) if ttls else None, scope, truncated)
