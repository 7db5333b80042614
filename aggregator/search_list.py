"""Filtered listing (the `list_resources` tool): a page of what resources/list shows one caller, narrowed to a URI
prefix, a MIME type and a name glob, paged with resources/list's own cursors."""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections.abc import Callable

from aggregator.catalog import Catalog, Entry, Page, decode_cursor, encode_cursor, prefix_range
from aggregator.search_query import InvalidSearch

__all__ = ["LIST_SCAN", "entry_filter", "list_page"]

MAX_GLOB_CHARS = 200
LIST_SCAN = 20_000
"""Entries one filtered list_resources page looks at, at most: a page may come back short (even empty) with a
nextCursor, so that a filter matching nothing never costs a scan of the whole catalog in one call."""


def list_page(catalog: Catalog, cursor: str | None, scopes: frozenset[str] | None, limit: int, *, prefix: str = "",
              mime_type: str | None = None, name: str | None = None) -> Page:
    """A page of what resources/list shows this caller, narrowed to URIs starting with `prefix`, a MIME type
    (`text/*` allowed) and a name glob; InvalidCursor for a cursor no catalog made. Costs O(page) when only
    `prefix` narrows it; with other filters it looks at LIST_SCAN entries at most, and may come back short."""
    entries, uris = catalog.visible(scopes)
    start, end = prefix_range(uris, prefix)
    if cursor:
        start = max(start, bisect.bisect_right(uris, decode_cursor(cursor)))
    name_ok, mime_ok = _name_test(name), _mime_test(mime_type)
    if name_ok is None and mime_ok is None:
        chunk = entries[start : min(end, start + limit)]
        more = start + limit < end
        return Page(chunk, encode_cursor(uris[start + limit - 1]) if more else None)
    found: list[Entry] = []
    i, stop = start, min(end, start + LIST_SCAN)
    while i < stop and len(found) < limit:
        entry = entries[i]
        if (name_ok is None or name_ok(entry.name)) and (mime_ok is None or mime_ok(entry.mime_type)):
            found.append(entry)
        i += 1
    return Page(found, encode_cursor(uris[i - 1]) if i < end else None)


def entry_filter(mime_type: str | None = None, name: str | None = None) -> Callable[[Entry], bool] | None:
    """The test `list_page` applies for a MIME type and a name glob, for other lists (search results); None when
    neither narrows. InvalidSearch for a glob too long."""
    name_ok, mime_ok = _name_test(name), _mime_test(mime_type)
    if name_ok is None and mime_ok is None:
        return None
    return lambda e: (name_ok is None or bool(name_ok(e.name))) and (mime_ok is None or mime_ok(e.mime_type))


def _name_test(glob: str | None) -> Callable[[str], bool] | None:
    if not glob:
        return None
    if len(glob) > MAX_GLOB_CHARS:
        raise InvalidSearch(f"the name glob is longer than {MAX_GLOB_CHARS} characters")
    return re.compile(fnmatch.translate(glob), re.IGNORECASE | re.DOTALL).match  # type: ignore[return-value]


def _mime_test(mime_type: str | None) -> Callable[[str | None], bool] | None:
    """`text/markdown` matches that type (parameters ignored); `text/*` any text type."""
    if not mime_type:
        return None
    wanted = mime_type.split(";", 1)[0].strip().lower()
    if wanted.endswith("/*"):
        major = wanted[:-1]
        return lambda m: m is not None and m.lower().startswith(major)
    return lambda m: m is not None and m.split(";", 1)[0].strip().lower() == wanted
