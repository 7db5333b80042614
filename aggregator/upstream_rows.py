"""An upstream's published resources as compact catalog rows: the rows hold the records' URIs, sizes and mtimes,
and `UpstreamRows` (their maker) builds each row's Entry from the records when a page or a read asks, equal to the
explicit Entry a catalog kept for it before (`published_entry`)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import cached_property

from aggregator.catalog_rows import NO_SIZE, NO_TIME, Rows
from aggregator.content import file_mime_type
from aggregator.entry import Entry
from aggregator.manifest.model import Display
from aggregator.sources.base import PublishedResource
from aggregator.upstream import records as kept
from aggregator.upstream.records import PublishedRecords

__all__ = ["UpstreamRows", "published_entry", "published_rows"]

assert kept.NO_SIZE == NO_SIZE and repr(kept.NO_TIME) == repr(NO_TIME)  # the rows share the records' columns


def published_entry(res: PublishedResource, source: str, access: frozenset[str]) -> Entry:
    """The catalog entry of one resource an upstream publishes."""
    return _entry(res.uri, res.path, res.name, res.title, res.description, res.mime_type, res.size, res.mtime,
                  source, access)


def _entry(uri: str, path: str, name: str, title: str | None, description: str | None, mime_type: str | None,
           size: int | None, mtime: float | None, source: str, access: frozenset[str]) -> Entry:
    return Entry(uri, name, Display(title, description, mime_type), title,
                 mime_type or file_mime_type(path, None, False), size, mtime, source, path, access=access)


class UpstreamRows:
    """The `RowMaker` of one upstream's published rows: entries rebuilt from its records."""

    def __init__(self, published: PublishedRecords, source: str, access: frozenset[str]) -> None:
        self.records = published.records
        self.start, self.cut = published.start, published.cut
        self.source = source
        self.access = access

    @cached_property
    def listing_key(self) -> object:
        """Equal for makers over equal records (a digest: what they build depends on every record)."""
        return ("upstream", self.source, self.cut, self.records.digest)

    @property
    def uri_space(self) -> tuple[str, str, str]:
        """A row's URI is the records' start (namespace and root) and its path: it names that path of the source."""
        return self.source, self.start, ""

    def row_entry(self, uri: str, size: int | None, mtime: float | None) -> Entry:
        index = self.records.find(uri)
        if index is None:
            raise KeyError(uri)
        name, title, description, mime_type = self.records.fields(index)
        return _entry(uri, uri[self.cut:], name, title, description, mime_type, size, mtime, self.source,
                      self.access)

    def compact_uri(self, path: str) -> str | None:
        uri = self.start + path
        return uri if self.records.find(uri) is not None else None

    def path_of(self, uri: str) -> str:
        return uri[self.cut:]

    def row_entries(self, uris: Sequence[str], sizes: Sequence[int], mtimes: Sequence[float]) -> list[Entry]:
        records, source, access, cut = self.records, self.source, self.access, self.cut
        first = records.find(uris[0]) if uris else None
        # A page of these rows is most often a run of the records: one lookup, not one a row.
        indexes: Sequence[int | None] = (range(first, first + len(uris)) if first is not None
                                         and records.uris[first:first + len(uris)] == list(uris)
                                         else [records.find(uri) for uri in uris])
        out = []
        for uri, index, size, mtime in zip(uris, indexes, sizes, mtimes):
            if index is None:
                raise KeyError(uri)
            out.append(_entry(uri, uri[cut:], *records.fields(index), None if size == NO_SIZE else size,
                              None if mtime != mtime else mtime, source, access))
        return out


def published_rows(published: Sequence[PublishedResource], source: str, access: frozenset[str]) -> Rows:
    """The catalog rows of what an upstream publishes: compact over `PublishedRecords`, else explicit entries."""
    if not isinstance(published, PublishedRecords):
        return Rows.of(published_entry(res, source, access) for res in published)
    records = published.records
    if not len(records):
        return Rows.of(())
    maker = UpstreamRows(published, source, access)
    return Rows(records.uris, array("H", [1]) * len(records), records.sizes, records.mtimes, (maker,), {})
