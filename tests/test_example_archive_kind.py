"""The example kind of docs/writing-a-source-kind.md (docs/examples/archive_kind.py): a zip archive's files, added
by a real entry point of the group `aggregator.source_kinds` (a dist-info folder on the path, as `pip install`
leaves one) and served over stdio to the official client."""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from aggregator.manifest import ManifestError, load_manifest, parse_manifest
from aggregator.sources import Source, SourceError, SourceNotFound, SourceTooLarge, open_source, register_source_kind
from aggregator.sources.registry import unregister_source_kind
from tests.source_contract import OUTSIDE, Opener, SourceContract, open_kind
from tests.conftest import MODES, list_all, write_manifest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
MANIFEST = """
    version: 1
    server: {name: handbook}
    sources:
      book: {url: 'archive://./handbook.zip', root: handbook-1.2}
    collections:
      - {source: book, glob: "**/*.md", uri: "book://{path}", name: "{stem}"}
    templates:
      - {uriTemplate: "book-file://{+path}", name: file, source: book, path: "{path}"}
    """


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "handbook.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("handbook-1.2/README.md", "# Handbook\n")
        z.writestr("handbook-1.2/guide/intro.md", "Welcome.\n")
        z.writestr("handbook-1.2/guide/big.txt", "x" * 5000)
        z.writestr("handbook-1.2/.draft.md", "not yet")
        z.writestr("handbook-1.2/../escape.md", "outside the root")
        z.writestr("other/notes.md", "not under the root")
    return path


@pytest.fixture
def archive_kind() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    register_source_kind("archive", "archive_kind:ArchiveKind")
    try:
        yield
    finally:
        unregister_source_kind("archive")
        sys.path.remove(str(EXAMPLES))


def installed(site: Path) -> Path:
    """What installing a package declaring `archive = "archive_kind:ArchiveKind"` leaves in site-packages."""
    info = site / "aggregator_archive_example-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aggregator-archive-example\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[aggregator.source_kinds]\narchive = archive_kind:ArchiveKind\n")
    return site


@pytest.mark.parametrize("mode", MODES)
def test_served_over_stdio_through_an_entry_point(tmp_path: Path, archive: Path, mode: str) -> None:
    manifest = write_manifest(tmp_path, MANIFEST)
    site = installed(tmp_path / "site")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", str(manifest)],
        env={"PYTHONPATH": os.pathsep.join(map(str, (ROOT, EXAMPLES, site))), "PATH": os.environ.get("PATH", "")})

    async def main() -> None:
        async with Client(params, mode=mode, cache=None) as client:  # type: ignore[arg-type]
            resources, _ = await list_all(client)
            assert sorted((r.uri, r.name) for r in resources) == [("book://README.md", "README"),
                                                                  ("book://guide/intro.md", "intro")]
            read = await client.read_resource("book://guide/intro.md")
            assert [c.text for c in read.contents] == ["Welcome.\n"]
            templated = await client.read_resource("book-file://README.md")
            assert [c.text for c in templated.contents] == ["# Handbook\n"]

    anyio.run(main)


def test_lists_stats_and_reads_within_its_root(tmp_path: Path, archive: Path, archive_kind: None) -> None:
    spec = load_manifest(write_manifest(tmp_path, MANIFEST)).sources["book"]
    assert (spec.kind, spec.url, spec.settings) == ("archive", str(archive), {"root": "handbook-1.2"})
    source = open_source(spec)

    async def main() -> None:
        assert [f.path for f in await source.list("**")] == ["README.md", "guide/big.txt", "guide/intro.md"]
        assert [f.path for f in await source.list("**", hidden=True)][0] == ".draft.md"
        assert [f.path for f in await source.list("**/*.md", exclude=["guide/**"])] == ["README.md"]
        info = await source.stat("guide/intro.md")
        assert info.size == 9 and info.version and info.mtime
        assert (await source.read("README.md", 100)).data == b"# Handbook\n"
        with pytest.raises(SourceTooLarge):
            await source.read("guide/big.txt", 4096)
        for missing in ("../escape.md", "../other/notes.md", "nope.md"):
            with pytest.raises(SourceNotFound):
                await source.read(missing, 100)
        archive.write_bytes(b"not a zip")
        with pytest.raises(SourceError, match="archive handbook.zip cannot be read"):
            await source.list("**")

    anyio.run(main)


def test_a_manifest_read_from_a_url_may_not_name_an_archive(tmp_path: Path, archive_kind: None) -> None:
    url = "https://example.com/m.yaml"
    with pytest.raises(ManifestError, match="may not declare local folders, files or repositories"):
        parse_manifest("version: 1\nserver: {name: s}\nsources: {b: {url: 'archive:///etc/x.zip'}}\n", url,
                       base=tmp_path, chain=(url,))


def test_the_recipe_shows_the_tested_declaration() -> None:
    recipe = (ROOT / "docs" / "writing-a-source-kind.md").read_text(encoding="utf-8")
    shown = recipe.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class ArchiveKind(SourceKind):" in shown and shown in (EXAMPLES / "archive_kind.py").read_text()


class TestArchiveContract(SourceContract):
    """The example kind passes the source contract: the archive's `root/` is the source, `outside.txt` sits beside
    it in the same archive, and a file changes by rewriting the archive (it is opened per call)."""

    @pytest.fixture
    def make_source(self, tmp_path: Path, archive_kind: None) -> Opener:
        self.zip_path = tmp_path / "contract.zip"
        self.stored: dict[str, bytes] = {}

        def make(files: dict[str, bytes], **settings: object) -> Source:
            self.stored = dict(files)
            self._write_archive()
            return open_kind(f"archive://{self.zip_path}", root="root", **settings)

        return make

    def _write_archive(self) -> None:
        with zipfile.ZipFile(self.zip_path, "w") as z:
            z.writestr("outside.txt", OUTSIDE)
            for path, data in self.stored.items():
                z.writestr(f"root/{path}", data)

    def write(self, source: Source, path: str, data: bytes) -> None:
        self.stored[path] = data
        self._write_archive()

    def remove(self, source: Source, path: str) -> None:
        del self.stored[path]
        self._write_archive()
