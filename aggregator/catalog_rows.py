"""Entries kept as columns: a listing in URI order at about 100 bytes a file instead of about 500.

Most files of a collection whose URI pattern is `prefix{path}suffix` need nothing per file but their URI (the one
string kept; the path is the URI's middle), size and mtime: such a row is *compact*, and the `RowMaker` that listed
it (the collection's entry builder) builds its `Entry` again whenever a page or a read asks, with the same code that
would have built it when listing. Every other row (a manifest resource, an upstream's resource, a file whose URI
needed percent-encoding) is *explicit*: its Entry is kept. `Rows` is an immutable `Sequence[Entry]` over both; equal
rows give equal entries, whichever way they are kept.

Rows are stored in blocks of columns (a list of URIs, arrays of makers, sizes and mtimes). A compile makes one block;
the first edit cuts it into blocks of about `LOAD` rows, and every edit after copies only the blocks it touches and
the list of blocks (as `chunked.Chunked` does for lists): a change to a million rows costs the change.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Protocol, overload

from aggregator.chunked import LOAD, Chunked, Layered
from aggregator.entry import Entry
from aggregator.row_blocks import Block, compressed, cut, duplicates, insert_rows, is_sorted, joined_makers, runs

__all__ = ["EXPLICIT", "NO_SIZE", "NO_TIME", "RETIRED", "RowMaker", "Rows", "RowsBuilder", "duplicates"]

EXPLICIT = 0
"""`which` of a row whose Entry is kept; a compact row's `which` is its maker's index plus one."""
NO_SIZE = -1
"""A size column's value for an entry without a size."""
NO_TIME = math.nan
"""An mtime column's value for an entry without an mtime."""
_URI = attrgetter("uri")
_FIRST, _LAST = itemgetter(0), itemgetter(-1)
_PRUNE_AFTER = 16
"""Makers joined (collections a save listed anew) before unused makers are looked for (see `_pruned`)."""


class RowMaker(Protocol):
    """What builds a compact row's Entry (a collection's entry builder): every entry it makes has its `source`
    and `access`."""

    source: str
    access: frozenset[str]

    @property
    def listing_key(self) -> object:
        """Makers with equal keys build entries with equal `listed_fields` from equal columns."""

    def row_entry(self, uri: str, size: int | None, mtime: float | None) -> Entry:
        """The Entry of the compact row `uri`: what listing the file would have built."""

    def compact_uri(self, path: str) -> str | None:
        """The URI of `path`'s row if it would be compact, else None (then it is explicit, if listed)."""

    def path_of(self, uri: str) -> str:
        """The path of the compact row `uri`."""

    @property
    def uri_space(self) -> tuple[str, str, str] | None:
        """(source, prefix, suffix) of its compact rows (`prefix + path + suffix` is a row's URI), or None when it
        makes none: makers with equal spaces give a URI the same file."""

    def row_entries(self, uris: Sequence[str], sizes: Sequence[int], mtimes: Sequence[float]) -> list[Entry]:
        """`row_entry` of each row of these columns (sizes NO_SIZE and mtimes NO_TIME where there are none)."""


def _size(size: int) -> int | None:
    return None if size == NO_SIZE else size


def _time(mtime: float) -> float | None:
    return None if mtime != mtime else mtime  # NaN: no mtime


class Rows(Sequence[Entry]):
    """Entries in URI order (`uris`), immutable. Indexing builds a compact row's Entry; a slice is a list."""

    __slots__ = ("_blocks", "_starts", "_makers", "_explicit", "uris", "_joined", "_lasts")

    def __init__(self, uris: list[str], which: array[int], sizes: array[int], mtimes: array[float],
                 makers: tuple[RowMaker, ...] = (), explicit: Mapping[str, Entry] | None = None) -> None:
        """Rows of sorted columns: shared, not copied, up to twice LOAD rows; longer ones are cut into blocks of
        LOAD rows here (C-level slices, once per listing), so that no edit copies the listing."""
        self._set(cut([(uris, which, sizes, mtimes)], LOAD) if uris else [], makers,
                  explicit if explicit is not None else {})

    def _set(self, blocks: list[Block], makers: tuple[RowMaker, ...], explicit: Mapping[str, Entry]) -> None:
        # Per block, C-level only (map, accumulate): an edit of a million rows makes a thousand blocks again.
        self._blocks = blocks
        self.uris: Chunked[str] = Chunked(list(map(_FIRST, blocks)))
        """The URIs in order: a sequence over the blocks' lists (bisected block-wise by `chunked.find_left`)."""
        self._starts = self.uris._starts
        self._lasts: list[str] | None = None  # `uris.lasts()` once `get` asked: a read's lookup calls nothing more
        self._makers = makers
        self._explicit = explicit
        self._joined = 0  # edits that joined makers since unused ones were last pruned

    @classmethod
    def _of(cls, blocks: list[Block], makers: tuple[RowMaker, ...], explicit: Mapping[str, Entry]) -> Rows:
        """Rows over `blocks` (none empty)."""
        rows = cls.__new__(cls)
        rows._set(blocks, makers, explicit)
        return rows

    @classmethod
    def of(cls, entries: Iterable[Entry], makers: tuple[RowMaker, ...] = ()) -> Rows:
        """Explicit rows of `entries`, sorted here. Two with one URI stay two rows (so `duplicates` finds them),
        both showing the later entry."""
        ordered = sorted(entries, key=_URI)
        n = len(ordered)
        return cls(list(map(_URI, ordered)), array("H", bytes(2 * n)), array("q", [NO_SIZE]) * n,
                   array("d", [NO_TIME]) * n, makers, {e.uri: e for e in ordered})

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self._between(start, stop)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        c = bisect_right(self._starts, index) - 1
        return self._row(self._blocks[c], index - self._starts[c])

    def _row(self, block: Block, j: int) -> Entry:
        uris, which, sizes, mtimes = block
        kind, uri = which[j], uris[j]
        if kind == EXPLICIT:
            return self._explicit[uri]
        return self._makers[kind - 1].row_entry(uri, _size(sizes[j]), _time(mtimes[j]))

    def _between(self, start: int, stop: int) -> list[Entry]:
        """The entries of rows [start, stop): a run of one collection's compact rows built in one loop."""
        out: list[Entry] = []
        for kind, uris, sizes, mtimes in self.runs(start, stop):
            if kind == EXPLICIT:
                out += map(self._explicit.__getitem__, uris)
            else:
                out += self._makers[kind - 1].row_entries(uris, sizes, mtimes)
        return out

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, list[str], array[int], array[float]]]:
        """Rows [start, stop) as runs of rows of one `which` (EXPLICIT, or a maker's index plus one), each as
        slices of its columns (uris, sizes, mtimes): one run a block unless the block mixes makers. O(log n + rows)."""
        c = bisect_right(self._starts, start) - 1
        while start < stop:
            base = self._starts[c]
            uris, which, sizes, mtimes = self._blocks[c]
            for kind, i, j in runs(which, start - base, min(stop, self._starts[c + 1]) - base):
                yield kind, uris[i:j], sizes[i:j], mtimes[i:j]
            start, c = self._starts[c + 1], c + 1

    def __iter__(self) -> Iterator[Entry]:
        explicit, makers = self._explicit, self._makers
        for uris, which, sizes, mtimes in self._blocks:
            for uri, kind, size, mtime in zip(uris, which, sizes, mtimes):
                if kind == EXPLICIT:
                    yield explicit[uri]
                else:
                    yield makers[kind - 1].row_entry(uri, _size(size), _time(mtime))

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, Entry) and self.get(entry.uri) == entry

    def _find(self, uri: str) -> tuple[int, int] | None:
        """(block, row in it) of `uri`; None if no row has it. O(log n)."""
        c = bisect_left(self.uris.lasts(), uri)
        if c == len(self._blocks):
            return None
        uris = self._blocks[c][0]
        j = bisect_left(uris, uri)
        return (c, j) if j < len(uris) and uris[j] == uri else None

    def spans(self) -> list[tuple[Block, int, int]]:
        """Each block with the index of its first row and one past its last: blocks an edited copy did not touch
        are the same objects in both (what a derived table can reuse)."""
        return [(block, start, stop) for block, start, stop in zip(self._blocks, self._starts, self._starts[1:])]

    def get(self, uri: str) -> Entry | None:
        """The entry of the row `uri`, if any: O(log n). `_find` then `_row` inline (a read's lookup is here)."""
        lasts = self._lasts
        if lasts is None:
            lasts = self._lasts = self.uris.lasts()
        c = bisect_left(lasts, uri)
        if c == len(lasts):
            return None
        uris, which, sizes, mtimes = self._blocks[c]
        j = bisect_left(uris, uri)
        if j == len(uris) or uris[j] != uri:
            return None
        kind = which[j]
        if kind == EXPLICIT:
            return self._explicit[uri]
        return self._makers[kind - 1].row_entry(uri, _size(sizes[j]), _time(mtimes[j]))

    def is_compact(self, uri: str) -> bool:
        """Whether `uri` has a compact row."""
        found = self._find(uri)
        return found is not None and self._blocks[found[0]][1][found[1]] != EXPLICIT

    def entries_of(self, uris: Collection[str]) -> Iterator[Entry]:
        """The entries of the rows whose URI is one of `uris`, in URI order."""
        return (entry for uri in sorted(set(uris)) if (entry := self.get(uri)) is not None)

    @property
    def explicit(self) -> Mapping[str, Entry]:
        """The explicit rows' entries by URI. Callers must not change it."""
        return self._explicit

    @property
    def makers(self) -> tuple[RowMaker, ...]:
        return self._makers

    def kinds(self) -> Iterator[tuple[str, int]]:
        """(URI, which) of every row, in order."""
        return chain.from_iterable(zip(uris, which) for uris, which, _, _ in self._blocks)

    def files(self) -> set[tuple[str, str]]:
        """(source, path) of every row that has both."""
        found = {(e.source, e.path) for e in self._explicit.values() if e.source is not None and e.path is not None}
        makers = self._makers
        for uris, which, _, _ in self._blocks:
            for kind, uri in zip(which, uris):
                if kind != EXPLICIT:
                    maker = makers[kind - 1]
                    found.add((maker.source, maker.path_of(uri)))
        return found

    def count_needing_scopes(self) -> int:
        """How many rows need scopes to be seen."""
        kinds = [k + 1 for k, maker in enumerate(self._makers) if maker.access]  # none: no column is read
        return (sum(which.count(kind) for _, which, _, _ in self._blocks for kind in kinds)
                + sum(1 for e in self._explicit.values() if e.access))

    def accesses(self) -> set[frozenset[str]]:
        """The scopes each row needs to be seen, each set once, without building an Entry: the makers rows use (a
        C-level pass over the `which` columns) and the explicit rows."""
        used = set().union(*(set(which) for _, which, _, _ in self._blocks)) - {EXPLICIT}
        return {self._makers[kind - 1].access for kind in used} | {e.access for e in self._explicit.values()}

    def visible_to(self, scopes: frozenset[str]) -> Rows:
        """The rows a caller holding `scopes` may see."""
        seen = [EXPLICIT] + [k + 1 for k, maker in enumerate(self._makers) if maker.access <= scopes]
        explicit = self._explicit
        if len(seen) == len(self._makers) + 1 and all(e.access <= scopes for e in explicit.values()):
            return self
        allowed = frozenset(seen)
        blocks: list[Block] = []
        for block in self._blocks:
            uris, which = block[0], block[1]
            blocks.append(compressed(block, [kind in allowed and (kind != EXPLICIT or explicit[uri].access <= scopes)
                                              for uri, kind in zip(uris, which)]))
        return Rows._of(blocks, self._makers, {u: e for u, e in explicit.items() if e.access <= scopes})

    def edited(self, drop: Collection[str], add: Sequence[Entry]) -> Rows:
        """A copy without the rows of the URIs in `drop` (those present) and with rows of `add` (sorted by URI,
        URIs not otherwise present), copying only the blocks the edit touches (a block grown past twice `LOAD` is
        cut): O(blocks + touched blocks x LOAD + edit). An added entry one of these rows' makers builds again
        exactly is kept compact; `add` may be Rows (a listing: its rows go in as they are, its makers joining
        these rows' makers)."""
        if isinstance(add, Rows):
            kinds = set().union(*(set(which) for _, which, _, _ in add._blocks))
            makers, remap = joined_makers(self._makers, add._makers, kinds, RETIRED)
            added: list[tuple[str, int, int, float]] = [
                (uri, remap[kind], size, mtime) for uris, which, sizes, mtimes in add._blocks
                for uri, kind, size, mtime in zip(uris, which, sizes, mtimes)]
            made: Mapping[str, Entry] = add._explicit
        else:
            makers, added, kept = self._makers, [], {}
            for entry in add:
                kind, size, mtime = self._compact(entry)
                if kind == EXPLICIT:
                    kept[entry.uri] = entry
                added.append((entry.uri, kind, size, mtime))
            made = kept
        if not added and not any(self._find(uri) for uri in drop):
            return self
        blocks, lasts = list(self._blocks), self.uris.lasts()
        touched: dict[int, Block] = {}

        def block(c: int) -> Block:
            found = touched.get(c)
            if found is None:
                uris, which, sizes, mtimes = blocks[c]
                found = touched[c] = (uris.copy(), array("H", which), array("q", sizes), array("d", mtimes))
            return found

        gone: list[str] = []
        for uri in drop:
            c = bisect_left(lasts, uri)
            if c < len(lasts):
                uris, which, sizes, mtimes = block(c)
                j = bisect_left(uris, uri)
                if j < len(uris) and uris[j] == uri:
                    del uris[j], which[j], sizes[j], mtimes[j]
                    gone.append(uri)
        if added and not blocks:
            blocks, lasts = [([], array("H"), array("q"), array("d"))], [added[-1][0]]
            touched[0] = blocks[0]
        by_block: dict[int, list[tuple[str, int, int, float]]] = {}
        for row in added:  # located by the last URIs before the edit: past every block's, into the last block
            by_block.setdefault(min(bisect_left(lasts, row[0]), len(lasts) - 1), []).append(row)
        for c, group in by_block.items():
            insert_rows(block(c), group)
        for c, edited in touched.items():
            blocks[c] = edited
        if any(len(blocks[c][0]) > 2 * LOAD for c in touched):
            blocks = cut(blocks, LOAD)
        if any(not block[0] for block in touched.values()):
            blocks = [b for b in blocks if b[0]]
        explicit = self._explicit
        gone = [uri for uri in gone if uri in explicit]
        if gone or made:
            explicit = Layered.of(explicit).edited(gone, made)
        rows = Rows._of(blocks, makers, explicit)
        rows._joined = self._joined
        return _pruned(rows) if makers is not self._makers else rows

    def _compact(self, entry: Entry) -> tuple[int, int, float]:
        """(which, size, mtime) of `entry`'s row: compact if a maker of these rows builds exactly it again."""
        size, mtime = NO_SIZE if entry.size is None else entry.size, NO_TIME if entry.mtime is None else entry.mtime
        if entry.path is not None:
            for k, maker in enumerate(self._makers):
                if (maker.source == entry.source and maker.compact_uri(entry.path) == entry.uri
                        and maker.row_entry(entry.uri, entry.size, entry.mtime) == entry):
                    return k + 1, size, mtime
        return EXPLICIT, NO_SIZE, NO_TIME

    def columns(self) -> Block:
        """The rows as one block of columns (C-level copies; the block itself when there is one)."""
        if len(self._blocks) == 1:
            return self._blocks[0]
        return (list(chain.from_iterable(b[0] for b in self._blocks)),
                array("H", chain.from_iterable(b[1] for b in self._blocks)),
                array("q", chain.from_iterable(b[2] for b in self._blocks)),
                array("d", chain.from_iterable(b[3] for b in self._blocks)))

    @staticmethod
    def merged(parts: Sequence[Rows]) -> Rows:
        """One Rows over every row of `parts` (each sorted; URIs may repeat across parts only if the caller means
        to report them: see `duplicates`). A single part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        makers: list[RowMaker] = []
        columns: list[Block] = []
        explicit: dict[str, Entry] = {}
        for part in parts:
            offset = len(makers)
            makers += part._makers
            uris, which, sizes, mtimes = part.columns()
            if offset:
                which = array("H", [w + offset if w else EXPLICIT for w in which])
            columns.append((uris, which, sizes, mtimes))
            explicit.update(part._explicit)
        return _sorted_concat(columns, tuple(makers), explicit)


class _Retired:
    """The maker in a slot no row uses any more (a collection a save replaced): it builds nothing, matches no path,
    and the next maker that joins takes its slot."""

    source = ""
    access: frozenset[str] = frozenset()
    listing_key = None
    uri_space = None

    def row_entry(self, uri: str, size: int | None, mtime: float | None) -> Entry:
        raise AssertionError(f"no row uses a retired maker ({uri})")

    def compact_uri(self, path: str) -> str | None:
        return None

    def path_of(self, uri: str) -> str:
        raise AssertionError(f"no row uses a retired maker ({uri})")

    def row_entries(self, uris: Sequence[str], sizes: Sequence[int], mtimes: Sequence[float]) -> list[Entry]:
        raise AssertionError("no row uses a retired maker")


RETIRED: RowMaker = _Retired()


def _pruned(rows: Rows) -> Rows:
    """`rows`, or once more makers joined them since the last look than half the makers, the same rows with the
    makers no row uses retired (`RETIRED`, whose slots joining makers take): a pass over the `which` columns every
    so many joins keeps makers from piling up over a server's life of saves. No block changes: a block's `which`
    names the same makers in every Rows holding it (a slot is retired only once no row uses it)."""
    rows._joined += 1
    if rows._joined <= _PRUNE_AFTER + len(rows._makers) // 2:
        return rows
    used = set().union(*(set(which) for _, which, _, _ in rows._blocks))
    rows._joined = 0
    makers = tuple(m if k + 1 in used else RETIRED for k, m in enumerate(rows._makers))
    if all(a is b for a, b in zip(makers, rows._makers)):
        return rows
    pruned = Rows._of(rows._blocks, makers, rows._explicit)
    return pruned


def _sorted_concat(parts: Sequence[Block], makers: tuple[RowMaker, ...], explicit: Mapping[str, Entry]) -> Rows:
    """Rows of every row of `parts` (which numbers into `makers` already) in URI order: one C-level sort of the row
    numbers by URI, which finds the parts' sorted runs and merges them."""
    uris = list(chain.from_iterable(p[0] for p in parts))
    which = array("H", chain.from_iterable(p[1] for p in parts))
    sizes = array("q", chain.from_iterable(p[2] for p in parts))
    mtimes = array("d", chain.from_iterable(p[3] for p in parts))
    if not is_sorted(uris):
        order = sorted(range(len(uris)), key=uris.__getitem__)
        uris = list(map(uris.__getitem__, order))
        which = array("H", map(which.__getitem__, order))
        sizes = array("q", map(sizes.__getitem__, order))
        mtimes = array("d", map(mtimes.__getitem__, order))
    return Rows(uris, which, sizes, mtimes, makers, explicit)


class RowsBuilder:
    """One listing's rows in the order it gives them (`compact_row` and `explicit_row` append); `rows()` sorts."""

    __slots__ = ("uris", "which", "sizes", "mtimes", "explicit", "maker")

    def __init__(self, maker: RowMaker | None) -> None:
        self.maker = maker
        self.uris: list[str] = []
        self.which = array("H")
        self.sizes = array("q")
        self.mtimes = array("d")
        self.explicit: list[Entry] = []

    def compact_row(self, uri: str, size: int | None, mtime: float | None) -> None:
        self.uris.append(uri)
        self.which.append(1)
        self.sizes.append(NO_SIZE if size is None else size)
        self.mtimes.append(NO_TIME if mtime is None else mtime)

    def explicit_row(self, entry: Entry) -> None:
        self.uris.append(entry.uri)
        self.which.append(EXPLICIT)
        self.sizes.append(NO_SIZE)
        self.mtimes.append(NO_TIME)
        self.explicit.append(entry)

    def __len__(self) -> int:
        return len(self.uris)

    def entries_of(self, uris: Collection[str]) -> Iterator[Entry]:
        """The entries of the rows whose URI is one of `uris`, in the order added."""
        explicit = iter(self.explicit)
        maker = self.maker
        for uri, which, size, mtime in zip(self.uris, self.which, self.sizes, self.mtimes):
            entry = next(explicit) if which == EXPLICIT else None
            if uri not in uris:
                continue
            if entry is None:
                assert maker is not None
                entry = maker.row_entry(uri, _size(size), _time(mtime))
            yield entry

    def rows(self) -> Rows:
        """The rows in URI order (sharing this builder's columns when they were added in that order)."""
        makers = (self.maker,) if self.maker is not None else ()
        explicit = {e.uri: e for e in self.explicit}
        if is_sorted(self.uris):
            return Rows(self.uris, self.which, self.sizes, self.mtimes, makers, explicit)
        return _sorted_concat([(self.uris, self.which, self.sizes, self.mtimes)], makers, explicit)
