"""An upstream's listing kept as columns: about 40 bytes an entry beside its URI string (a gateway publishing a
million upstream entries holds about 170 bytes of RSS an entry with their catalog rows), where `ListedResource`
records, the strings and the catalog entries made of them cost about 1.2 KB.

`ResourceRecords` is an immutable `Sequence[ListedResource]` in URI order: the URIs (each with a `prefix`, the
namespace a gateway lists them under, so that the catalog's rows share these strings), sizes and mtimes as arrays,
and the display text of every entry (name, title, description, mimeType) encoded in one bytes object. A record is
rebuilt when asked for, equal to the one kept. `Packed` makes them in two steps (the URI strings once the listed
records are gone). `PublishedRecords` is the same columns as what a source publishes (`PublishedResource`), under a
root.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Sequence
from functools import cached_property
from itertools import accumulate, compress
from operator import attrgetter
from typing import TypeVar, overload

from aggregator.sources.base import PublishedResource
from aggregator.upstream.answers import ListedResource

__all__ = ["NO_SIZE", "NO_TIME", "Packed", "PublishedRecords", "ResourceRecords"]

NO_SIZE = -1
"""A size column's value for an entry without a size (as `catalog_rows`, whose rows share these columns)."""
NO_TIME = math.nan
"""An mtime column's value for an entry without an mtime (as `catalog_rows`)."""
_SEP = "\x00"
"""Between a record's fields: an upstream's display text has no control characters once `UpstreamValues` cleaned it
(a record whose text has one anyway is kept whole, see `_odd`)."""
_TAGS = (("t", 1), ("d", 2), ("m", 3))
"""The letter that starts each optional field of a record (title, description, mimeType) and its place."""
_URI = attrgetter("uri")
T = TypeVar("T")


def _encoded(item: ListedResource) -> bytes | None:
    """`item`'s display text as one record (name, then each optional field present with its tag), None if a field
    holds the separator."""
    fields = (item.name, item.title, item.description, item.mime_type)
    if any(f is not None and _SEP in f for f in fields):
        return None
    text = item.name
    for (tag, at) in _TAGS:
        value = fields[at]
        if value is not None:
            text += _SEP + tag + value
    return text.encode("utf-8", "surrogatepass")


class _Built(Sequence[T]):
    """A sequence whose items are built when asked for (`_at`, of an index in range)."""

    __slots__ = ()

    def _at(self, index: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._at(index)

    def __iter__(self) -> Iterator[T]:
        return map(self._at, range(len(self)))


class ResourceRecords(_Built[ListedResource]):
    """An upstream's resources in URI order (each URI once), as columns; `uris` hold `prefix` + the upstream URI."""

    def __init__(self, items: Iterable[ListedResource], prefix: str = "") -> None:
        packed = Packed(items, prefix)
        self._set(prefix, packed.uri_list(), packed.sizes, packed.mtimes, packed.text, packed.ends, packed.odd)

    def _set(self, prefix: str, uris: list[str], sizes: array[int], mtimes: array[float], text: bytes,
             ends: array[int], odd: dict[int, ListedResource]) -> None:
        self.prefix = prefix
        self.uris = uris
        """The URIs, sorted, each `prefix` + the upstream's URI (the strings the catalog's rows hold)."""
        self.sizes, self.mtimes = sizes, mtimes
        self._text, self._ends = text, ends
        self._odd = odd
        """Records kept whole, by index: those whose text holds the separator (none once cleaned)."""

    @classmethod
    def _of(cls, prefix: str, uris: list[str], sizes: array[int], mtimes: array[float], text: bytes,
            ends: array[int], odd: dict[int, ListedResource]) -> ResourceRecords:
        records = cls.__new__(cls)
        records._set(prefix, uris, sizes, mtimes, text, ends, odd)
        return records

    def __len__(self) -> int:
        return len(self.uris)

    def _at(self, index: int) -> ListedResource:
        odd = self._odd.get(index)
        if odd is not None:
            return odd
        name, title, description, mime_type = self.fields(index)
        size, mtime = self.sizes[index], self.mtimes[index]
        return ListedResource(self.uris[index][len(self.prefix):], name, title, description, mime_type,
                              None if size == NO_SIZE else size, None if mtime != mtime else mtime)

    def fields(self, index: int) -> tuple[str, str | None, str | None, str | None]:
        """(name, title, description, mimeType) of the record at `index`."""
        odd = self._odd.get(index)
        if odd is not None:
            return odd.name, odd.title, odd.description, odd.mime_type
        start = self._ends[index - 1] if index else 0
        name, *rest = self._text[start:self._ends[index]].decode("utf-8", "surrogatepass").split(_SEP)
        found: list[str | None] = [name, None, None, None]
        for field in rest:
            found[next(at for tag, at in _TAGS if tag == field[0])] = field[1:]
        return found[0], found[1], found[2], found[3]  # type: ignore[return-value]

    def same(self, index: int, other: ResourceRecords, at: int) -> bool:
        """Whether record `index` rebuilds equal to `other`'s record `at` but for the URI (compared by the caller)."""
        if self._odd or other._odd:
            return self[index] == other[at]
        mine, theirs = self.mtimes[index], other.mtimes[at]
        return (self.sizes[index] == other.sizes[at] and (mine == theirs or (mine != mine and theirs != theirs))
                and self._text[(self._ends[index - 1] if index else 0):self._ends[index]]
                == other._text[(other._ends[at - 1] if at else 0):other._ends[at]])

    def find(self, uri: str) -> int | None:
        """The index of the record whose URI (with the prefix) is `uri`, None if none. O(log n)."""
        i = bisect_left(self.uris, uri)
        return i if i < len(self.uris) and self.uris[i] == uri else None

    def under(self, start: str) -> ResourceRecords:
        """The records whose URI (with the prefix) starts with `start` and goes past it (self when all do)."""
        keep = [len(uri) > len(start) and uri.startswith(start) for uri in self.uris]
        if all(keep):
            return self
        kept = [i for i, k in enumerate(keep) if k]
        parts = [self._text[(self._ends[i - 1] if i else 0):self._ends[i]] for i in kept]
        odd = {j: self._odd[i] for j, i in enumerate(kept) if i in self._odd}
        return ResourceRecords._of(self.prefix, list(compress(self.uris, keep)), array("q", compress(self.sizes, keep)),
                                   array("d", compress(self.mtimes, keep)), b"".join(parts),
                                   array("Q", accumulate(map(len, parts))), odd)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResourceRecords):
            return self.prefix == other.prefix and self.digest == other.digest
        return isinstance(other, Sequence) and list(self) == list(other)

    @cached_property
    def digest(self) -> bytes:
        """Equal for records that rebuild equal `ListedResource`s at equal URIs (a hash of the columns)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self.prefix.encode("utf-8", "surrogatepass") + b"\x00")
        h.update(_SEP.join(self.uris).encode("utf-8", "surrogatepass"))
        for column in (self.sizes, self.mtimes, self._ends):
            h.update(column.tobytes())
        h.update(self._text)
        h.update(repr(sorted(self._odd.items())).encode("utf-8", "surrogatepass"))
        return h.digest()


class Packed:
    """A listing's records encoded in a few big objects, the URIs in one string: what `ResourceRecords` are made of
    (`records()`) once the `ListedResource`s are gone. Made while those were alive, a million URI strings would be
    strewn over the memory they took, which would then stay the process's; made after, they fill the heap in
    order."""

    def __init__(self, items: Iterable[ListedResource], prefix: str) -> None:
        ordered = sorted(items, key=_URI)
        self.prefix = prefix
        self.count = len(ordered)
        uris = list(map(_URI, ordered))
        self.uris: str | list[str] = (prefix + "\n".join(uris).replace("\n", "\n" + prefix) if prefix else
                                      "\n".join(uris)) if not any("\n" in uri for uri in uris) else \
            [prefix + uri for uri in uris]  # a URI with a line break (none once cleaned): strings as they are
        del uris
        self.sizes = array("q", [NO_SIZE if item.size is None else item.size for item in ordered])
        self.mtimes = array("d", [NO_TIME if item.mtime is None else item.mtime for item in ordered])
        records = [_encoded(item) for item in ordered]
        self.odd = {i: item for i, (item, record) in enumerate(zip(ordered, records)) if record is None}
        parts = [b"" if record is None else record for record in records]
        self.ends = array("Q", accumulate(map(len, parts)))
        self.text = b"".join(parts)

    def uri_list(self) -> list[str]:
        """The URI strings (made now)."""
        return self.uris if isinstance(self.uris, list) else self.uris.split("\n") if self.count else []

    def records(self, kept: ResourceRecords | None = None) -> ResourceRecords:
        """The records (their URI strings made now); a URI `kept` lists too is `kept`'s string, not a copy."""
        uris = self.uri_list()
        if kept is not None and kept.prefix == self.prefix:
            _shared(uris, kept.uris)
        return ResourceRecords._of(self.prefix, uris, self.sizes, self.mtimes, self.text, self.ends, self.odd)


def _shared(new: list[str], old: list[str]) -> None:
    """Each string of `new` that `old` holds too replaced by `old`'s (both sorted), in one walk: a relisting keeps
    the strings it had (the catalog's rows share them) rather than making a million anew, which would be strewn over
    the pages the listing's transient objects took and keep them the process's once the old ones are freed."""
    i, n = 0, len(old)
    for j, uri in enumerate(new):
        while i < n and old[i] < uri:
            i += 1
        if i < n and old[i] == uri:
            new[j] = old[i]
            i += 1


class PublishedRecords(_Built[PublishedResource]):
    """`records` as a source publishes them: the URI as the records hold it (the namespace's), the path what
    follows `prefix` + `root` in it. Each `PublishedResource` is built when asked for."""

    __slots__ = ("records", "start", "cut")

    def __init__(self, records: ResourceRecords, root: str) -> None:
        self.start = records.prefix + root
        """What every URI starts with before its path."""
        self.records = records.under(self.start)
        self.cut = len(self.start)

    def __len__(self) -> int:
        return len(self.records)

    def _at(self, index: int) -> PublishedResource:
        item = self.records[index]
        uri = self.records.uris[index]
        return PublishedResource(uri, uri[self.cut:], item.name, item.title, item.description, item.mime_type,
                                 item.size, item.mtime)

    def changed(self, before: PublishedRecords) -> tuple[list[str], list[PublishedResource]]:
        """What differs from `before` (of the same start): the URIs of `before` gone or changed, and the resources
        new or changed, in one walk of both URI lists (only those resources built)."""
        a, b = before.records, self.records
        old, new = a.uris, b.uris
        gone: list[str] = []
        came: list[int] = []
        i = j = 0
        while i < len(old) or j < len(new):
            if j == len(new) or (i < len(old) and old[i] < new[j]):
                gone.append(old[i])
                i += 1
            elif i == len(old) or new[j] < old[i]:
                came.append(j)
                j += 1
            else:
                if not b.same(j, a, i):
                    gone.append(old[i])
                    came.append(j)
                i, j = i + 1, j + 1
        return gone, [self._at(j) for j in came]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PublishedRecords):
            return self.start == other.start and self.records.digest == other.records.digest
        return isinstance(other, Sequence) and list(self) == list(other)

    def locations(self, paths: Collection[str] | None = None) -> Iterable[tuple[str, str]]:
        """(URI, path) of each (only those at `paths`, when given: looked up, O(log n) a path), without building
        the rest."""
        start, cut, records = self.start, self.cut, self.records
        if paths is None:
            return ((uri, uri[cut:]) for uri in records.uris)
        return [(start + path, path) for path in paths if path and records.find(start + path) is not None]

