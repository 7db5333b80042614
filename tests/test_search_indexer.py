"""The indexer (search_indexer.py) end to end: the full-text index follows file changes and reloads, keeps
within `server.search.indexBytes`, keeps its file across restarts, and holds text as resources/read serves it."""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.search import Discovery
from aggregator.search_index import FullTextIndex
from aggregator.search_indexer import Indexer
from aggregator.service import ResourceService
from aggregator.watch import Change
from tests.conftest import connect, write_manifest
from tests.test_search import MANIFEST, make_tree, search_tool, until_found


def test_index_follows_file_changes_and_reloads(tmp_path: Path) -> None:
    make_tree(tmp_path)
    finder = write_manifest(tmp_path, MANIFEST)
    docs = tmp_path / "docs"

    async def main() -> None:
        async with connect(finder, "auto") as client:
            await until_found(client, "flux", "docs://install.md")
            (docs / "install.md").write_text("# Installing\n\nNow with a warp drive.\n")
            await until_found(client, "warp", "docs://install.md")
            await until_found(client, "flux", None)
            (docs / "new.md").write_text("a brand new xylophone\n")
            await until_found(client, "xylophone", "docs://new.md")
            (docs / "new.md").unlink()
            await until_found(client, "xylophone", None)
            # A reload that turns indexing off for the collection drops its text (metadata still matches).
            finder.write_text(finder.read_text().replace("index: true,", ""))
            await until_found(client, "warp", None)
            assert [h["uri"] for h in await search_tool(client, "install")] == ["docs://install.md"]

    anyio.run(main)


def test_passes_after_incremental_changes_look_at_what_changed(tmp_path: Path) -> None:
    """After catalogs swapped in by catalog_delta (files and a folder came, changed, went), a pass looks at the URIs
    they changed, not the catalog, and the index ends up holding what a full pass over the final catalog holds; a
    file passed over for the byte budget gets in once bytes are freed."""
    make_tree(tmp_path)
    manifest = write_manifest(tmp_path, MANIFEST.replace("pageSize: 4}", "pageSize: 4, search: {indexBytes: 400}}"))
    docs = tmp_path / "docs"

    async def main() -> None:
        agg = await ResourceService.open(manifest)
        indexer = Indexer(agg, agg.manifest.server.search)
        updates = CatalogUpdates(agg, Notifier())

        async def change(*changes: tuple[Change, str]) -> int:
            await updates.files_changed("docs", set(changes))
            await indexer.index_once()
            return indexer.looked_at

        try:
            await indexer.index_once()
            assert indexer.looked_at == 5 and indexer.not_indexed == 0
            (docs / "new.md").write_text("a zebra\n")
            assert await change((Change.added, "new.md")) == 1
            (docs / "big.md").write_text("yak " * 80)  # 320 bytes: past the budget with the others
            assert await change((Change.added, "big.md")) == 1
            assert indexer.not_indexed == 1
            (docs / "install.md").write_text("# Installing\n\nNow with a warp drive.\n")
            assert await change((Change.modified, "install.md")) == 1  # still no room for big.md: not looked at
            (docs / "guides").rename(tmp_path / "guides")
            assert await change((Change.deleted, "guides")) == 3 + 1  # bytes freed: big.md tried again
            assert indexer.not_indexed == 0
            (tmp_path / "guides").rename(docs / "moved")
            (docs / "new.md").unlink()
            assert await change((Change.added, "moved"), (Change.deleted, "new.md")) == 3 + 1
            assert updates.full_relists == 0
            fresh = Indexer(agg, agg.manifest.server.search)
            await fresh.index_once()
            assert indexer._known == fresh._known and indexer.not_indexed == fresh.not_indexed
            assert "docs://big.md" in indexer._known and "docs://moved/data.json" in indexer._known
        finally:
            await indexer.aclose()
            await agg.aclose()

    anyio.run(main)


def test_index_bytes_budget_and_index_file(tmp_path: Path) -> None:
    make_tree(tmp_path)
    manifest = write_manifest(tmp_path, MANIFEST.replace("pageSize: 4}", "pageSize: 4, search: {indexBytes: 200, "
                                                                         "indexFile: state/index.db}}"))

    async def main() -> tuple[int, int]:
        agg = await ResourceService.open(manifest)
        discovery = Discovery(agg)
        await discovery.index_once()
        index = FullTextIndex(tmp_path / "state" / "index.db")
        docs, size = index.stats()
        index.close()
        await discovery.aclose()
        await agg.aclose()
        return docs, size

    docs, size = anyio.run(main)
    assert size <= 200 and 0 < docs < 5  # the first files in URI order, until 200 bytes
    assert (tmp_path / "state" / "index.db").exists()


def test_index_file_is_kept_across_restarts(tmp_path: Path) -> None:
    """A restart over the index file reads no file whose listed version (mtime, size) is unchanged."""
    make_tree(tmp_path)
    manifest = write_manifest(tmp_path, MANIFEST.replace("pageSize: 4}", "pageSize: 4, search: {indexFile: idx.db}}"))
    install = tmp_path / "docs" / "install.md"

    async def uris(query: str) -> list[str]:
        agg = await ResourceService.open(manifest)
        discovery = Discovery(agg)
        try:
            await discovery.index_once()
            return [h.entry.uri for h in await discovery.search(query, None)]
        finally:
            await discovery.aclose()
            await agg.aclose()

    assert anyio.run(uris, "flux") == ["docs://install.md"]
    stat = install.stat()
    install.write_text(install.read_text().replace("flux", "warp"))  # same size, and the old mtime put back
    os.utime(install, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert anyio.run(uris, "flux") == ["docs://install.md"]  # not read again: the kept text answers
    os.utime(install)  # a new mtime: read again
    assert anyio.run(uris, "flux") == []
    assert anyio.run(uris, "warp") == ["docs://install.md"]


def test_decompressed_files_are_indexed_as_read(tmp_path: Path) -> None:
    import gzip

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "changes.md.gz").write_bytes(gzip.compress(b"# Changes\n\nThe wombat release.\n"))
    (tmp_path / "logs" / "raw.bin").write_bytes(b"\x00\x01wombat\x00")  # untyped and not text: never indexed
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: gz}
        sources:
          logs: {url: ./logs}
        collections:
          - {source: logs, glob: "*", uri: "logs://{path}", decompress: true, index: true}
        """)

    async def main() -> None:
        agg = await ResourceService.open(manifest)
        discovery = Discovery(agg)
        try:
            await discovery.index_once()
            hits = await discovery.search("wombat", None)
            assert [(h.entry.uri, h.snippet) for h in hits] == [("logs://changes.md.gz",
                                                                 "# Changes\n\nThe «wombat» release.\n")]
        finally:
            await discovery.aclose()
            await agg.aclose()

    anyio.run(main)
