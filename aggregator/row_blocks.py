"""Blocks of row columns (`catalog_rows`): cut, filtered and inserted into, each block a copy the caller owns.

A block is a list of sorted URIs and three arrays beside it (which maker built the row, size, mtime). Rows keep
their blocks at most twice `LOAD` rows long, so an edit copies a few of them, never the whole listing.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterator, Sequence
from itertools import chain, compress, groupby, islice
from operator import eq, itemgetter, le
from typing import TypeVar

__all__ = ["Block", "compressed", "cut", "duplicates", "insert_rows", "is_sorted", "joined_makers", "runs"]

Block = tuple[list[str], "array[int]", "array[int]", "array[float]"]
"""One block of rows: URIs (sorted), which, sizes, mtimes."""
Row = tuple[str, int, int, float]
"""One row of a block: uri, which, size, mtime."""
M = TypeVar("M")
_FIRST, _SECOND, _THIRD, _FOURTH = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)
_FEW = 32
"""Rows added to one block by inserting each; past this, by one merge."""


def cut(blocks: Sequence[Block], load: int) -> list[Block]:
    """`blocks` with each block past twice `load` rows cut into blocks of `load` (C-level slices; the others are
    shared)."""
    if not blocks or max(map(len, map(_FIRST, blocks))) <= 2 * load:
        return list(blocks)
    out: list[Block] = []
    for block in blocks:
        uris, which, sizes, mtimes = block
        if len(uris) <= 2 * load:
            out.append(block)  # the same object: what is derived from a block (a search table's part) holds
            continue
        out += [(uris[i:i + load], which[i:i + load], sizes[i:i + load], mtimes[i:i + load])
                for i in range(0, len(uris), load)]
    return out


def compressed(block: Block, keep: Sequence[bool]) -> Block:
    """The rows of `block` whose `keep` is true (the block itself when every one is)."""
    uris, which, sizes, mtimes = block
    if all(keep):
        return block
    return (list(compress(uris, keep)), array("H", compress(which, keep)), array("q", compress(sizes, keep)),
            array("d", compress(mtimes, keep)))


def insert_rows(block: Block, rows: Sequence[Row]) -> None:
    """Insert `rows` (sorted by URI, URIs not in the block) into `block` (a copy, changed in place): a few one by
    one, many (a collection listed anew) by one merge of the two sorted runs."""
    uris, which, sizes, mtimes = block
    if len(rows) <= _FEW:
        for uri, kind, size, mtime in rows:
            j = bisect_left(uris, uri)
            uris.insert(j, uri)
            which.insert(j, kind)
            sizes.insert(j, size)
            mtimes.insert(j, mtime)
        return
    merged = sorted(chain(zip(uris, which, sizes, mtimes), rows), key=_FIRST)  # timsort: one merge of two runs
    uris[:] = map(_FIRST, merged)
    which[:] = array("H", map(_SECOND, merged))
    sizes[:] = array("q", map(_THIRD, merged))
    mtimes[:] = array("d", map(_FOURTH, merged))


def joined_makers(mine: tuple[M, ...], theirs: tuple[M, ...], used: Collection[int], vacant: M
                  ) -> tuple[tuple[M, ...], list[int]]:
    """`mine` with those of `theirs` that rows use (their `which` in `used`) and are not among them (by identity)
    put in the `vacant` slots, then after them; and for each `which` of `theirs` (0: an explicit row) its `which`
    among the joined makers. Makers already there keep their slots, so the blocks of `mine` mean the same."""
    makers, remap = list(mine), [0]
    free = (i for i, maker in enumerate(mine) if maker is vacant)
    for kind, maker in enumerate(theirs, start=1):
        if kind not in used:
            remap.append(0)  # no row names it
            continue
        at = next((i for i, known in enumerate(makers) if known is maker), None)
        if at is None:
            at = next(free, None)
            if at is None:
                makers.append(maker)
                at = len(makers) - 1
            else:
                makers[at] = maker
        remap.append(at + 1)
    return tuple(makers), remap


def runs(column: array[int], start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """(value, i, j) for each run of equal values in column[start:stop] (i, j: where it starts and ends): one C-level
    count when the part is a single run."""
    part = column[start:stop]
    if not part:
        return
    if part.count(part[0]) == len(part):
        yield part[0], start, stop
        return
    i = start
    for value, group in groupby(part):
        j = i + sum(1 for _ in group)
        yield value, i, j
        i = j


def is_sorted(keys: Sequence[str]) -> bool:
    """Whether `keys` never decrease (one C-level pass)."""
    return all(map(le, keys, islice(keys, 1, None)))


def duplicates(keys: Sequence[str]) -> set[str]:
    """The keys sorted `keys` holds more than once (one C-level pass, then only the repeats)."""
    if not any(map(eq, keys, islice(keys, 1, None))):
        return set()
    return {a for a, b in zip(keys, islice(keys, 1, None)) if a == b}
