"""The catalog as a tree by URI scheme and path, one level and one page at a time, O(page x log n).

A level under `prefix` is the run of sorted URIs starting with it (found by bisection); its children are folders
(the next `/`-ended segment, or at the top `scheme://`) and entries. Each folder costs one bisection to count and
skip its URIs, so a page never walks the entries below a folder. The cursor is the catalog's own (the last URI the
page consumed): it survives reloads, resuming at the next URI in the new order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from aggregator.catalog import Entry, decode_cursor, encode_cursor, prefix_range

__all__ = ["Folder", "TreePage", "folder_of", "tree_page"]


@dataclass(frozen=True, slots=True)
class Folder:
    prefix: str
    count: int
    """Entries under it that the caller may see."""


@dataclass(frozen=True, slots=True)
class TreePage:
    prefix: str
    children: Sequence[Folder | Entry]
    next_cursor: str | None
    total: int
    """Entries under `prefix` the caller may see (all levels)."""


def folder_of(uri: str, prefix: str) -> str | None:
    """The child folder of `prefix` that `uri` lies in, or None when `uri` is a child entry of `prefix` itself."""
    rest = uri[len(prefix):]
    if not prefix:
        scheme = rest.find("://")
        if scheme > 0:
            return rest[: scheme + 3]
        colon = rest.find(":")
        if colon > 0:
            return rest[: colon + 1]
    slash = rest.find("/")
    # A URI ending in `/` (`docs://x/`) lies in its own folder, as the first entry listed when that folder opens.
    return None if slash < 0 else prefix + rest[: slash + 1]


def tree_page(entries: Sequence[Entry], uris: Sequence[str], prefix: str, cursor: str | None, limit: int) -> TreePage:
    """Up to `limit` children of `prefix` after `cursor`, over the caller's visible `entries` and their sorted
    `uris`; InvalidCursor for a cursor no catalog made."""
    start, end = prefix_range(uris, prefix)
    total = end - start
    if cursor:
        start = max(start, bisect.bisect_right(uris, decode_cursor(cursor), lo=start, hi=end))
    children: list[Folder | Entry] = []
    i = start
    while i < end and len(children) < limit:
        folder = folder_of(uris[i], prefix)
        if folder is None:
            children.append(entries[i])
            i += 1
            continue
        _, stop = prefix_range(uris, folder)
        children.append(Folder(folder, stop - i))
        i = stop
    return TreePage(prefix, children, encode_cursor(uris[i - 1]) if i < end else None, total)
