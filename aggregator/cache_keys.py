"""What content is cached under: a file as one read decodes it, or one query's result; and which keys to forget.

Every key names its source and the epoch that source was opened in (the catalog generation of the reload that
opened it): bytes a read finishes from a source a reload has since replaced land under a key its successor never
asks for. `Forget` is the one place that decides whether a key belongs to what changed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, assert_never

from aggregator.manifest.model import ConvertSettings

__all__ = ["CacheKey", "FileKey", "Forget", "QueryKey"]


class FileKey(NamedTuple):
    """A file's content: decoded as `mime_type`, decompressed or not, converted (with these limits) or not: a
    conversion never shares an entry with the file's bytes. A tuple, hashed and compared in C: a read looks its key
    up about six times (a dataclass's `__hash__` is a Python call each time); no other key has six fields."""

    source: str
    epoch: int
    path: str
    mime_type: str | None
    decompress: bool
    convert: ConvertSettings | None = None

    def __str__(self) -> str:  # what the cache's log lines name
        return f"{self.source}/{self.path}"


@dataclass(frozen=True, slots=True)
class QueryKey:
    """A query's result with these parameters, in this format."""

    source: str
    epoch: int
    sql: str
    params: tuple[tuple[str, str | None], ...]
    format: str

    def __str__(self) -> str:
        return f"{self.source} query"


CacheKey = FileKey | QueryKey


@dataclass(frozen=True, slots=True)
class Forget:
    """A predicate over cache keys: everything of `sources`, the files `files` names, the query results of
    `queries` (source ids). A key of any other shape is an error, never silently kept."""

    sources: frozenset[str] = frozenset()
    files: frozenset[tuple[str, str]] = frozenset()
    """(source, path) pairs."""
    queries: frozenset[str] = frozenset()

    @classmethod
    def of(cls, sources: Iterable[str] = (), files: Iterable[tuple[str, str]] = (),
           queries: Iterable[str] = ()) -> Forget:
        return cls(frozenset(sources), frozenset(files), frozenset(queries))

    def __bool__(self) -> bool:
        return bool(self.sources or self.files or self.queries)

    def __call__(self, key: Hashable) -> bool:
        if not isinstance(key, (FileKey, QueryKey)):
            raise TypeError(f"not a content cache key: {key!r}")
        if key.source in self.sources:
            return True
        match key:
            case FileKey():
                return (key.source, key.path) in self.files
            case QueryKey():
                return key.source in self.queries
            case _:
                assert_never(key)
