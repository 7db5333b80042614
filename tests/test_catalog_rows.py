"""Catalog entries kept as columns (catalog_rows): what compact rows build again is exactly what the entry builder
makes of each file, whatever the names and patterns; edits, filters and merges of rows equal the same done to a
list of entries."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.rows_change import rows_change
from aggregator.catalog import Catalog
from aggregator.catalog_rows import Rows
from aggregator.compiler import EntryBuilder, collection_key, compile_catalog
from aggregator.entry import Entry, listed_fields
from aggregator.manifest.model import (Annotations, CollectionSpec, ConvertSettings, Defaults, Display, Location,
                                       Manifest, ServerSettings, SourceSpec)
from aggregator.sources import FileInfo, LocalSource

NAMES = ["a.md", "b.MD", "sub/c.md", "sub/deep/e.txt", "sp ace.md", "caf\u00e9.md", "pct%41.md", "q?x.md",
         "x.tar.gz", "r.md.gz", "doc.pdf", "noext", "dot.", "sub.md", "sub-x.md", "sub0.md", "~t.md", "-d.md",
         "a..b.md", "bytes-\udce9.md", "#frag.md", "UP/Z.md"]
"""Names a compact row can hold and names it cannot (spaces, non-ASCII, raw bytes, '%', '?', '#'), extensions
that decide the type (or decompress, or convert), and folders that sort next to files (`sub.md` < `sub/` <
`sub0.md`)."""

WHERE = Location("m.yaml", 5, 3)


def _collections() -> list[CollectionSpec]:
    def spec(i: int, uri: str, name: str = "{path}", glob: str = "**", **kw: object) -> CollectionSpec:
        display = kw.pop("display", Display())
        return CollectionSpec("docs", glob, uri, name, display, Location("m.yaml", 10 + i, 3),  # type: ignore[arg-type]
                              f"collections[{i}]", **kw)  # type: ignore[arg-type]

    return [
        spec(0, "a://{path}"),  # compact: the URI is a prefix and the path
        spec(1, "b://x/{path}/raw", "{stem}"),  # compact, with a suffix (its URIs do not sort as its paths do)
        spec(2, "c://{name}", "{name}", glob="sub/**"),  # not compact: {name} is no path
        spec(3, "d://{path}", "{path}", display=Display(title="{stem} ({ext})", mime_type="text/plain",
                                                         annotations=Annotations(last_modified="file"))),
        spec(4, "e://{path}", decompress=True, access=frozenset({"s"})),
        spec(5, "f://{path}", convert=ConvertSettings()),
        spec(6, "g://{{literal}}/{path}?v=1"),  # literal braces and a query around the path
    ]


def _write(root: Path) -> None:
    for i, name in enumerate(NAMES):
        path = os.path.join(os.fsencode(root), os.fsencode(name))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(b"x" * i)
        os.utime(path, (1_700_000_000 + i / 8, 1_700_000_000 + i / 8))


def test_compact_rows_build_what_the_entry_builder_makes(tmp_path: Path) -> None:
    _write(tmp_path)
    collections = _collections()
    source = SourceSpec("docs", str(tmp_path), "file", Location("m.yaml", 1, 1), "sources.docs")
    manifest = Manifest(Path("m.yaml"), ServerSettings("t"), Defaults(), {"docs": source}, (), tuple(collections), ())
    local = LocalSource("docs", str(tmp_path))
    catalog = anyio.run(compile_catalog, manifest, {"docs": local})
    files = anyio.run(local.list, "**")
    expected: list[Entry] = []
    compact = 0
    for spec in collections:
        rows = catalog.collections[collection_key(spec)]
        assert isinstance(rows, Rows)
        builder = EntryBuilder(spec)
        made = [e for info in files if (e := builder.entry(info)) is not None
                and (spec.glob == "**" or info.path.startswith("sub/"))]
        assert list(rows) == sorted(made, key=lambda e: e.uri), spec.key
        compact += len(rows) - len(rows.explicit)
        for entry in made:  # by path as catalog_delta asks, by URI as reads do
            assert catalog.paths_of(collection_key(spec)).get(entry.path or "") == entry
            assert catalog.get(entry.uri) == entry
        expected += made
    assert compact >= 5 * 15  # most of these names fit a compact row in the five compact patterns
    assert list(catalog.entries) == sorted(expected, key=lambda e: e.uri)
    everything = list(catalog.entries)
    for size in (1, 3, 7, 500):  # pages built a page at a time equal the entries one by one
        pages = [entry for start in range(0, len(everything), size) for entry in catalog.entries[start:start + size]]
        assert pages == everything
    assert catalog.targets() == {(e.source, e.path) for e in everything}
    assert catalog.access_count == sum(1 for e in everything if e.access)
    for scopes in (frozenset(), frozenset({"s"})):
        visible, uris = catalog.visible(scopes)
        assert list(visible) == [e for e in everything if e.access <= scopes] and list(uris) == [e.uri for e in visible]


def _entry(uri: str, size: int) -> Entry:
    return Entry(uri, uri, Display(), size=size, source="docs", path=uri)


_uris = st.sets(st.text("abc/é", min_size=1, max_size=4), max_size=12)


@settings(max_examples=200, deadline=None)
@given(before=_uris, drop=_uris, add=_uris)
def test_edited_rows_equal_the_edited_list(before: set[str], drop: set[str], add: set[str]) -> None:
    rows = Rows.of(_entry(u, 1) for u in before)
    new = sorted((_entry(u, 2) for u in add - (before - drop)), key=lambda e: e.uri)
    edited = rows.edited(drop, new)
    want = sorted([e for e in rows if e.uri not in drop] + new, key=lambda e: e.uri)
    assert list(edited) == want and list(edited.uris) == [e.uri for e in want]
    assert list(rows) == sorted((_entry(u, 1) for u in before), key=lambda e: e.uri)  # the original is unchanged
    merged = Rows.merged([rows, Rows.of(_entry(u, 3) for u in add - before)])
    assert list(merged.uris) == sorted(before | (add - before)) and Catalog(merged, ()).get("nope") is None


@settings(max_examples=100, deadline=None)
@given(paths=st.lists(st.sampled_from(["noext", "a.md", "b", "c.TXT", "d.md", "dot.", "e.", "x.tar.gz", "y.gz",
                                       "sub.d/f", "sub.d/f.md", ".md", "md", "q/.md", "r.markdown"]), max_size=12))
def test_a_page_built_in_one_loop_equals_its_entries_one_by_one(paths: list[str]) -> None:
    """`row_entries` (a page's compact rows) remembers the last extension: whatever the order of names, it gives
    what the builder makes of each file."""
    for spec in _collections():
        builder = EntryBuilder(spec)
        uris = [uri for path in paths if (uri := builder.compact_uri(path)) is not None]
        sizes, mtimes = list(range(len(uris))), [1_700_000_000.5] * len(uris)
        want = [builder.entry(FileInfo(builder.path_of(u), s, t)) for u, s, t in zip(uris, sizes, mtimes)]
        assert builder.row_entries(uris, sizes, mtimes) == want, spec.key


_PATHS = ["a.md", "b.md", "c.md", "d/e.md", "d/f.md", "g.md", "h i.md", "j.md", "k.txt", "l.md", "m/n.md", "o.md"]


@settings(max_examples=150, deadline=None)
@given(first=st.sets(st.sampled_from(_PATHS)),
       edits=st.lists(st.tuples(st.sets(st.sampled_from(_PATHS), max_size=4), st.sets(st.sampled_from(_PATHS),
                                                                                      max_size=4)), max_size=6),
       load=st.sampled_from([1, 2, 3, 1024]))
def test_rows_in_blocks_edited_equal_a_sorted_list(first: set[str], edits: list[tuple[set[str], set[str]]],
                                                    load: int) -> None:
    """Rows cut into blocks of `load` rows, edited again and again (paths dropped, paths written: compact ones and
    one needing percent-encoding), read every way, equal a plain sorted list of the entries built directly."""
    import aggregator.catalog_rows as catalog_rows
    from aggregator.catalog_rows import RowsBuilder
    from aggregator.path_index import PathIndex

    spec = _collections()[0]
    builder = EntryBuilder(spec)

    def made(path: str, size: int) -> Entry:
        entry = builder.entry(FileInfo(path, size, 1_700_000_000.25))
        assert entry is not None
        return entry

    saved = catalog_rows.LOAD
    catalog_rows.LOAD = load
    try:
        listing = RowsBuilder(builder)
        for path in sorted(first):
            if (uri := builder.compact_uri(path)) is not None:
                listing.compact_row(uri, 1, 1_700_000_000.25)
            else:
                listing.explicit_row(made(path, 1))
        index = PathIndex(listing.rows())
        model = {path: made(path, 1) for path in first}
        for step, (dropped, written) in enumerate(edits, start=2):
            index = index.edited(dropped - written, {path: made(path, step) for path in written})
            for path in dropped - written:
                model.pop(path, None)
            model.update((path, made(path, step)) for path in written)
            want = sorted(model.values(), key=lambda e: e.uri)
            rows = index.rows
            assert list(rows) == want and list(rows.uris) == [e.uri for e in want]
            assert [rows[i] for i in range(len(rows))] == want and rows[1:-1] == want[1:-1]
            assert all(index.get(path) == model.get(path) for path in _PATHS) and set(index) == set(model)
            assert rows.files() == {("docs", p) for p in model}
            assert rows.count_needing_scopes() == 0 and len(rows.visible_to(frozenset())) == len(want)
            assert len(rows.explicit) == sum(1 for e in want if builder.compact_uri(e.path or "") is None)
    finally:
        catalog_rows.LOAD = saved


def _listing(builder: EntryBuilder, paths: set[str], size: int, mtime: float | None = 1_700_000_000.5,
             compact: bool = True) -> tuple[Rows, list[Entry]]:
    """What listing `paths` with `builder`'s collection gives: its rows (`compact` ones where they can be), and the
    entries the builder makes."""
    from aggregator.catalog_rows import RowsBuilder

    listing, made = RowsBuilder(builder), []
    for path in sorted(paths):
        entry = builder.entry(FileInfo(path, size, mtime))
        if entry is None:
            continue
        made.append(entry)
        if compact and (uri := builder.compact_uri(path)) is not None:
            listing.compact_row(uri, size, mtime)
        else:
            listing.explicit_row(entry)
    return listing.rows(), made


@settings(max_examples=150, deadline=None)
@given(first=st.sets(st.sampled_from(_PATHS), min_size=1),
       saves=st.lists(st.tuples(st.sampled_from([0, 1, 3, 6]), st.sets(st.sampled_from(_PATHS))), max_size=24),
       load=st.sampled_from([1, 2, 1024]))
def test_rows_edited_with_listings_equal_the_listings_merged(first: set[str], saves: list[tuple[int, set[str]]],
                                                             load: int) -> None:
    """What a save does to the catalog's rows: a collection's rows dropped and its new listing (Rows with their own
    maker) put in their place, again and again, equals the entries of the collections now listed, sorted, and makers
    no row uses are let go."""
    import aggregator.catalog_rows as catalog_rows

    specs = _collections()
    saved, prune = catalog_rows.LOAD, catalog_rows._PRUNE_AFTER
    catalog_rows.LOAD, catalog_rows._PRUNE_AFTER = load, 2
    try:
        rows, made = _listing(EntryBuilder(specs[0]), first, 1)
        listed = {0: made}  # by collection: what it lists now
        for step, (which, paths) in enumerate(saves, start=2):
            # A collection's settings changed: it is listed anew with a new builder (another maker).
            fresh, made = _listing(EntryBuilder(specs[which]), paths, step)
            rows = rows.edited([e.uri for e in listed.get(which, ())], fresh)
            listed[which] = made
            want = sorted((e for entries in listed.values() for e in entries), key=lambda e: e.uri)
            assert list(rows) == want and list(rows.uris) == [e.uri for e in want]
            assert [rows.get(e.uri) for e in want] == want and rows[1:-1] == want[1:-1]
            assert len(rows.makers) <= 2 * (len(listed) + 2) + 1  # unused makers do not pile up (24 saves: 25)
            assert rows.count_needing_scopes() == sum(1 for e in want if e.access)
    finally:
        catalog_rows.LOAD, catalog_rows._PRUNE_AFTER = saved, prune


_SIDE = st.tuples(st.sets(st.sampled_from(_PATHS), max_size=6), st.sampled_from([0, 3, 6]), st.sampled_from([1, 2]),
                  st.sampled_from([None, 1_700_000_000.5, 1_700_000_001.0]), st.booleans())


@settings(max_examples=300, deadline=None)
@given(sides=st.tuples(_SIDE, _SIDE), how=st.sampled_from(["same", "kept otherwise", "other"]),
       load=st.sampled_from([1, 3, 1024]))
def test_the_listings_compare_as_the_listed_fields_say(sides: tuple[tuple[set[str], int, int, float | None, bool], ...],
                                                       how: str, load: int) -> None:
    """`rows_change` (columns compared, makers by key) finds no listing change exactly when resources/list would
    show the same of both, row by row: rows kept compact on one side and explicit on the other, makers of equal or other specs,
    sizes, mtimes missing (NaN) or not, blocks cut anyhow."""
    import aggregator.catalog_rows as catalog_rows

    specs = _collections()
    first = sides[0]
    second = {"same": first, "kept otherwise": (*first[:4], not first[4]), "other": sides[1]}[how]
    saved = catalog_rows.LOAD
    catalog_rows.LOAD = load
    try:
        built = [_listing(EntryBuilder(specs[which]), paths, size, mtime, compact)
                 for paths, which, size, mtime, compact in (first, second)]
    finally:
        catalog_rows.LOAD = saved
    (a, _), (b, _) = built
    want = [listed_fields(e) for e in a] == [listed_fields(e) for e in b]
    assert (not rows_change(a, b).listing.listing_changed) == want
    assert (not rows_change(b, a).listing.listing_changed) == want
