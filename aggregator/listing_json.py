"""resources/list items as JSON text made from the catalog's row columns: the text that encoding each entry's
`resource_dict` gives (keys sorted, as the SDK's sieve dumps them; `wire_results.page_line` writes it as it is),
without an Entry or a dict per row.

A plain collection's compact rows (`EntryBuilder.plain_bounds`: named by their path, typed by their name) differ only
in path, type, size and mtime. For each collection and kind of row (type, size known, mtime known) the item of one
row is encoded once, from `resource_dict` of its entry with the path, size and time swapped for markers, and kept as
a %-format with the markers as its slots: every constant (description, icons, annotations) is encoded by the same
code as before, and a row then costs one format. Every other row (explicit ones, other collections' compact rows)
is encoded from its entry, as before.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Iterable
from itertools import repeat
from operator import eq

from aggregator.catalog_rows import EXPLICIT, NO_SIZE, Rows
from aggregator.entry import iso_time
from aggregator.entry_builder import EntryBuilder
from aggregator.mcp_shapes import resource_dict

__all__ = ["items_json"]

_encode_sorted = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode

_PATH, _TIME, _SIZE = "\x00", "\x01", 7_340_033_777_777_777
"""What a sample entry holds in place of its path, listed time and size: control characters (never in a compact
path or an ISO time; encoded as \\u0000 and \\u0001) and a size no file has."""
_MARKS = re.compile(r"\\u0000|\\u0001|7340033777777777")

Format = tuple[str, bool]
"""A row's item as a %-format whose slots are (the listed time, if `True`), the path, (the size, if the kind has
one) and the path again: the order of the sorted keys annotations, name, size, uri."""


def items_json(rows: Rows, start: int, stop: int) -> str:
    """The JSON array of `resource_dict` of each entry of rows[start:stop], encoded with sorted keys."""
    parts: list[str] = []
    makers, explicit = rows.makers, rows.explicit
    for kind, uris, sizes, mtimes in rows.runs(start, stop):
        maker = makers[kind - 1] if kind != EXPLICIT else None
        items = _plain_items(maker, uris, sizes, mtimes) if isinstance(maker, EntryBuilder) else None
        if items is not None:
            parts.append(",".join(items))
            continue
        entries = map(explicit.__getitem__, uris) if maker is None else maker.row_entries(uris, sizes, mtimes)
        parts.append(_encode_sorted([resource_dict(entry) for entry in entries])[1:-1])
    return "[" + ",".join(parts) + "]"


def _plain_items(maker: EntryBuilder, uris: list[str], sizes: array[int], mtimes: array[float]
                 ) -> Iterable[str] | None:
    """The items of a run of `maker`'s compact rows, one format each; None when they are not plain (or a format
    cannot be made: then the run is encoded from its entries). A run of one type whose sizes and times are all
    known or all missing is formatted at C level; any other row by row."""
    bounds = maker.plain_bounds()
    if bounds is None:
        return None
    prefix, suffix = bounds
    paths = list(map(str.__getitem__, uris, repeat(slice(len(prefix), -len(suffix) or None))))
    first, sized, timed = paths[0], sizes[0] != NO_SIZE, mtimes[0] == mtimes[0]  # NaN: no mtime
    found = _format(maker, first, sized, timed)
    if found is None:
        return None
    fmt, per_file = found
    # An array of floats equals itself when none is NaN; no float of it equals itself when all are.
    if (_one_type(maker, paths) and sizes.count(NO_SIZE) == (0 if sized else len(sizes))
            and (mtimes == mtimes if timed else not any(map(eq, mtimes, mtimes)))):
        if per_file:
            times = map(iso_time, mtimes)
            return map(fmt.__mod__, zip(times, paths, sizes, paths) if sized else zip(times, paths, paths))
        return map(fmt.__mod__, zip(paths, sizes, paths) if sized else zip(paths, paths))
    return _row_by_row(maker, paths, sizes, mtimes)


def _row_by_row(maker: EntryBuilder, paths: list[str], sizes: array[int], mtimes: array[float]) -> list[str] | None:
    out: list[str] = []
    for path, size, mtime in zip(paths, sizes, mtimes):
        found = _format(maker, path, size != NO_SIZE, mtime == mtime)
        if found is None:
            return None
        fmt, per_file = found
        known = (path, size, path) if size != NO_SIZE else (path, path)
        out.append(fmt % ((iso_time(mtime), *known) if per_file else known))
    return out


def _one_type(maker: EntryBuilder, paths: list[str]) -> bool:
    """Whether every path's type is the first's: the type is declared, or every name ends in the first's
    extension (a dot and no '/' or other dot: then the last dot of each name is the one that starts it)."""
    if maker.spec.display.mime_type is not None:
        return True
    first = paths[0]
    dot = first.rfind(".")
    return dot > first.rfind("/") and all(map(str.endswith, paths, repeat(first[dot:])))


def _format(maker: EntryBuilder, path: str, sized: bool, timed: bool) -> Format | None:
    """The format of the kind of row that `path` (a compact row of `maker`) is: made once per collection and kind."""
    key = (maker.row_mime(path), sized, timed)
    formats = maker.row_formats
    if key not in formats:
        formats[key] = _made_format(maker, path, sized, timed)
    found: Format | None = formats[key]
    return found


def _made_format(maker: EntryBuilder, path: str, sized: bool, timed: bool) -> Format | None:
    """The item of `path`'s row with markers for its path, size and listed time, encoded, the markers made slots;
    None when the row is not plain after all or the encoding holds the markers elsewhere too (a description
    spelling one)."""
    bounds = maker.plain_bounds()
    assert bounds is not None
    prefix, suffix = bounds
    entry = maker.row_entry(prefix + path + suffix, 1 if sized else None, 0.0 if timed else None)
    if entry.name != path or entry.title is not None or entry.uri != prefix + path + suffix:
        return None
    sample = entry._replace(uri=prefix + _PATH + suffix, name=_PATH, path=_PATH, size=_SIZE if sized else None)
    per_file = timed and sample._replace(mtime=1.0).listed_last_modified != sample.listed_last_modified
    item = resource_dict(sample)
    if per_file:
        item["annotations"]["lastModified"] = _TIME
    text = _encode_sorted(item)
    slots = ["\\u0001"] * per_file + ["\\u0000"] + ["7340033777777777"] * sized + ["\\u0000"]
    if _MARKS.findall(text) != slots:
        return None
    return _MARKS.sub("%s", text.replace("%", "%%")), per_file

