"""Metadata search: the catalog entries whose name, title, description or URI hold every word of a query, best
first. It runs in worker threads (at most META_THREADS at once, never anyio's shared pool), so a broad query
over a large catalog never stops the event loop, and it stops scanning once no later entry could rank higher.

A word counts its best field's weight (name or title 3, description 2, URI 1); an entry scores the sum over the
words and ties go to URI order, which is the catalog's order. Every word's best weight over the whole range
searched bounds any entry's score, so once `limit` entries reach that bound, the entries after them (later
URIs) cannot displace them: a word every entry holds in its name costs a scan of the first few hundred entries,
not of the catalog.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from array import array
from collections.abc import Iterator, Sequence

import anyio
import anyio.to_thread

from aggregator.catalog import Catalog, Entry, prefix_range

__all__ = ["META_SECONDS", "META_THREADS", "MetadataSearch", "MetadataTimeout"]

META_THREADS = 2
"""Metadata searches running at once; more wait on the event loop, not in threads."""
META_SECONDS = 5.0
"""Longest one metadata search may scan (checked between windows of entries)."""
WINDOW = 256
"""Entries the first step of a search looks at; each further step doubles, up to MAX_WINDOW."""
MAX_WINDOW = 8192
WEIGHTS = (3, 2, 1)
"""A word in the name or title counts most, then in the description, then in the URI."""


class MetadataTimeout(Exception):
    """A metadata search scanned for longer than META_SECONDS."""


class _Part:
    """One block of catalog rows' metadata, lower-cased, in three strings (name and title, description, URI) of one
    line per entry: a word is looked for with str.find over each string, so a search costs a C-speed scan plus the
    entries it matches, not a Python loop over the catalog. Immutable once built, so threads share it."""

    __slots__ = ("block", "fields")

    def __init__(self, block: object, entries: Sequence[Entry]) -> None:
        self.block = block  # the rows' block it was made of: kept, so that its id names no other block
        self.fields: list[tuple[str, array[int]]] = []
        for text_of in (lambda e: f"{e.name} {e.title or ''}", lambda e: e.display.description or "",
                        lambda e: e.uri):
            parts = [text_of(e).lower().replace("\n", " ") for e in entries]  # lower-cased one by one: lengths hold
            starts = array("q", [0])
            for part in parts:
                starts.append(starts[-1] + len(part) + 1)  # one past the end: where entry i + 1 would start
            self.fields.append(("\n".join(parts), starts))

    def holds(self, field: int, word: str, lo: int, hi: int) -> bool:
        """Whether an entry in [lo, hi) (of this part) holds `word` in `field`."""
        text, starts = self.fields[field]
        return text.find(word, starts[lo], starts[hi]) != -1

    def best(self, word: str, lo: int, hi: int, base: int, into: dict[int, int]) -> None:
        """Into `into`, for each entry in [lo, hi) holding `word`: its index (plus `base`) -> its best field's weight."""
        for weight, (text, starts) in zip(WEIGHTS, self.fields, strict=True):
            stop = starts[hi]
            pos = text.find(word, starts[lo], stop)
            while pos != -1:
                i = bisect.bisect_right(starts, pos, lo, hi) - 1
                into.setdefault(base + i, weight)  # the fields go by falling weight: the first one found is the best
                pos = text.find(word, starts[i + 1], stop)


class _Table:
    """A catalog's metadata as parts, one per block of its rows (`Rows.spans`). A catalog built on the one searched
    before shares its untouched blocks, and so their parts: after a change the table costs the blocks the change
    touched, not the catalog."""

    def __init__(self, catalog: Catalog, before: _Table | None = None) -> None:
        self.catalog = catalog
        rows = catalog.entries
        # A block's rows build the same entries in every Rows that holds it (`catalog_rows._pruned`).
        known = before.by_block if before is not None else {}
        self.by_block: dict[int, _Part] = {}
        self.parts: list[_Part] = []
        self.starts: list[int] = []
        for block, start, stop in rows.spans():
            part = known.get(id(block))
            if part is None or part.block is not block:
                part = _Part(block, rows[start:stop])
            self.by_block[id(block)] = part
            self.parts.append(part)
            self.starts.append(start)
        self.starts.append(len(rows))

    def _spans(self, lo: int, hi: int) -> Iterator[tuple[_Part, int, int, int]]:
        """(part, local lo, local hi, base) of each part [lo, hi) reaches."""
        p = bisect.bisect_right(self.starts, lo) - 1
        while p < len(self.parts) and self.starts[p] < hi:
            base = self.starts[p]
            yield self.parts[p], max(lo, base) - base, min(hi, self.starts[p + 1]) - base, base
            p += 1

    def ceiling(self, terms: Sequence[tuple[str, bool]], lo: int, hi: int) -> int:
        """The highest score an entry in [lo, hi) could have: each word's best field holding it anywhere in the
        range; 0 when some word is in none (no entry holds every word)."""
        total = 0
        for word, _ in terms:
            weight = next((w for f, w in enumerate(WEIGHTS)
                           if any(part.holds(f, word, a, b) for part, a, b, _ in self._spans(lo, hi))), 0)
            if not weight:
                return 0
            total += weight
        return total

    def scores(self, terms: Sequence[tuple[str, bool]], lo: int, hi: int) -> dict[int, int]:
        """Entry index -> score, for the entries in [lo, hi) whose metadata holds every word."""
        total: dict[int, int] | None = None
        for word, _ in terms:
            best: dict[int, int] = {}
            for part, a, b, base in self._spans(lo, hi):
                part.best(word, a, b, base, best)
            total = best if total is None else {i: score + best[i] for i, score in total.items() if i in best}
            if not total:
                return {}
        return total or {}


class MetadataSearch:
    """Metadata search for one service: the table of the catalog last searched (built by the first search of a
    catalog, once, whatever the number of searches waiting for it) and the threads searches run in."""

    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._table: _Table | None = None
        self._building = threading.Lock()
        self._limiter = anyio.CapacityLimiter(META_THREADS)

    async def search(self, catalog: Catalog, terms: Sequence[tuple[str, bool]], scopes: frozenset[str] | None,
                     prefix: str, limit: int) -> list[Entry]:
        """The `limit` best entries of `catalog` under `prefix` that a caller holding `scopes` (None: anything)
        may see and whose metadata holds every word of `terms`. MetadataTimeout past META_SECONDS."""
        _, uris = catalog.visible(None)
        lo, hi = prefix_range(uris, prefix)
        if lo >= hi or not terms:
            return []
        return await anyio.to_thread.run_sync(self._top, catalog, terms, scopes, lo, hi, limit,
                                              limiter=self._limiter)

    def _table_of(self, catalog: Catalog) -> _Table:
        with self._building:
            table = self._table
            if table is None or table.catalog is not catalog:
                # The first table: for 100,000 entries tenths of a second; one built on it, the blocks changed.
                table = self._table = _Table(catalog, table)
            return table

    def _top(self, catalog: Catalog, terms: Sequence[tuple[str, bool]], scopes: frozenset[str] | None, lo: int,
             hi: int, limit: int) -> list[Entry]:
        """In a worker thread: scan [lo, hi) in growing windows, keeping the best `limit` (score, index) pairs,
        until the end or until `limit` of them reach the ceiling."""
        deadline = time.monotonic() + META_SECONDS
        table = self._table_of(catalog)
        ceiling = table.ceiling(terms, lo, hi)
        if not ceiling:
            return []
        entries = catalog.entries
        allowed = scopes if scopes is not None and catalog.restricted else None  # None: every entry is visible
        best: list[tuple[int, int]] = []  # (-score, index): best first
        start, window = lo, self._window
        while start < hi:
            if time.monotonic() > deadline:
                raise MetadataTimeout()
            stop = min(hi, start + window)
            found = [(-score, i) for i, score in table.scores(terms, start, stop).items()
                     if allowed is None or entries[i].access <= allowed]
            best = heapq.nsmallest(limit, best + found)
            if len(best) == limit and -best[-1][0] == ceiling:
                break  # every later entry scores at most the ceiling and comes later in URI order
            start, window = stop, min(window * 2, MAX_WINDOW)
        return [entries[i] for _, i in best]
