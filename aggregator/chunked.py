"""Immutable containers whose edited copies share what the edit did not touch: the catalog's sorted entries and its
path indexes change by a few items at a time, and a copy of a million items per change costs more than the change.

`Chunked` is a sequence kept in chunks of about `LOAD` items; `edited` gives a copy of sorted keys and their items
with keys dropped and added, copying only the chunks it touches and the list of chunks: O(len / LOAD + LOAD + edit).
`Layered` is a mapping over a base dict that is never changed and the changes made since; `edited` copies the
changes only, and folds them into a new base once they outgrow a share of it (amortized O(sqrt(len)) per item).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain
from math import isqrt
from operator import itemgetter
from typing import Any, TypeVar, overload

__all__ = ["LOAD", "Chunked", "Layered", "chunked", "edited", "find_left", "find_right"]

T = TypeVar("T")
V = TypeVar("V")
LOAD = 1024
"""Items a chunk is cut to; a chunk grown past twice this is cut again."""
_FEW = 32
"""Items added to one chunk by inserting each; past this, by one merge."""
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_GONE: Any = object()  # a key a Layered's changes removed


class Chunked(Sequence[T]):
    """A sequence stored as a list of chunks (lists), none empty; never changed once made."""

    __slots__ = ("_chunks", "_starts", "_lasts")

    def __init__(self, chunks: list[list[T]]) -> None:
        self._chunks = chunks
        self._starts = [0, *accumulate(map(len, chunks))]  # chunk c holds items starts[c] .. starts[c + 1] - 1
        self._lasts: list[T] | None = None

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return self._slice(index)
        size = self._starts[-1]
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("Chunked index out of range")
        c = bisect_right(self._starts, index) - 1
        return self._chunks[c][index - self._starts[c]]

    def _slice(self, index: slice) -> list[T]:
        start, stop, step = index.indices(self._starts[-1])
        if step != 1:
            return list(self)[index]
        out: list[T] = []
        c = bisect_right(self._starts, start) - 1
        while start < stop:
            taken = self._chunks[c][start - self._starts[c] : stop - self._starts[c]]
            out += taken
            start += len(taken)
            c += 1
        return out

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._chunks)

    def __reversed__(self) -> Iterator[T]:
        return chain.from_iterable(map(reversed, reversed(self._chunks)))

    def lasts(self) -> list[T]:
        """The last item of each chunk (for sorted keys: what to bisect first)."""
        if self._lasts is None:
            self._lasts = [chunk[-1] for chunk in self._chunks]
        return self._lasts

    def bisect_left(self, key: Any, key_of: Callable[[Any], Any] | None = None) -> int:
        """`bisect.bisect_left` over sorted items, a bisection of the chunks' last items then of one chunk."""
        c = bisect_left(self.lasts(), key, key=key_of)
        if c == len(self._chunks):
            return self._starts[-1]
        return self._starts[c] + bisect_left(self._chunks[c], key, key=key_of)

    def bisect_right(self, key: Any, key_of: Callable[[Any], Any] | None = None) -> int:
        c = bisect_right(self.lasts(), key, key=key_of)
        if c == len(self._chunks):
            return self._starts[-1]
        return self._starts[c] + bisect_right(self._chunks[c], key, key=key_of)


def find_left(keys: Sequence[Any], key: Any, lo: int = 0, key_of: Callable[[Any], Any] | None = None) -> int:
    """`bisect.bisect_left(keys, key, lo, key=key_of)` for a list, a tuple or a Chunked (bisected chunk-wise rather
    than item by item through `__getitem__`)."""
    if isinstance(keys, Chunked):
        return max(lo, keys.bisect_left(key, key_of))
    return bisect_left(keys, key, lo, key=key_of)


def find_right(keys: Sequence[Any], key: Any, lo: int = 0, key_of: Callable[[Any], Any] | None = None) -> int:
    """`bisect.bisect_right` as `find_left` does it."""
    if isinstance(keys, Chunked):
        return max(lo, keys.bisect_right(key, key_of))
    return bisect_right(keys, key, lo, key=key_of)


def chunked(items: Sequence[T]) -> Chunked[T]:
    """`items` as a Chunked (itself if it is one): C-level slices, once."""
    if isinstance(items, Chunked):
        return items
    return Chunked([list(items[i : i + LOAD]) for i in range(0, len(items), LOAD)])


def edited(keys: Chunked[Any], items: Chunked[T], drop: Iterable[Any], add: Iterable[tuple[Any, T]]
           ) -> tuple[Chunked[Any], Chunked[T]]:
    """Copies of sorted `keys` and their `items` (chunked alike) without the keys in `drop` (those present) and
    with `add`'s (key, item) pairs (keys not otherwise present) inserted in order. Chunks not touched are shared."""
    key_chunks, item_chunks = list(keys._chunks), list(items._chunks)
    lasts = keys.lasts()
    touched: dict[int, tuple[list[Any], list[T]]] = {}

    def chunk(c: int) -> tuple[list[Any], list[T]]:
        found = touched.get(c)
        if found is None:
            found = touched[c] = (key_chunks[c].copy(), item_chunks[c].copy())
        return found

    for key in drop:
        c = bisect_left(lasts, key)
        if c < len(lasts):
            chunk_keys, chunk_items = chunk(c)
            i = bisect_left(chunk_keys, key)
            if i < len(chunk_keys) and chunk_keys[i] == key:
                del chunk_keys[i], chunk_items[i]
    by_chunk: dict[int, list[tuple[Any, T]]] = {}
    for key, item in add:
        if not key_chunks:
            key_chunks.append([])
            item_chunks.append([])
            lasts = [key]
        # Located by the last items before the edit: past every chunk's, it goes at the end of the last one.
        by_chunk.setdefault(min(bisect_left(lasts, key), len(lasts) - 1), []).append((key, item))
    for c, pairs in by_chunk.items():
        chunk_keys, chunk_items = chunk(c)
        if len(pairs) <= _FEW:
            for key, item in pairs:
                i = bisect_left(chunk_keys, key)
                chunk_keys.insert(i, key)
                chunk_items.insert(i, item)
        else:  # a folder moved in: one merge of two sorted runs (C-level) rather than an insert each
            merged = sorted(chain(zip(chunk_keys, chunk_items), pairs), key=_FIRST)
            chunk_keys[:] = map(_FIRST, merged)
            chunk_items[:] = map(_SECOND, merged)
    if not touched:
        return keys, items
    for c in sorted(touched, reverse=True):  # from the end: the positions of those before stay put
        chunk_keys, chunk_items = touched[c]
        cuts = range(0, len(chunk_keys), LOAD) if len(chunk_keys) > 2 * LOAD else range(min(1, len(chunk_keys)))
        key_chunks[c : c + 1] = [chunk_keys[i : i + LOAD] if len(cuts) > 1 else chunk_keys for i in cuts]
        item_chunks[c : c + 1] = [chunk_items[i : i + LOAD] if len(cuts) > 1 else chunk_items for i in cuts]
    return Chunked(key_chunks), Chunked(item_chunks)


class Layered(Mapping[str, V]):
    """A mapping: a base dict (shared, never changed) and the changes made since (a key removed maps to _GONE)."""

    __slots__ = ("_base", "_changes", "_len")

    def __init__(self, base: dict[str, V], changes: dict[str, V] | None = None, size: int | None = None) -> None:
        self._base = base
        self._changes: dict[str, V] = changes or {}
        self._len = len(base) if size is None else size

    @classmethod
    def of(cls, mapping: Mapping[str, V]) -> Layered[V]:
        """`mapping` as a Layered (itself if it is one; a dict becomes the base as it is, not copied)."""
        if isinstance(mapping, Layered):
            return mapping
        return cls(mapping if isinstance(mapping, dict) else dict(mapping))

    def __getitem__(self, key: str) -> V:
        if key in self._changes:
            value = self._changes[key]
            if value is _GONE:
                raise KeyError(key)
            return value
        return self._base[key]

    def get(self, key: str, default: Any = None) -> Any:
        if self._changes:
            value = self._changes.get(key, self)
            if value is not self:
                return default if value is _GONE else value
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        if self._changes and key in self._changes:
            return self._changes[key] is not _GONE
        return key in self._base

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        if not self._changes:
            return iter(self._base)
        changes = self._changes
        return chain((k for k in self._base if k not in changes), (k for k, v in changes.items() if v is not _GONE))

    def values(self) -> _Values[V]:  # type: ignore[override]
        return _Values(self)

    def edited(self, drop: Iterable[str], add: Mapping[str, V]) -> Layered[V]:
        """A copy without the keys in `drop` and with `add` (added or replacing); this one is not changed."""
        changes, base = dict(self._changes), self._base
        size = self._len

        def present(key: str) -> bool:
            return changes[key] is not _GONE if key in changes else key in base

        for key in drop:
            if present(key):
                changes[key] = _GONE
                size -= 1
        for key, value in add.items():
            size += not present(key)
            changes[key] = value
        if len(changes) <= max(LOAD, 4 * isqrt(len(self._base))):
            return Layered(self._base, changes, size)
        base = dict(self._base)  # the changes outgrew their share: fold them into a new base
        for key, value in changes.items():
            if value is _GONE:
                base.pop(key, None)
            else:
                base[key] = value
        return Layered(base)


class _Values(Collection[V]):
    """A Layered's values, in no particular order."""

    __slots__ = ("_of",)

    def __init__(self, of: Layered[V]) -> None:
        self._of = of

    def __len__(self) -> int:
        return len(self._of)

    def __iter__(self) -> Iterator[V]:
        of = self._of
        if not of._changes:
            return iter(of._base.values())
        changes = of._changes
        return chain((v for k, v in of._base.items() if k not in changes),
                     (v for v in changes.values() if v is not _GONE))

    def __contains__(self, value: object) -> bool:
        return any(v is value or v == value for v in self)
