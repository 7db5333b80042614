"""reload.py: the next snapshot keeps unchanged sources (object, epoch and so cached content), replaces changed
ones, says which listed URIs now read elsewhere, and with `guard` refuses what looks like a half-written save.
The settle window and the swap are tested through the supervisor (test_live_manifest.py)."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import anyio
import pytest

from aggregator import catalog_rows
from aggregator.catalog import Catalog
from aggregator.diff import diff_catalogs, diff_change
from aggregator.manifest.model import ManifestError
from aggregator.reload import Reloaded, SuspiciousReload, _serving, next_snapshot
from aggregator.service import ResourceService
from aggregator.snapshot import Snapshot, close_sources
from aggregator.sources.progress import LISTINGS
from tests.conftest import write_manifest
from tests.http_server import serve


def _manifest(tmp_path: Path, b_url: str = "./b", b_glob: str = "*.md") -> Path:
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: reloads}}
        sources:
          a: {{url: ./a}}
          b: {{url: {b_url}}}
        collections:
          - {{source: a, glob: "*.md", uri: "a://{{path}}"}}
          - {{source: b, glob: "{b_glob}", uri: "b://{{path}}"}}
        """)


@pytest.fixture
def folders(tmp_path: Path) -> Path:
    for name in ("a", "b", "b2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.md").write_text(f"{name}\n")
    return tmp_path


async def _next(service: ResourceService, guard: bool = False) -> Reloaded:
    return await next_snapshot(service.snapshot, (), guard)


async def _close_fresh(old: Snapshot, new: Snapshot) -> None:
    await close_sources(src for src in new.sources.values() if src not in old.sources.values())


def test_unchanged_sources_are_kept_and_changed_ones_replaced(folders: Path) -> None:
    async def main() -> None:
        service = await ResourceService.open(_manifest(folders))
        old = service.snapshot
        _manifest(folders, b_url="./b2")
        reloaded = await _next(service)
        new = reloaded.snapshot
        try:
            assert new.sources["a"] is old.sources["a"] and new.epochs["a"] == old.epochs["a"]
            assert new.sources["b"] is not old.sources["b"] and new.epochs["b"] == new.generation == old.generation + 1
            assert reloaded.replaced == {"b"}
            assert reloaded.content_changed == {"b://x.md"}
            assert service.snapshot is old  # nothing is swapped here
        finally:
            await _close_fresh(old, new)
            await service.aclose()

    anyio.run(main)


def test_a_guarded_reload_refuses_to_empty_a_declared_source(folders: Path) -> None:
    async def main() -> None:
        service = await ResourceService.open(_manifest(folders))
        old = service.snapshot
        _manifest(folders, b_glob="*.txt")
        try:
            with pytest.raises(SuspiciousReload) as held:
                await _next(service, guard=True)
            assert held.value.sources == ("b",)
            reloaded = await _next(service)  # unguarded: a deliberate edit goes through
            assert reloaded.replaced == set() and len(reloaded.snapshot.catalog) == 1
        finally:
            await service.aclose()

    anyio.run(main)


def _listed(catalog: Catalog) -> tuple[object, ...]:
    """Everything a catalog serves and a reload builds on: entries, templates, collections and which were listed."""
    return (list(catalog.entries), [(t.uri_template, t.spec) for t in catalog.templates],
            {key: sorted(entries, key=lambda e: e.uri) for key, entries in catalog.collections.items()},
            set(catalog.listed_at), {sid: p for sid, p in catalog.published.items()})


async def _fresh(manifest: Path) -> tuple[object, ...]:
    """What a fresh load of `manifest` serves (see _listed)."""
    service = await ResourceService.open(manifest)
    try:
        return _listed(service.catalog)
    finally:
        await service.aclose()


def test_a_save_lists_again_only_the_source_whose_settings_changed(folders: Path) -> None:
    """Folder walks and HTTP requests are counted where they happen (the folder's walks, the server's log): a save
    that moves source b lists b alone, the unchanged folder a and the HTTP resource are not asked again, and the
    collections of a keep their entries as they are."""
    with serve() as upstream:
        text = f"""
            version: 1
            server: {{name: reloads}}
            sources:
              a: {{url: ./a}}
              b: {{url: %s}}
              api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true}}
            collections:
              - {{source: a, glob: "*.md", uri: "a://{{path}}"}}
              - {{source: b, glob: "*.md", uri: "b://{{path}}"}}
            resources:
              - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
            """

        async def main() -> None:
            manifest = write_manifest(folders, text % "./b")
            service = await ResourceService.open(manifest)
            try:
                before, hits = service.catalog, sum(upstream.hits.values())
                walks = {sid: LISTINGS[sid] for sid in ("a", "b")}
                write_manifest(folders, text % "./b2")
                changed = (await service.reload(watched={"a", "b"})).listing
                assert changed.listing_changed  # b://x.md now reads b2/x.md, whose size differs
                assert {sid: LISTINGS[sid] - n for sid, n in walks.items()} == {"a": 0, "b": 1}
                assert sum(upstream.hits.values()) == hits  # the HTTP resource was not asked again
                a_md = next(k for k in before.collections if k.source == "a")
                assert service.catalog.collections[a_md] is before.collections[a_md]
                assert _listed(service.catalog) == await _fresh(manifest)
            finally:
                await service.aclose()

        anyio.run(main)


def test_a_changed_glob_lists_that_collection_alone(folders: Path) -> None:
    (folders / "a" / "y.txt").write_text("y\n")
    (folders / "a" / "z.json").write_text("{}\n")
    text = """
        version: 1
        server: {name: reloads}
        sources:
          a: {url: ./a}
        collections:
          - {source: a, glob: "*.md", uri: "md://{path}"}
          - {source: a, glob: "%s", uri: "other://{path}"}
        """

    async def main() -> None:
        manifest = write_manifest(folders, text % "*.txt")
        service = await ResourceService.open(manifest)
        try:
            before, walks = service.catalog, LISTINGS["a"]
            write_manifest(folders, text % "*.json")
            assert (await service.reload(watched={"a"})).listing.listing_changed
            assert LISTINGS["a"] - walks == 1
            md = next(k for k in before.collections if k.glob == "*.md")
            assert service.catalog.collections[md] is before.collections[md]
            assert [e.uri for e in service.catalog.entries] == ["md://x.md", "other://z.json"]
            assert _listed(service.catalog) == await _fresh(manifest)
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_save_copies_only_the_blocks_of_rows_it_changed(folders: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows kept in blocks of 4: a save adding one resource, then one changing one collection's glob, leave every
    block of rows they do not reach as the catalog before held it (the same lists: a save costs what changed, not
    the catalog), and each catalog equals a fresh load."""
    monkeypatch.setattr(catalog_rows, "LOAD", 4)
    for i in range(60):
        (folders / "a" / f"f{i:02}.md").write_text("a\n")
    for i in range(20):
        (folders / "b" / f"g{i:02}.txt").write_text("b\n")
    text = """
        version: 1
        server: {name: reloads}
        sources:
          a: {url: ./a}
          b: {url: ./b}
        collections:
          - {source: a, glob: "*.md", uri: "a://{path}"}
          - {source: b, glob: "%s", uri: "b://{path}"}
        resources: %s
        """

    def blocks(catalog: Catalog) -> dict[int, list[str]]:
        return {id(block[0]): block[0] for block in catalog.entries._blocks}  # noqa: SLF001

    async def main() -> None:
        manifest = write_manifest(folders, text % ("*.md", "[]"))
        service = await ResourceService.open(manifest)
        try:
            before = blocks(service.catalog)
            assert len(before) >= 15
            write_manifest(folders, text % ("*.md", '[{uri: "note://one", name: one, text: "one"}]'))
            assert (await service.reload(watched={"a", "b"})).listing.listing_changed
            after = blocks(service.catalog)
            assert len(after.keys() - before.keys()) == 1  # the last block, which note://one went into
            assert _listed(service.catalog) == await _fresh(manifest)
            write_manifest(folders, text % ("*.txt", '[{uri: "note://one", name: one, text: "one"}]'))
            assert (await service.reload(watched={"a", "b"})).listing.listing_changed
            again = blocks(service.catalog)
            assert all(key in after for key, uris in again.items() if uris[-1].startswith("a://"))
            assert _listed(service.catalog) == await _fresh(manifest)
        finally:
            await service.aclose()

    anyio.run(main)


_PARTS = {
    "b_url": ["./b", "./b2"],
    "collections": [
        '  - {source: a, glob: "*.md", uri: "a://{path}"}\n',
        '  - {source: a, glob: "**/*", uri: "all://{path}", access: {scopes: [staff]}}\n',
        '  - {source: b, glob: "*.md", uri: "b://{path}", name: "{stem}"}\n',
        '  - {source: b, glob: "*.md", uri: "a://{path}"}\n',  # collides with the first when both are there
        '  - {source: c, glob: "*.md", uri: "c://{path}"}\n',
    ],
    "resources": [
        '  - {uri: "note://one", name: one, text: "one"}\n',
        '  - {uri: "file://x", name: x, source: a, path: x.md}\n',
        '  - {uri: "file://y", name: y, source: b, path: x.md, access: {scopes: [staff]}}\n',
        '  - {uri: "a://x.md", name: clash, text: "clash"}\n',  # collides with the a collection
    ],
    "templates": [
        '  - {uriTemplate: "raw://{+path}", name: raw, source: a, path: "{path}"}\n',
        '  - {uriTemplate: "b-raw://{+path}", name: b-raw, source: b, path: "{path}"}\n',
    ],
    "c_url": ["./missing", "./a"],
}


def _random_manifest(folders: Path, rng: random.Random) -> Path:
    def some(key: str) -> str:
        return "".join(part for part in _PARTS[key] if rng.random() < 0.5)

    return write_manifest(folders, (
        "version: 1\nserver: {name: random-saves}\nsources:\n  a: {url: ./a}\n"
        f"  b: {{url: {rng.choice(_PARTS['b_url'])}}}\n  c: {{url: {rng.choice(_PARTS['c_url'])}, optional: true}}\n"
        f"collections:\n{some('collections') or '  []'}\nresources:\n{some('resources') or '  []'}\n"
        f"templates:\n{some('templates') or '  []'}\n").replace(":\n  []\n", ": []\n"))


@pytest.mark.parametrize("seed", range(4))
def test_a_sequence_of_random_saves_serves_what_a_fresh_load_serves(folders: Path, seed: int) -> None:
    """After each save the reloaded catalog equals a fresh load of the same manifest (and the sources the guard
    counts as serving are those of its entries), and a save a fresh load refuses (a URI collision) is refused with
    the same located issues while the last good catalog serves on."""
    (folders / "a" / "sub").mkdir()
    (folders / "a" / "sub" / "deep.md").write_text("deep\n")
    (folders / "b2" / "y.md").write_text("y\n")
    rng = random.Random(seed)

    async def main() -> None:
        manifest = write_manifest(folders, _manifest(folders).read_text())
        service = await ResourceService.open(manifest)
        try:
            for _ in range(12):
                manifest = _random_manifest(folders, rng)
                try:
                    expected: object = await _fresh(manifest)
                except ManifestError as exc:
                    expected = str(exc)
                serving = service.catalog
                try:
                    reloaded = await service.reload(watched=rng.choice([(), ("a", "b")]))
                    got: object = _listed(service.catalog)
                    # What the console's history finds where the reload says entries may differ is what comparing
                    # the two catalogs whole finds.
                    assert diff_change(serving, service.catalog, reloaded.differing) == diff_catalogs(
                        serving, service.catalog)
                    # What the guard asks of the producers (O(collections + resources)) is what the entries say.
                    assert _serving(service.catalog, service.manifest) == {
                        e.source for e in service.catalog.entries if e.source is not None}
                except ManifestError as exc:
                    got = str(exc)
                    assert service.catalog is serving
                assert got == expected, manifest.read_text()
        finally:
            await service.aclose()

    anyio.run(main)


def test_an_unchanged_upstream_keeps_its_published_list_across_a_save(tmp_path: Path) -> None:
    """An MCP upstream (it publishes its own resources and tells of its changes) that a save leaves alone is not
    asked for its list again: its entries and templates stay as they are, and the listing equals a fresh load."""
    from tests.test_mcp_kind import ENV, UPSTREAM

    text = f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, env: {ENV!r}}}
        resources:
          - {{uri: "note://%s", name: note, text: note}}
        """

    async def main() -> None:
        manifest = write_manifest(tmp_path, text % "one")
        service = await ResourceService.open(manifest)
        try:
            before = service.catalog
            write_manifest(tmp_path, text % "two")
            assert (await service.reload()).listing.listing_changed
            assert service.catalog.published["up"] is before.published["up"]
            assert _listed(service.catalog) == await _fresh(manifest)
        finally:
            await service.aclose()

    anyio.run(main)


def _scoped_manifest(folders: Path, b_scope: str, extra: str = "") -> Path:
    return write_manifest(folders, textwrap.dedent(f"""
        version: 1
        server: {{name: reloads}}
        sources:
          a: {{url: ./a}}
          b: {{url: ./b, access: {{scopes: [{b_scope}]}}}}
        collections:
          - {{source: a, glob: "*.md", uri: "a://{{path}}"}}
          - {{source: b, glob: "*.md", uri: "b://{{path}}"}}
        templates:
          - {{uriTemplate: "b://by-name/{{name}}", name: b-by-name, source: b, path: "{{name}}.md"}}
        """) + extra)


@pytest.mark.parametrize("whole", [False, True], ids=["built on the last catalog", "compiled whole"])
def test_a_save_that_changes_only_access_tells_whose_listing_it_changed(folders: Path, whole: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving source b (its collection and template) from scope t to scope s lists the same to a caller who sees
    everything, or holds both scopes or neither: only holders of one of them list something else now. An entry
    only holders of s may see is news to them alone (and to a caller who sees everything), on either path."""
    if whole:  # the path a reload takes when the catalog cannot be built on the last one
        async def whole_compile(*args: object) -> None:
            return None

        monkeypatch.setattr("aggregator.reload.recompile", whole_compile)

    async def main() -> None:
        service = await ResourceService.open(_scoped_manifest(folders, "t"))
        try:
            _scoped_manifest(folders, "s")
            listing = (await service.reload()).listing
            seen = {scopes: listing.seen_by(None if scopes is None else frozenset(scopes))
                    for scopes in (None, (), ("s",), ("t",), ("s", "t"))}
            assert seen == {None: False, (): False, ("s",): True, ("t",): True, ("s", "t"): False}
            _scoped_manifest(folders, "s", 'resources:\n  - {uri: "note://s", name: s, text: s, '
                                           'access: {scopes: [s]}}\n')
            listing = (await service.reload()).listing
            assert [listing.seen_by(s) for s in (None, frozenset(), frozenset({"t"}), frozenset({"s"}))] == [
                True, False, False, True]
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_full_relist_says_whose_listing_it_changed(folders: Path) -> None:
    """A file of source b (scope t) that comes is news to a caller who sees everything (stdio) and to holders of t
    alone; a relist that finds nothing new is news to no one."""
    async def main() -> None:
        service = await ResourceService.open(_scoped_manifest(folders, "t"))
        try:
            (folders / "b" / "new.md").write_text("new\n")
            listing = await service.refresh_listing()
            assert [listing.seen_by(s) for s in (None, frozenset(), frozenset({"s"}), frozenset({"t"}))] == [
                True, False, False, True]
            assert "b://new.md" in {e.uri for e in service.catalog.entries}
            assert not (await service.refresh_listing()).any
        finally:
            await service.aclose()

    anyio.run(main)
