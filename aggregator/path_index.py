"""One collection's rows by file path (`PathIndex`, what `Catalog.paths_of` gives): what a watcher's paths are
looked up in, edited along with the rows by `catalog_delta`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from operator import attrgetter

from aggregator.catalog_rows import EXPLICIT, Rows
from aggregator.chunked import Layered
from aggregator.entry import Entry

__all__ = ["PathIndex"]

_URI = attrgetter("uri")


class PathIndex(Mapping[str, Entry]):
    """One collection's rows by file path (what `Catalog.paths_of` gives): a compact row is found by its URI
    (bisection), an explicit one through a mapping of the explicit rows by path, built when first needed and
    edited along with the rows."""

    __slots__ = ("rows", "_maker", "_explicit_paths")

    def __init__(self, rows: Rows, explicit_paths: Layered[Entry] | None = None) -> None:
        self.rows = rows
        self._maker = rows.makers[0] if rows.makers else None
        self._explicit_paths = explicit_paths

    def _explicit(self) -> Layered[Entry]:
        if self._explicit_paths is None:
            self._explicit_paths = Layered({e.path: e for e in self.rows.explicit.values() if e.path is not None})
        return self._explicit_paths

    def get(self, path: str, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        uri = self._maker.compact_uri(path) if self._maker is not None else None
        if uri is not None and self.rows.is_compact(uri):
            return self.rows.get(uri)
        found: Entry | None = self._explicit().get(path, default)
        return found

    def __getitem__(self, path: str) -> Entry:
        found = self.get(path)
        if found is None:
            raise KeyError(path)
        return found

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path) is not None

    def __iter__(self) -> Iterator[str]:
        maker, explicit = self._maker, self.rows.explicit
        for uri, kind in self.rows.kinds():
            if kind == EXPLICIT:
                path = explicit[uri].path
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
        old = {path: e for path in chain(dropped, added) if (e := self.get(path)) is not None}
        rows = self.rows.edited([e.uri for e in old.values()], sorted(added.values(), key=_URI))
        paths = self._explicit_paths
        if paths is not None:  # kept in step: only the explicit rows that came or went
            paths = paths.edited([p for p, e in old.items() if not self.rows.is_compact(e.uri)],
                                 {p: e for p, e in added.items() if not rows.is_compact(e.uri)})
        return PathIndex(rows, paths)
