"""Entries kept as columns: a listing in URI order at about 100 bytes a file instead of about 500.

Most files of a collection whose URI pattern is `prefix{path}suffix` need nothing per file but their URI (the one
string kept; the path is the URI's middle), size and mtime: such a row is *compact*, and the `RowMaker` that listed
it (the collection's entry builder) builds its `Entry` again whenever a page or a read asks, with the same code that
would have built it when listing. Every other row (a manifest resource, an upstream's resource, a file whose URI
needed percent-encoding) is *explicit*: its Entry is kept. `Rows` is an immutable `Sequence[Entry]` over both; equal
rows give equal entries, whichever way they are kept.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress, islice
from operator import attrgetter, eq, le
from typing import Protocol, overload

from aggregator.entry import Entry

__all__ = ["EXPLICIT", "NO_SIZE", "NO_TIME", "PathIndex", "RowMaker", "Rows", "RowsBuilder", "duplicates"]

EXPLICIT = 0
"""`which` of a row whose Entry is kept; a compact row's `which` is its maker's index plus one."""
NO_SIZE = -1
"""A size column's value for an entry without a size."""
NO_TIME = math.nan
"""An mtime column's value for an entry without an mtime."""
_URI = attrgetter("uri")
_SMALL_EDIT = 64
"""Up to this many rows in or out, each is a bisect and a memmove; past it, one C-level filter and sort."""


class RowMaker(Protocol):
    """What builds a compact row's Entry (a collection's entry builder): every entry it makes has its `source`
    and `access`."""

    source: str
    access: frozenset[str]

    def row_entry(self, uri: str, size: int | None, mtime: float | None) -> Entry:
        """The Entry of the compact row `uri`: what listing the file would have built."""

    def compact_uri(self, path: str) -> str | None:
        """The URI of `path`'s row if it would be compact, else None (then it is explicit, if listed)."""

    def path_of(self, uri: str) -> str:
        """The path of the compact row `uri`."""

    def row_entries(self, uris: Sequence[str], sizes: Sequence[int], mtimes: Sequence[float]) -> list[Entry]:
        """`row_entry` of each row of these columns (sizes NO_SIZE and mtimes NO_TIME where there are none)."""


class Rows(Sequence[Entry]):
    """Entries in URI order (`uris`), immutable. Indexing builds a compact row's Entry; a slice is a list."""

    __slots__ = ("uris", "_which", "_sizes", "_mtimes", "_makers", "_explicit")

    def __init__(self, uris: list[str], which: array[int], sizes: array[int], mtimes: array[float],
                 makers: tuple[RowMaker, ...] = (), explicit: Mapping[str, Entry] | None = None) -> None:
        self.uris = uris
        self._which, self._sizes, self._mtimes = which, sizes, mtimes
        self._makers = makers
        self._explicit: Mapping[str, Entry] = explicit if explicit is not None else {}

    @classmethod
    def of(cls, entries: Iterable[Entry], makers: tuple[RowMaker, ...] = ()) -> Rows:
        """Explicit rows of `entries`, sorted here. Two with one URI stay two rows (so `duplicates` finds them),
        both showing the later entry."""
        ordered = sorted(entries, key=_URI)
        n = len(ordered)
        return cls(list(map(_URI, ordered)), array("H", bytes(2 * n)), array("q", [NO_SIZE]) * n,
                   array("d", [NO_TIME]) * n, makers, {e.uri: e for e in ordered})

    def __len__(self) -> int:
        return len(self.uris)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> list[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | list[Entry]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.uris))
            if step == 1 and len(self._makers) == 1 and stop > start and EXPLICIT not in self._which[start:stop]:
                return self._makers[0].row_entries(self.uris[start:stop], self._sizes[start:stop],
                                                   self._mtimes[start:stop])  # a page of one collection's rows
            return [self._row(i) for i in range(start, stop, step)]
        if index < 0:
            index += len(self.uris)
        if not 0 <= index < len(self.uris):
            raise IndexError(index)
        return self._row(index)

    def _row(self, i: int) -> Entry:
        which, uri = self._which[i], self.uris[i]
        if which == EXPLICIT:
            return self._explicit[uri]
        size, mtime = self._sizes[i], self._mtimes[i]
        return self._makers[which - 1].row_entry(uri, None if size == NO_SIZE else size,
                                                 None if mtime != mtime else mtime)  # NaN: no mtime

    def __iter__(self) -> Iterator[Entry]:
        explicit, makers = self._explicit, self._makers
        for uri, which, size, mtime in zip(self.uris, self._which, self._sizes, self._mtimes):
            if which == EXPLICIT:
                yield explicit[uri]
            else:
                yield makers[which - 1].row_entry(uri, None if size == NO_SIZE else size,
                                                  None if mtime != mtime else mtime)

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, Entry) and self.get(entry.uri) == entry

    def entries_of(self, uris: Collection[str]) -> Iterator[Entry]:
        """The entries of the rows whose URI is one of `uris`, in URI order."""
        return (self._row(i) for i, uri in enumerate(self.uris) if uri in uris)

    def index_of(self, uri: str) -> int | None:
        """The row of `uri`; None if no row has it. O(log n)."""
        i = bisect.bisect_left(self.uris, uri)
        return i if i < len(self.uris) and self.uris[i] == uri else None

    def get(self, uri: str) -> Entry | None:
        i = self.index_of(uri)
        return None if i is None else self._row(i)

    @property
    def explicit(self) -> Mapping[str, Entry]:
        """The explicit rows' entries by URI. Callers must not change it."""
        return self._explicit

    @property
    def makers(self) -> tuple[RowMaker, ...]:
        return self._makers

    def maker_counts(self) -> list[int]:
        """How many rows each `which` has (index 0: explicit rows)."""
        counts = [0] * (len(self._makers) + 1)
        for which in set(self._which):
            counts[which] = self._which.count(which)
        return counts

    def files(self) -> set[tuple[str, str]]:
        """(source, path) of every row that has both."""
        found = {(e.source, e.path) for e in self._explicit.values() if e.source is not None and e.path is not None}
        makers = self._makers
        for which, uri in zip(self._which, self.uris):
            if which != EXPLICIT:
                maker = makers[which - 1]
                found.add((maker.source, maker.path_of(uri)))
        return found

    def count_needing_scopes(self) -> int:
        """How many rows need scopes to be seen."""
        counts = self.maker_counts()
        return (sum(counts[k + 1] for k, maker in enumerate(self._makers) if maker.access)
                + sum(1 for uri, which in zip(self.uris, self._which) if which == EXPLICIT and self._explicit[uri].access))

    def visible_to(self, scopes: frozenset[str]) -> Rows:
        """The rows a caller holding `scopes` may see."""
        seen = [EXPLICIT] + [k + 1 for k, maker in enumerate(self._makers) if maker.access <= scopes]
        if len(seen) == len(self._makers) + 1 and all(e.access <= scopes for e in self._explicit.values()):
            return self
        allowed, explicit = frozenset(seen), self._explicit
        return self.where([which in allowed and (which != EXPLICIT or explicit[uri].access <= scopes)
                           for uri, which in zip(self.uris, self._which)])

    def where(self, keep: Sequence[bool]) -> Rows:
        """The rows whose `keep` is true (one flag a row)."""
        uris = list(compress(self.uris, keep))
        explicit = self._explicit
        if len(uris) < len(self.uris) and explicit:
            explicit = {uri: explicit[uri] for uri in compress(self.uris, keep) if uri in explicit}
        return Rows(uris, array("H", compress(self._which, keep)), array("q", compress(self._sizes, keep)),
                    array("d", compress(self._mtimes, keep)), self._makers, explicit)

    def edited(self, drop: Collection[str], add: Sequence[Entry]) -> Rows:
        """A copy without the rows of the URIs in `drop` (those present) and with rows of `add` (sorted by URI,
        URIs not otherwise present): C-level copies of the columns and work in proportion to the change. An added
        entry one of these rows' makers builds again exactly is kept compact; `add` may be Rows (a listing)."""
        if isinstance(add, Rows):
            return Rows.merged([self.edited(drop, ()), add]) if len(add) else self.edited(drop, ())
        explicit: dict[str, Entry] | Mapping[str, Entry] = self._explicit
        if any(uri in explicit for uri in drop):
            explicit = {uri: e for uri, e in explicit.items() if uri not in drop}
        rows = [(e, *self._compact(e)) for e in add]
        if any(which == EXPLICIT for _, which, _, _ in rows):
            explicit = {**explicit, **{e.uri: e for e, which, _, _ in rows if which == EXPLICIT}}
        if len(drop) + len(add) > _SMALL_EDIT:
            dropped = set(drop)
            keep = [uri not in dropped for uri in self.uris]
            kept = self.where(keep) if not all(keep) else self
            n = len(rows)
            new = Rows([e.uri for e, _, _, _ in rows], array("H", [w for _, w, _, _ in rows]),
                       array("q", [size for _, _, size, _ in rows]) if n else array("q"),
                       array("d", [mtime for _, _, _, mtime in rows]) if n else array("d"))
            return _sorted_concat([kept, new], self._makers, explicit)
        uris, which, sizes, mtimes = self.uris.copy(), array("H", self._which), array("q", self._sizes), \
            array("d", self._mtimes)
        for uri in drop:
            i = bisect.bisect_left(uris, uri)
            if i < len(uris) and uris[i] == uri:
                del uris[i], which[i], sizes[i], mtimes[i]
        for entry, kind, size, mtime in rows:
            i = bisect.bisect_left(uris, entry.uri)
            uris.insert(i, entry.uri)
            which.insert(i, kind)
            sizes.insert(i, size)
            mtimes.insert(i, mtime)
        return Rows(uris, which, sizes, mtimes, self._makers, explicit)

    def _compact(self, entry: Entry) -> tuple[int, int, float]:
        """(which, size, mtime) of `entry`'s row: compact if a maker of these rows builds exactly it again."""
        size, mtime = NO_SIZE if entry.size is None else entry.size, NO_TIME if entry.mtime is None else entry.mtime
        if entry.path is not None:
            for k, maker in enumerate(self._makers):
                if (maker.source == entry.source and maker.compact_uri(entry.path) == entry.uri
                        and maker.row_entry(entry.uri, entry.size, entry.mtime) == entry):
                    return k + 1, size, mtime
        return EXPLICIT, NO_SIZE, NO_TIME

    @staticmethod
    def merged(parts: Sequence[Rows]) -> Rows:
        """One Rows over every row of `parts` (each sorted; URIs may repeat across parts only if the caller means
        to report them: see `duplicates`). A single part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        makers: list[RowMaker] = []
        renumbered: list[Rows] = []
        explicit: dict[str, Entry] = {}
        for part in parts:
            offset = len(makers)
            makers += part._makers
            which = part._which if offset == 0 else array("H", [w + offset if w else 0 for w in part._which])
            renumbered.append(Rows(part.uris, which, part._sizes, part._mtimes, (), part._explicit))
            explicit.update(part._explicit)
        return _sorted_concat(renumbered, tuple(makers), explicit)


def _sorted_concat(parts: Sequence[Rows], makers: tuple[RowMaker, ...], explicit: Mapping[str, Entry]) -> Rows:
    """Rows of every row of `parts` (which numbers into `makers` already) in URI order: one C-level sort of the row
    numbers by URI, which finds the parts' sorted runs and merges them."""
    uris = list(chain.from_iterable(p.uris for p in parts))
    which = array("H", chain.from_iterable(p._which for p in parts))
    sizes = array("q", chain.from_iterable(p._sizes for p in parts))
    mtimes = array("d", chain.from_iterable(p._mtimes for p in parts))
    if not is_sorted(uris):
        order = sorted(range(len(uris)), key=uris.__getitem__)
        uris = list(map(uris.__getitem__, order))
        which = array("H", map(which.__getitem__, order))
        sizes = array("q", map(sizes.__getitem__, order))
        mtimes = array("d", map(mtimes.__getitem__, order))
    return Rows(uris, which, sizes, mtimes, makers, explicit)


def is_sorted(keys: Sequence[str]) -> bool:
    """Whether `keys` never decrease (one C-level pass)."""
    return all(map(le, keys, islice(keys, 1, None)))


def duplicates(keys: Sequence[str]) -> set[str]:
    """The keys sorted `keys` holds more than once (one C-level pass, then only the repeats)."""
    if not any(map(eq, keys, islice(keys, 1, None))):
        return set()
    return {a for a, b in zip(keys, islice(keys, 1, None)) if a == b}


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
                entry = maker.row_entry(uri, None if size == NO_SIZE else size, None if mtime != mtime else mtime)
            yield entry

    def rows(self) -> Rows:
        """The rows in URI order (sharing this builder's columns when they were added in that order)."""
        makers = (self.maker,) if self.maker is not None else ()
        part = Rows(self.uris, self.which, self.sizes, self.mtimes, makers, {e.uri: e for e in self.explicit})
        return part if is_sorted(self.uris) else _sorted_concat([part], makers, part._explicit)


class PathIndex(Mapping[str, Entry]):
    """One collection's rows by file path (what `Catalog.paths_of` gives): a compact row is found by its URI
    (bisection), an explicit one through a dict of the explicit rows built when first needed."""

    __slots__ = ("rows", "_maker", "_explicit_paths")

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self._maker = rows.makers[0] if rows.makers else None
        self._explicit_paths: dict[str, Entry] | None = None

    def _explicit(self) -> dict[str, Entry]:
        if self._explicit_paths is None:
            self._explicit_paths = {e.path: e for e in self.rows.explicit.values() if e.path is not None}
        return self._explicit_paths

    def get(self, path: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        uri = self._maker.compact_uri(path) if self._maker is not None else None
        if uri is not None:
            i = self.rows.index_of(uri)
            if i is not None and self.rows._which[i] != EXPLICIT:
                return self.rows._row(i)
        return self._explicit().get(path, default)

    def __getitem__(self, path: str) -> Entry:
        found = self.get(path)
        if found is None:
            raise KeyError(path)
        return found

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path) is not None

    def __iter__(self) -> Iterator[str]:
        rows, maker = self.rows, self._maker
        for uri, which in zip(rows.uris, rows._which):
            if which == EXPLICIT:
                path = rows.explicit[uri].path
                if path is not None:
                    yield path
            else:
                assert maker is not None
                yield maker.path_of(uri)

    def __len__(self) -> int:
        return len(self.rows)

    def edited(self, dropped: Iterable[str], added: Mapping[str, Entry]) -> PathIndex:
        """The index without the rows of the paths `dropped` and with `added`'s entries by path (replacing any
        row their paths had)."""
        drop = [e.uri for path in chain(dropped, added) if (e := self.get(path)) is not None]
        return PathIndex(self.rows.edited(drop, sorted(added.values(), key=_URI)))
