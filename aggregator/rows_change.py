"""Two whole listings compared: whose listings changed, and which URIs now read elsewhere.

A full relist or a reload compiled whole builds a new catalog without saying what changed; this finds it. Both
catalogs keep their rows sorted by URI (`catalog_rows`), so one merge walk over the two pairs each URI's rows, O(both)
with nothing kept per row. The walk goes a window of rows at a time: windows whose columns are equal (C-level
comparisons of URIs, makers by `listing_key` and access, sizes, mtimes) show and read the same and are passed over
whole, so a relist that adds a few files to a million costs about what comparing the columns does; only the windows
around a difference are walked row by row, and Entries are built only for rows kept differently on the two sides.
Those windows are what the two catalogs' entries may differ in (`Compared.differing`, spans of rows not built).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Collection
from dataclasses import dataclass
from itertools import compress
from operator import not_

from aggregator.catalog import Catalog
from aggregator.catalog_rows import EXPLICIT, NO_SIZE, Rows
from aggregator.chunked import LOAD
from aggregator.entry import Entry, listed_fields
from aggregator.entry_spans import Differing, Span
from aggregator.listing_change import ListingChange
from aggregator.row_blocks import Block

__all__ = ["Compared", "catalog_change", "reads", "rows_change"]


@dataclass(frozen=True, slots=True)
class Compared:
    """What a new listing changed against the one it replaces."""

    listing: ListingChange
    """Whose listings show something else now (entries, and with `catalog_change` templates, that came, went, show
    otherwise or need other scopes)."""
    content_changed: set[str]
    """URIs listed on both sides whose content now comes from elsewhere (other text, file or source, or a source
    opened anew)."""
    differing: Differing
    """The windows of rows whose entries may differ (every row outside them shows and reads the same on both sides):
    what comparing the two entry by entry needs to walk."""


def catalog_change(before: Catalog, after: Catalog, replaced: Collection[str] = ()) -> Compared:
    """What `after` changed against `before` (`replaced` as `rows_change` takes it): its entries in one walk of
    both, O(both catalogs), and its templates (`Catalog.templates_change`)."""
    compared = rows_change(before.entries, after.entries, replaced)
    return Compared(compared.listing | before.templates_change(after), compared.content_changed, compared.differing)


def reads(entry: Entry) -> tuple[object, ...]:
    """Where an entry's content comes from."""
    return entry.source, entry.path, entry.text, entry.decompress, entry.convert


def rows_change(before: Rows, after: Rows, replaced: Collection[str] = ()) -> Compared:
    """What `after` changed against `before` (`replaced`: ids of sources not carried over, whose rows read from a
    source opened anew): one merge walk of the two in URI order, a window at a time."""
    numbers: dict[object, int] = {}  # one number per maker key: rows of equal makers compare equal
    old, new = _Side(before, numbers), _Side(after, numbers)
    walk = _Walk(old, new, replaced)
    spans: list[tuple[int, int, int, int]] = []  # (start, stop) of rows before, then after, that may differ
    i = j = 0
    while i < len(before) and j < len(after):
        size = min(LOAD, len(before) - i, len(after) - j)
        a, b = old.window(i, i + size), new.window(j, j + size)
        if old.same(a, new, b):
            p = q = size
            differs = walk.same(a, b)
        else:
            p, q = walk.rows(a, b)
            differs = True
        if differs:
            spans.append((i, i + p, j, j + q))
        i, j = i + p, j + q
    walk.shown |= old.access(i, len(before)) | new.access(j, len(after))  # what only one side has left
    if i < len(before) or j < len(after):
        spans.append((i, len(before), j, len(after)))
    return Compared(ListingChange(frozenset(walk.shown), frozenset(walk.moved), frozenset(walk.detail)), walk.content,
                    tuple((Span(before, start, stop), Span(after, at, to)) for start, stop, at, to in spans))


class _Side:
    """One listing's rows, read a window (a block of columns) at a time."""

    __slots__ = ("rows", "blocks", "starts", "numbers", "renumber")

    def __init__(self, rows: Rows, numbers: dict[object, int]) -> None:
        spans = rows.spans()
        self.rows, self.blocks, self.starts = rows, [block for block, _, _ in spans], [s for _, s, _ in spans]
        # By what they list and who may see it (an upstream's key leaves its access out: it keys what it lists).
        self.numbers = [EXPLICIT, *(numbers.setdefault((m.listing_key, m.access), len(numbers) + 1)
                                    for m in rows.makers)]
        self.renumber = self.numbers != list(range(len(self.numbers)))

    def window(self, start: int, stop: int) -> Block:
        """Rows [start, stop) as one block of columns (slices of one block, or of a few joined)."""
        c = bisect_right(self.starts, start) - 1
        parts: list[Block] = []
        while start < stop:
            uris, which, sizes, mtimes = self.blocks[c]
            i, j = start - self.starts[c], min(stop - self.starts[c], len(uris))
            parts.append((uris[i:j], which[i:j], sizes[i:j], mtimes[i:j]))
            start, c = self.starts[c] + j, c + 1
        if len(parts) == 1:
            return parts[0]
        uris, which, sizes, mtimes = parts[0]
        for more in parts[1:]:
            uris, which, sizes, mtimes = uris + more[0], which + more[1], sizes + more[2], mtimes + more[3]
        return uris, which, sizes, mtimes

    def keys(self, which: array[int]) -> array[int]:
        """`which` with each maker numbered by its key."""
        return array("H", map(self.numbers.__getitem__, which)) if self.renumber else which

    def same(self, block: Block, other: _Side, theirs: Block) -> bool:
        """Whether the rows of `block` and the other side's `theirs` are kept alike: the same URIs, makers of equal
        keys and access, sizes and mtimes (explicit rows' entries still to compare)."""
        return (block[0] == theirs[0] and self.keys(block[1]) == other.keys(theirs[1]) and block[2] == theirs[2]
                and block[3].tobytes() == theirs[3].tobytes())

    def access(self, start: int, stop: int) -> set[frozenset[str]]:
        """The scopes needed to see each of rows [start, stop): without building their entries."""
        found: set[frozenset[str]] = set()
        for at in range(start, stop, LOAD):
            uris, which, _, _ = self.window(at, min(stop, at + LOAD))
            found |= {self.rows.makers[kind - 1].access for kind in set(which) if kind != EXPLICIT}
            found |= {self.rows.explicit[uri].access for uri in compress(uris, map(not_, which))}
        return found

    def entry(self, block: Block, i: int) -> Entry:
        """The Entry of row `i` of `block`."""
        uris, which, sizes, mtimes = block
        uri, kind, size, mtime = uris[i], which[i], sizes[i], mtimes[i]
        if kind == EXPLICIT:
            return self.rows.explicit[uri]
        return self.rows.makers[kind - 1].row_entry(uri, None if size == NO_SIZE else size,
                                                    None if mtime != mtime else mtime)  # NaN: no mtime


class _Walk:
    """What the walk found so far: access sets of rows that came, went or show otherwise, access moves, rows that
    show another source in the console (`ListingChange.detail`), and URIs that read elsewhere."""

    def __init__(self, old: _Side, new: _Side, replaced: Collection[str]) -> None:
        self.old, self.new, self.replaced = old, new, replaced
        self.shown: set[frozenset[str]] = set()
        self.moved: set[tuple[frozenset[str], frozenset[str]]] = set()
        self.detail: set[frozenset[str]] = set()
        self.content: set[str] = set()

    def same(self, a: Block, b: Block) -> bool:
        """Rows kept alike on both sides (`_Side.same`): only explicit rows' entries can differ, and rows of a
        replaced source read elsewhere. Whether an explicit row's entries differ."""
        differs = False
        if EXPLICIT in a[1]:  # a C-level look first: most windows hold compact rows alone
            for i in [i for i, kind in enumerate(a[1]) if kind == EXPLICIT]:
                before, after = self.old.entry(a, i), self.new.entry(b, i)
                if before != after or after.source in self.replaced:
                    self.compare(before, after)
                    differs = differs or before != after
        if self.replaced:
            makers = self.old.rows.makers
            gone = {kind for kind in set(a[1]) if kind != EXPLICIT and makers[kind - 1].source in self.replaced}
            self.content.update(compress(a[0], (kind in gone for kind in a[1])))
        return differs

    def rows(self, a: Block, b: Block) -> tuple[int, int]:
        """Merge-walk windows `a` (old) and `b` (new) row by row until one ends; the rows of each it consumed."""
        (uris, which, sizes, mtimes), (their_uris, theirs, their_sizes, their_mtimes) = a, b
        keys, their_keys = self.old.keys(which), self.new.keys(theirs)
        p = q = 0
        while p < len(uris) and q < len(their_uris):
            if uris[p] < their_uris[q]:
                self.shown.add(self.old.entry(a, p).access)
                p += 1
            elif their_uris[q] < uris[p]:
                self.shown.add(self.new.entry(b, q).access)
                q += 1
            else:
                m, n = mtimes[p], their_mtimes[q]
                if (keys[p] == EXPLICIT or keys[p] != their_keys[q] or sizes[p] != their_sizes[q]
                        or (m != n and (m == m or n == n))):  # NaN: no mtime on either side
                    self.compare(self.old.entry(a, p), self.new.entry(b, q))
                elif self.replaced and self.old.rows.makers[which[p] - 1].source in self.replaced:
                    self.content.add(uris[p])  # the same row, read from a source opened anew
                p, q = p + 1, q + 1
        return p, q

    def compare(self, before: Entry, after: Entry) -> None:
        """One URI's entries on the two sides."""
        if listed_fields(before) != listed_fields(after):
            self.shown |= {before.access, after.access}
        else:
            if before.access != after.access:
                self.moved.add((before.access, after.access))
            if before.source != after.source:  # listed the same, shown by the console with another source
                self.detail.add(before.access | after.access)
        if reads(before) != reads(after) or after.source in self.replaced:
            self.content.add(after.uri)
