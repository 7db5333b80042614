"""A listing page's items encoded from the catalog's row columns (`listing_json`) are the very text the entries'
`resource_dict`s encode to, keys sorted as the SDK's sieve dumps them: for every kind of row (compact rows of plain
and other collections, explicit rows), any display (descriptions, icons, annotations with the file's time, a
declared type), sizes and times missing or not, pages cut anywhere across blocks; and a plain collection's page
builds no Entry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aggregator.catalog_rows as catalog_rows
from aggregator.catalog_rows import Rows, RowsBuilder
from aggregator.entry import Entry
from aggregator.entry_builder import EntryBuilder
from aggregator.listing_json import items_json
from aggregator.manifest.model import Annotations, CollectionSpec, Display, Icon, Location
from aggregator.mcp_shapes import resource_dict
from aggregator.sources import FileInfo

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode

PATHS = ["a.md", "b.md", "c.txt", "d/e.md", "d/f.png", "g", "h i.md", "caf\u00e9.md", "j.md", "k.tar.gz", "l.md",
         "m/n.json", "o.", "p.MD", "q%41.md", "r.md", "s.md", "t.md", "u.md", "v.bin"]
"""Names of compact rows (mixed types, no extension, a trailing dot) and of explicit ones (a space, non-ASCII,
a percent sign)."""

DISPLAYS = [
    Display(),
    Display(description='The "quoted" <b>100%</b> \u2713 %s 7340033777777777', mime_type="text/x-mine"),
    Display(icons=(Icon("https://example.com/i.png", "image/png", ("48x48",), "dark"),),
            annotations=Annotations(audience=("user",), priority=1, last_modified="file")),
    Display(annotations=Annotations(last_modified="file")),
    Display(annotations=Annotations(priority=0.25, last_modified="2026-01-15T09:00:00Z")),
    Display(description="\x00 and \x01 and %(p)s"),
]
URIS = ["docs://{path}", 'q"\u00fc://x/{path}?v=1%', "docs://{stem}", "docs://{path}"]
NAMES = ["{path}", "{path}", "{stem}", "{name} ({ext})"]


def _spec(display: int, pattern: int, access: frozenset[str] = frozenset()) -> CollectionSpec:
    return CollectionSpec("docs", "**", URIS[pattern], NAMES[pattern], DISPLAYS[display], Location("m.yaml", 3, 3),
                          f"collections[{display}.{pattern}]", access=access)


def _rows(builder: EntryBuilder, files: list[tuple[str, int | None, float | None]]) -> Rows:
    listing = RowsBuilder(builder)
    for path, size, mtime in sorted(files):
        entry = builder.entry(FileInfo(path, size, mtime))
        if entry is None:
            continue
        uri = builder.compact_uri(path)
        if uri is not None:
            listing.compact_row(uri, size, mtime)
        else:
            listing.explicit_row(entry)
    return listing.rows()


def _expected(rows: Rows, start: int, stop: int) -> str:
    return _encode([resource_dict(entry) for entry in rows[start:stop]])


@contextmanager
def _load(load: int) -> Iterator[None]:
    saved = catalog_rows.LOAD
    catalog_rows.LOAD = load
    try:
        yield
    finally:
        catalog_rows.LOAD = saved


_FILES = st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from([None, 0, 2061]),
                            st.sampled_from([None, 1_700_000_000.0, 1_700_000_000.75])),
                  unique_by=lambda f: f[0], min_size=1)


@settings(max_examples=300, deadline=None)
@given(files=_FILES, others=_FILES, display=st.integers(0, len(DISPLAYS) - 1),
       other_display=st.integers(0, len(DISPLAYS) - 1), pattern=st.integers(0, len(URIS) - 1),
       load=st.sampled_from([1, 2, 3, 1024]), page=st.sampled_from([1, 2, 3, 7, 500]),
       explicit=st.sets(st.sampled_from(["docs://a.md0", "docs://d/e.mdx", "docs://zz", "a://first"]), max_size=3))
def test_items_are_what_the_entries_encode_to(files: list[tuple[str, int | None, float | None]],
                                              others: list[tuple[str, int | None, float | None]], display: int,
                                              other_display: int, pattern: int, load: int, page: int,
                                              explicit: set[str]) -> None:
    """Two collections' rows merged with manifest resources (explicit rows between and among them), cut into blocks
    of `load` rows: every page's items, and the whole listing at once, are the entries' encoding."""
    with _load(load):
        first = _rows(EntryBuilder(_spec(display, pattern)), files)
        second = _rows(EntryBuilder(_spec(other_display, 0)), [(f"zz/{p}", s, t) for p, s, t in others])
        resources = Rows.of(Entry(uri, "resource", DISPLAYS[other_display], title="T", mime_type="text/plain",
                                  size=3, mtime=1_700_000_000.0, text="x") for uri in explicit)
        rows = Rows.merged([part for part in (first, second, resources) if len(part)])
    for start in range(0, len(rows), page):
        assert items_json(rows, start, min(start + page, len(rows))) == _expected(rows, start, start + page)
    assert items_json(rows, 0, len(rows)) == _expected(rows, 0, len(rows))
    assert items_json(rows, len(rows), len(rows)) == "[]"


@pytest.mark.parametrize("display", [0, 2, 3, 4])  # 1 and 5 spell a marker: encoded from their entries
def test_a_plain_collections_page_builds_no_entry(display: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact rows of a collection whose names are its paths (any display, types mixed, sizes and times missing
    or not) are encoded from the columns: once a format is made for each kind of row (the first pages), neither the
    maker's entries nor `resource_dict` are asked for."""
    builder = EntryBuilder(_spec(display, 0))
    files = [(f"d{i // 7}/f{i}{'.md' if i % 5 else '.png'}", None if i % 11 == 0 else 2000 + i,
              None if i % 13 == 0 else 1_700_000_000.0 + i) for i in range(300)]
    with _load(64):
        rows = _rows(builder, files)
    pages = range(0, len(rows), 50)
    want = [_expected(rows, start, start + 50) for start in pages]
    assert len(rows.explicit) == 0 and len(rows) == 300
    assert [items_json(rows, start, min(start + 50, len(rows))) for start in pages] == want  # each kind's format made

    def refused(*args: object) -> object:
        raise AssertionError("an Entry was built for a page")

    monkeypatch.setattr(EntryBuilder, "row_entry", refused)
    monkeypatch.setattr(EntryBuilder, "row_entries", refused)
    monkeypatch.setattr("aggregator.listing_json.resource_dict", refused)
    assert [items_json(rows, start, min(start + 50, len(rows))) for start in pages] == want


def test_a_scoped_view_lists_only_what_it_may_see() -> None:
    """A caller's view (`Rows.visible_to`) encodes its own rows: the rows it may not see are not in its pages."""
    with _load(4):
        public = _rows(EntryBuilder(_spec(0, 0)), [(p, 10, 1_700_000_000.0) for p in PATHS])
        secret = _rows(EntryBuilder(_spec(2, 0, frozenset({"s"}))), [(f"s/{p}", 20, None) for p in PATHS[:9]])
        rows = Rows.merged([public, secret])
    for scopes in (frozenset(), frozenset({"s"})):
        view = rows.visible_to(scopes)
        text = items_json(view, 0, len(view))
        assert text == _expected(view, 0, len(view))
        assert ('"s/' in text) == ("s" in scopes)
