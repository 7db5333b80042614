"""One listed resource (`Entry`) and what resources/list shows of it.

An Entry is an immutable named tuple rather than a frozen dataclass: a frozen dataclass's `__init__` sets each of
its 14 fields through `object.__setattr__` (about 5 us an entry), a tuple is built in one step (about 0.5 us), and
catalogs of a million files build entries again whenever a page or a read asks for them (`catalog_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import NamedTuple

from aggregator.listing_change import ListingChange, compare
from aggregator.manifest.model import ConvertSettings, Display, Render

__all__ = ["Entry", "FILE_MTIME", "entries_change", "iso_time", "listed_fields"]

FILE_MTIME = "file"  # `annotations: {lastModified: file}`: list each file's modification time


class Entry(NamedTuple):
    """One listed resource. `display` is shared by every entry of a collection; per-file facts sit beside it."""

    uri: str
    name: str
    display: Display
    title: str | None = None
    mime_type: str | None = None
    size: int | None = None
    mtime: float | None = None
    source: str | None = None
    path: str | None = None
    text: str | None = None
    access: frozenset[str] = frozenset()
    """Scopes a caller needs to see or read this entry."""
    render: Render | None = None
    """A Jinja2 template (from the manifest) that produces the content."""
    decompress: bool = False
    """Served decompressed when the file's name ends in `.gz` (the manifest's `decompress: true`)."""
    convert: ConvertSettings | None = None
    """Served converted (to Markdown) within these limits: the entry says `convert:` and the file is a document."""

    @property
    def last_modified(self) -> str | None:
        """The manifest's `lastModified`, else the file's modification time (ISO 8601, UTC): what renders see."""
        annotations = self.display.annotations
        if annotations is not None and annotations.last_modified not in (None, FILE_MTIME):
            return annotations.last_modified
        return iso_time(self.mtime)

    @property
    def listed_last_modified(self) -> str | None:
        """The `lastModified` resources/list shows: only what the manifest asks for (a time, or `file`)."""
        annotations = self.display.annotations
        if annotations is None or annotations.last_modified is None:
            return None
        return iso_time(self.mtime) if annotations.last_modified == FILE_MTIME else annotations.last_modified


def listed_fields(entry: Entry) -> tuple[object, ...]:
    """What resources/list shows of an entry."""
    return (entry.uri, entry.name, entry.title, entry.display, entry.mime_type, entry.size,
            entry.listed_last_modified)


def entries_change(out: Mapping[str, Entry], fresh: Mapping[str, Entry]) -> ListingChange:
    """What replacing the entries `out` with `fresh` (each by URI) does to each caller's resources/list (and to the
    source the console shows of an entry): O(both)."""
    return compare(out, fresh, listed_fields, _access, _source)


def _access(entry: Entry) -> frozenset[str]:
    """The scopes a caller needs to see `entry`."""
    return entry.access


def _source(entry: Entry) -> str | None:
    """What the console shows of `entry` beside its listed fields (`ListingChange.detail`)."""
    return entry.source


def iso_time(mtime: float | None) -> str | None:
    if mtime is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))
