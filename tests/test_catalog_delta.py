"""Incremental relisting (catalog_delta.apply_files) against a fresh walk: over random sequences of files added,
changed and removed in a real folder, the catalog built change by change equals `compile_catalog` over the final
folder (entries, order, lookups, pages, scope views, collections), collisions included."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from aggregator import chunked
from aggregator.rows_change import rows_change
from aggregator.cache_keys import Forget
from aggregator.catalog import Catalog
from aggregator.catalog_delta import (Delta, NeedsRelist, apply_files, changed_files, entries_of_files,
                                      unlisted_files)
from aggregator.entry import listed_fields
from aggregator.compiler import compile_catalog
from aggregator.manifest.model import (Annotations, CollectionSpec, Defaults, Display, Location, Manifest,
                                       ManifestError, ResourceSpec, ServerSettings, SourceSpec)
from aggregator.sources import LocalSource

SCOPES: tuple[frozenset[str] | None, ...] = (None, frozenset(), frozenset({"s"}), frozenset({"s", "t"}))
NAMES = ["a.md", "b.md", "sub/a.md", "sub/deep/c.md", "drafts/d.md", ".hid.md", "sub/.h.md", "x.md", "other/a.md",
         "other/q.md", "n/a.txt", "n/sub/a.txt", "n/b.txt", "s/k.md", "s/.k2.md", "weird\\name.md", "sp ace.md",
         "r.dat", "caf\u00e9.md", "t/one.md"]
"""Paths the changes pick from: collisions with a resource (x.md), across collections (other/a.md vs a.md), within
one (n/a.txt vs n/sub/a.txt), hidden and unservable names, an excluded folder, a resource's own file (r.dat)."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Successors keep entries in chunks of 2 (and merge past one added to a chunk): a handful of files splits,
    merges and empties chunks as a big folder does."""
    monkeypatch.setattr(chunked, "LOAD", 2)
    monkeypatch.setattr(chunked, "_FEW", 1)


def _where(line: int) -> Location:
    return Location("m.yaml", line, 3)


def _collection(i: int, glob: str, uri: str, **kw: object) -> CollectionSpec:
    display = kw.pop("display", Display())
    return CollectionSpec("docs", glob, uri, str(kw.pop("name", "{name}")), display, _where(10 + i),  # type: ignore[arg-type]
                          f"collections[{i}]", **kw)  # type: ignore[arg-type]


def _manifest(root: Path) -> Manifest:
    collections = (
        _collection(0, "**/*.md", "docs://{path}", exclude=("drafts/**", "other/**", "s/**", "t/**"),
                    display=Display(title="{stem}", annotations=Annotations(last_modified="file"))),
        _collection(1, "other/*.md", "docs://{name}"),  # other/a.md is docs://a.md too: a collision
        _collection(2, "n/**/*.txt", "n://{name}"),  # n/a.txt and n/sub/a.txt collide within the collection
        _collection(3, "s/**", "secret://{path}", hidden=True, access=frozenset({"s"})),
        _collection(4, "t/*.md", "t://{stem}", access=frozenset({"t"})),
    )
    resources = (
        ResourceSpec("docs://x.md", "x", Display(), _where(2), "resources[0]", text="fixed"),
        ResourceSpec("res://r", "r", Display(), _where(3), "resources[1]", source="docs", path="r.dat"),
    )
    source = SourceSpec("docs", str(root), "file", _where(1), "sources.docs")
    return Manifest(Path("m.yaml"), ServerSettings("t"), Defaults(), {"docs": source}, resources, collections, ())


def _compile(m: Manifest, src: LocalSource) -> Catalog:
    return anyio.run(compile_catalog, m, {"docs": src})


def _apply(catalog: Catalog, m: Manifest, src: LocalSource, paths: set[str]) -> Delta:
    """What the live path does with paths a watcher named (folders included)."""
    async def run() -> Delta:
        found, gone = await changed_files(catalog, m, "docs", src, paths)
        return apply_files(catalog, m, "docs", found, gone)
    return anyio.run(run)


def _collided(exc: ManifestError) -> set[str]:
    return {m.group(1) for issue in exc.issues if (m := re.search(r"URI '([^']*)'", issue.message))}


def _walk(catalog: Catalog, scopes: frozenset[str] | None, limit: int) -> list[str]:
    uris: list[str] = []
    cursor = None
    while True:
        page = catalog.page(cursor, limit, scopes)
        uris += [e.uri for e in page.items]
        if page.next_cursor is None:
            return uris
        cursor = page.next_cursor


def assert_relist_compares(before: Catalog, want: Catalog) -> None:
    """What a full relist swapping `want` in for `before` decides without comparing per row: whether the listing
    changed (column-wise) as the listed fields say, and the files to forget at least those no longer listed."""
    shown = [listed_fields(e) for e in before.entries] != [listed_fields(e) for e in want.entries]
    assert rows_change(before.entries, want.entries).listing.listing_changed == shown
    # Every file no longer listed, those whose URI is kept but names another file now included (a folder moved out
    # and another of the same name moved in, under a URI pattern without {path}: found by hypothesis in CI, stop 25).
    assert before.targets() >= unlisted_files(before, want) >= before.targets() - want.targets()


def assert_same(got: Catalog, want: Catalog) -> None:
    """Everything a client or the server sees of the two catalogs is equal."""
    assert list(got.entries) == list(want.entries)
    assert list(got._uris) == list(want._uris)
    assert got.listing_signature == want.listing_signature
    assert got.restricted == want.restricted and got.access_count == want.access_count
    for scopes in SCOPES:
        (entries, uris), (wanted, wanted_uris) = got.visible(scopes), want.visible(scopes)
        assert list(entries) == list(wanted) and list(uris) == list(wanted_uris)
        assert _walk(got, scopes, 3) == _walk(want, scopes, 3)
        assert list(got.under("docs://sub/", scopes)) == list(want.under("docs://sub/", scopes))
    for uri in [*want._uris, "docs://nope.md"]:
        assert got.get(uri) == want.get(uri)
    assert got.collections.keys() == want.collections.keys() and got.listed_at.keys() == want.listed_at.keys()
    for key, listed in want.collections.items():
        assert sorted(got.collections[key], key=lambda e: e.uri) == sorted(listed, key=lambda e: e.uri)
        assert got.paths_of(key) == want.paths_of(key)
    assert got.targets() == want.targets()


FOLDERS = ["sub", "sub/deep", "drafts", "other", "n", "n/sub", "s", "t", "new", "new/in"]
"""Folders the moves pick from: under collections' globs, excluded, hidden-only, and new ones."""
MOVED_IN = ["a.md", ".h.md", "deep/c.md", "deep/a.txt", "one.md", "x.md", "a.txt"]
"""What a folder made outside and moved in holds (its names collide as those of the folder it lands in may)."""

def assert_found_by_path(catalog: Catalog, m: Manifest, paths: set[str]) -> None:
    """The entries reading these files, found through the path indexes, are those a scan of the catalog finds."""
    scanned = {e.uri for e in catalog.entries if e.source == "docs" and e.path in paths}
    assert {e.uri for e in entries_of_files(catalog, m, "docs", paths)} == scanned


Step = list[tuple[str, str, int]]
_steps = st.lists(st.lists(st.one_of(
    st.tuples(st.sampled_from(["write", "remove"]), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.sampled_from(["move in", "move out"]), st.sampled_from(FOLDERS), st.integers(0, 3)),
), min_size=1, max_size=4), min_size=1, max_size=8)


def _change(root: Path, step: Step) -> set[str]:
    """Make the step's changes under `root`; the paths a watcher names for them (a moved folder alone)."""
    stash = root.parent / "stash"  # folders moved out, and made, beside the root (one file system: a rename)
    for op, name, size in step:
        path = root / name
        if op == "write":
            if path.parent.is_file():
                continue  # no folder where a file is
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                continue
            path.write_text("x" * size)
            os.utime(path, (1_700_000_000 + size, 1_700_000_000 + size))
        elif op == "remove":
            if path.is_file():
                path.unlink()
        elif op == "move out":
            if path.is_dir():
                stash.mkdir(exist_ok=True)
                path.rename(stash / f"{len(list(stash.iterdir()))}")
        elif not path.exists() and not path.parent.is_file():
            stashed = sorted(stash.iterdir()) if stash.exists() else []
            made = stash / f"made-{size}"
            if size or not stashed:  # a folder made outside, else the last one moved out
                shutil.rmtree(made, ignore_errors=True)
                for inner in MOVED_IN[: 3 + size]:
                    (made / inner).parent.mkdir(parents=True, exist_ok=True)
                    (made / inner).write_text("y" * size)
                stashed = [made]
            path.parent.mkdir(parents=True, exist_ok=True)
            stashed[-1].rename(path)
    return {name for _, name, _ in step}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=st.sets(st.sampled_from(NAMES), max_size=8), steps=_steps)
@example(initial=set(), steps=[[("write", "n/a.txt", 0)], [("move out", "n", 0), ("move in", "n", 1)]])  # CI, stop 25
def test_changes_applied_one_by_one_equal_a_fresh_walk(tmp_path: Path, initial: set[str], steps: list[Step]) -> None:
    root = tmp_path / "f"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(tmp_path / "stash", ignore_errors=True)
    root.mkdir()
    _change(root, [("write", name, 1) for name in initial])
    m = _manifest(root)
    src = LocalSource("docs", str(root))
    try:
        catalog: Catalog | None = _compile(m, src)
    except ManifestError:
        catalog = None  # the supervisor keeps serving the last good catalog and relists on the next change
    for step in steps:
        if catalog is not None:
            for scopes in SCOPES:  # views the successor must carry (or rebuild) correctly
                catalog.visible(scopes)
        before = catalog
        paths = _change(root, step)
        try:
            want: Catalog | None = _compile(m, src)
        except ManifestError as exc:
            want, error = None, exc
        if before is None:  # out of step with the folder: only a full relist catches up
            catalog = want
            event("relisted after a collision")
            continue
        if want is None:
            with pytest.raises(ManifestError) as raised:
                _apply(before, m, src, paths)
            assert _collided(raised.value) == _collided(error)
            event("a collision")
            catalog = None
            continue
        assert_relist_compares(before, want)
        assert_found_by_path(before, m, paths)
        delta = _apply(before, m, src, paths)
        assert_same(delta.catalog, want)
        assert delta.catalog.generation == before.generation + 1
        assert delta.listing_changed == (before.listing_signature != want.listing_signature)
        assert delta.added == set(want._uris) - set(before._uris)
        assert delta.removed == set(before._uris) - set(want._uris)
        assert delta.gone >= before.targets() - want.targets()
        event(f"listing changed: {delta.listing_changed}")
        catalog = delta.catalog


def test_many_files_at_once_take_the_merge_path(tmp_path: Path) -> None:
    """A folder of files moved in (past the per-entry edit threshold) and out again equals a fresh walk."""
    m = _manifest(tmp_path)
    src = LocalSource("docs", str(tmp_path))
    _change(tmp_path, [("write", "a.md", 1), ("write", "t/one.md", 2)])
    catalog = _compile(m, src)
    catalog.visible(frozenset({"t"}))
    moved = {f"sub/m{i:03}.md" for i in range(150)} | {f"t/m{i:03}.md" for i in range(50)}
    _change(tmp_path, [("write", name, 2) for name in moved])
    delta = _apply(catalog, m, src, moved)
    assert_same(delta.catalog, _compile(m, src))
    assert len(delta.added) == 200 and delta.listing_changed
    _change(tmp_path, [("remove", name, 0) for name in moved])
    back = _apply(delta.catalog, m, src, moved)
    assert_same(back.catalog, _compile(m, src))
    assert back.removed == delta.added and back.gone == {("docs", p) for p in moved}


def test_a_change_that_shows_nothing_new_keeps_the_listing(tmp_path: Path) -> None:
    """Touching a file whose listed fields do not show its mtime changes the entry, not the listing."""
    m = _manifest(tmp_path)
    src = LocalSource("docs", str(tmp_path))
    _change(tmp_path, [("write", "t/one.md", 2)])
    catalog = _compile(m, src)
    signature = catalog.listing_signature
    os.utime(tmp_path / "t/one.md", (1_800_000_000, 1_800_000_000))
    delta = _apply(catalog, m, src, {"t/one.md"})
    assert delta.updated == {"t://one"} and not delta.listing_changed and not delta.added and not delta.removed
    assert delta.catalog.listing_signature is signature  # carried, not computed again
    assert_same(delta.catalog, _compile(m, src))


def test_a_collection_never_listed_needs_a_relist(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    catalog = _compile(m, LocalSource("docs", str(tmp_path)))
    catalog.listed_at.clear()  # as for an optional source that could not be listed
    with pytest.raises(NeedsRelist):
        apply_files(catalog, m, "docs", [], {"a.md"})


def test_a_uri_kept_for_another_file_names_the_old_file(tmp_path: Path) -> None:
    """Compact rows of two collections whose URIs coincide (`f://{path}` over two folders, `f://sub/{path}` over
    a third): a URI kept that another collection's file took over names the file it named before."""
    roots = {sid: tmp_path / sid for sid in ("x", "y", "z")}
    for root in roots.values():
        root.mkdir()
    (roots["x"] / "a.md").write_text("x")
    (roots["x"] / "sub").mkdir()
    (roots["x"] / "sub" / "b.md").write_text("x")
    sources = {sid: SourceSpec(sid, str(root), "file", _where(i), f"sources.{sid}")
               for i, (sid, root) in enumerate(roots.items())}
    collections = (_collection(0, "**/*.md", "f://{path}"), _collection(1, "**/*.md", "f://{path}"),
                   _collection(2, "**/*.md", "f://sub/{path}"))
    collections = tuple(replace(c, source=sid) for c, sid in zip(collections, roots, strict=True))
    m = Manifest(Path("m.yaml"), ServerSettings("t"), Defaults(), sources, (), collections, ())
    opened = {sid: LocalSource(sid, str(root)) for sid, root in roots.items()}
    before = anyio.run(compile_catalog, m, opened)
    (roots["x"] / "a.md").unlink()
    (roots["x"] / "sub" / "b.md").unlink()
    (roots["y"] / "a.md").write_text("y")
    (roots["z"] / "b.md").write_text("z")
    after = anyio.run(compile_catalog, m, opened)
    assert after.get("f://a.md").source == "y" and after.get("f://sub/b.md").source == "z"  # type: ignore[union-attr]
    assert unlisted_files(before, after) == {("x", "a.md"), ("x", "sub/b.md")} == before.targets() - after.targets()


def test_a_full_relist_forgets_the_file_a_kept_uri_named(tmp_path: Path) -> None:
    """`n://{name}`: n/a.txt moved away and n/sub/a.txt made, so n://a.txt names another file; the relisting forgets
    the cached body of the file it named (no URI reads it any more)."""
    from aggregator.service import ResourceService

    root = tmp_path / "f"
    (root / "n" / "sub").mkdir(parents=True)
    (root / "n" / "a.txt").write_text("old")
    m = _manifest(root)
    service = ResourceService(m, {"docs": LocalSource("docs", str(root))}, _compile(m, LocalSource("docs", str(root))))

    async def main() -> None:
        assert (await service.read("n://a.txt")).content.text == "old"
        assert service.cache.invalidate_where(Forget.of(files={("docs", "n/a.txt")})) == 1  # it was cached ...
        assert (await service.read("n://a.txt")).content.text == "old"  # ... and is again
        (root / "n" / "a.txt").rename(tmp_path / "away.txt")
        (root / "n" / "sub" / "a.txt").write_text("new")
        assert not (await service.refresh_listing()).any  # same URI, same size: the listing shows nothing new
        assert service.cache.invalidate_where(Forget.of(files={("docs", "n/a.txt")})) == 0
        assert (await service.read("n://a.txt")).content.text == "new"

    anyio.run(main)
