"""rows_change: the merge walk over two whole listings finds what comparing them entry by entry, by URI, finds
(whose listings changed, which URIs read elsewhere), whatever rows are compact, explicit, or kept in other blocks
and windows; and a listing that gained one file builds Entries only around it."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator import rows_change as module
from aggregator.catalog_rows import Rows, RowsBuilder
from aggregator.compiler import EntryBuilder
from aggregator.diff import diff_entries
from aggregator.entry import Entry, entries_change
from aggregator.entry_spans import whole
from aggregator.manifest.model import Annotations, CollectionSpec, Display, Location
from aggregator.rows_change import reads, rows_change

PATHS = [f"f{i}.md" for i in range(8)] + ["sp ace.md", "caf\u00e9.md"]
"""Names a compact row holds, and names whose URI needs percent-encoding (explicit rows)."""
SCOPES = [frozenset(), frozenset({"s"}), frozenset({"t"})]
Side = tuple[frozenset[str], bool, dict[str, tuple[int, float | None]], dict[str, tuple[str, frozenset[str]]]]
"""A listing: its collection's access, whether it lists files' mtimes, its files (path: size, mtime), and its
manifest resources (name: text, access)."""


def _spec(access: frozenset[str], mtimes: bool) -> CollectionSpec:
    display = Display(annotations=Annotations(last_modified="file")) if mtimes else Display()
    return CollectionSpec("docs", "**", "a://{path}", "{path}", display, Location("m.yaml", 1, 1), "collections[0]",
                          access=access)


def _rows(side: Side) -> Rows:
    """The rows a compile makes of `side`: compact where the builder can, explicit otherwise, and the resources."""
    access, mtimes, files, resources = side
    builder = EntryBuilder(_spec(access, mtimes))
    rows = RowsBuilder(builder)
    for path, (size, mtime) in files.items():
        if builder.compact_uri(path) is not None:
            rows.compact_row(builder.compact_uri(path) or "", size, mtime)
        elif (entry := builder.file_entry(path, size, mtime)) is not None:
            rows.explicit_row(entry)
    notes = Rows.of(Entry(f"note://{name}", name, Display(), text=text, access=scopes)
                    for name, (text, scopes) in resources.items())
    return Rows.merged([rows.rows(), notes]) if len(notes) else rows.rows()


def _expected(before: Iterable[Entry], after: Iterable[Entry], replaced: frozenset[str]) -> tuple[object, set[str]]:
    """What comparing the two listings entry by entry, by URI, finds."""
    old, new = {e.uri: e for e in before}, {e.uri: e for e in after}
    content = {uri for uri in old.keys() & new.keys() if reads(old[uri]) != reads(new[uri])
               or new[uri].source in replaced}
    return entries_change(old, new), content


@contextmanager
def _window(size: int) -> Iterator[None]:
    """Compare `size` rows a window (small: windows that end inside a block and span blocks)."""
    load, module.LOAD = module.LOAD, size
    try:
        yield
    finally:
        module.LOAD = load


SIDES = st.tuples(st.sampled_from(SCOPES), st.booleans(),
                  st.dictionaries(st.sampled_from(PATHS), st.tuples(st.integers(1, 2), st.sampled_from([None, 1.0]))),
                  st.dictionaries(st.sampled_from("xyz"), st.tuples(st.sampled_from("ab"), st.sampled_from(SCOPES))))


@settings(max_examples=300, deadline=None)
@given(SIDES, SIDES, st.sampled_from([1, 2, 3, 1024]), st.booleans())
def test_the_walk_finds_what_comparing_by_uri_finds(before: Side, after: Side, window: int, replace: bool) -> None:
    old, new = _rows(before), _rows(after)
    replaced = frozenset({"docs"}) if replace else frozenset()
    with _window(window):
        found = rows_change(old, new, replaced)
    assert (found.listing, found.content_changed) == _expected(old, new, replaced)
    assert diff_entries(found.differing) == diff_entries(whole(old, new))  # `aggregator diff` finds it there


def test_listings_of_many_blocks_compare_as_their_entries_do() -> None:
    """Thousands of rows (blocks of 1024, windows across them), a few of them changed in every way at once."""
    rng = random.Random(7)
    files = {f"f{i:05d}.md": (1, 1.0) for i in range(5000)}
    before: Side = (frozenset(), True, files, {"x": ("a", frozenset())})
    for _ in range(20):
        changed = dict(files)
        for path in rng.sample(sorted(files), 5):
            del changed[path]
        for path in rng.sample(sorted(files), 5):
            changed[path] = (2, 1.0) if rng.random() < 0.5 else (1, 2.0)
        changed.update({f"g{rng.randrange(10**6):07d}.md": (1, None) for _ in range(5)})
        after: Side = (rng.choice(SCOPES), rng.random() < 0.5, changed, {"x": ("a", rng.choice(SCOPES))})
        old, new = _rows(before), _rows(after)
        found = rows_change(old, new)
        assert (found.listing, found.content_changed) == _expected(old, new, frozenset())
        assert diff_entries(found.differing) == diff_entries(whole(old, new))


def test_a_listing_that_gained_one_file_builds_entries_only_around_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """O(change) where it counts: 200,000 rows that gained one file are compared a window at a time (C-level column
    comparisons), building Entries only in the window around the new row, not one per row."""
    files = {f"f{i:07d}.md": (1, 1.0) for i in range(0, 400_000, 2)}
    old = _rows((frozenset(), False, files, {}))
    new = _rows((frozenset(), False, {**files, "f0199999.md": (1, 1.0)}, {}))
    built = []
    entry = module._Side.entry
    monkeypatch.setattr(module._Side, "entry", lambda side, block, i: built.append(i) or entry(side, block, i))
    found = rows_change(old, new)
    assert found.listing.shown == {frozenset()} and not found.listing.moved and not found.content_changed
    assert 0 < len(built) <= 2 * module.LOAD, len(built)
    [(before, after)] = found.differing  # the window around it: what `aggregator diff` compares
    assert before.stop - before.start <= module.LOAD and after.stop - after.start <= module.LOAD
    assert diff_entries(found.differing).added == ["a://f0199999.md"]


class _KeyedWithoutAccess(EntryBuilder):
    """A maker whose `listing_key` leaves its access out, as an upstream's records do (it keys what they list)."""

    @property
    def listing_key(self) -> tuple[object, ...]:
        return "records", self.spec.source, self.spec.uri


@pytest.mark.parametrize("window", [2, 1024])
def test_rows_of_makers_keyed_alike_but_seen_by_other_scopes_moved(window: int) -> None:
    """The same files kept by makers of equal listing keys whose access differs (an upstream source moved to another
    scope): every row moved from one scope to the other, though the windows' columns and keys are equal."""
    sides = []
    for access in (frozenset({"s"}), frozenset({"t"})):
        rows = RowsBuilder(builder := _KeyedWithoutAccess(_spec(access, False)))
        for path in PATHS[:8]:
            rows.compact_row(builder.compact_uri(path) or "", 1, None)
        sides.append(rows.rows())
    with _window(window):
        found = rows_change(*sides)
    assert found.listing.moved == {(frozenset({"s"}), frozenset({"t"}))} and not found.listing.shown
    assert (found.listing, found.content_changed) == _expected(*sides, frozenset())


@pytest.mark.parametrize("window", [2, 1024])
def test_rows_listed_alike_from_another_source_change_the_console_detail_alone(window: int) -> None:
    """The same files and resources, read from a source of another id (renamed in the manifest): no listing shows
    anything else, so no MCP client is told; the console, which shows each entry's source, is (`detail`), and only
    for callers who may see those entries. The walk finds what comparing entry by entry finds."""
    from dataclasses import replace

    sides = []
    for source in ("docs", "library"):
        rows = RowsBuilder(builder := EntryBuilder(replace(_spec(frozenset({"s"}), False), source=source)))
        for path in PATHS:
            if builder.compact_uri(path) is not None:
                rows.compact_row(builder.compact_uri(path) or "", 1, None)
            elif (entry := builder.file_entry(path, 1, None)) is not None:
                rows.explicit_row(entry)
        sides.append(rows.rows())
    with _window(window):
        found = rows_change(*sides)
    listing = found.listing
    assert not listing.any and listing.detail == {frozenset({"s"})}
    assert [listing.shown_to(s) for s in (None, frozenset(), frozenset({"s"}), frozenset({"t"}))] == [
        True, False, True, False]
    assert (listing, found.content_changed) == _expected(*sides, frozenset())
