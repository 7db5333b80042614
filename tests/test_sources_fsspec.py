"""Any fsspec protocol by name, options passed through: the in-memory filesystem stands in for gcs, azure ..."""

from __future__ import annotations

from pathlib import Path

import anyio
import fsspec
import pytest

from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound, ResourceTooLarge
from aggregator.manifest import ManifestError
from tests.conftest import write_manifest


@pytest.fixture
def memfs() -> fsspec.AbstractFileSystem:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pipe({"/team/docs/a.md": b"# A\n", "/team/docs/sub/b.txt": b"bee", "/team/other/secret.md": b"SECRET",
             "/team/docs/big.bin": b"z" * 5000})
    return fs


def test_memory_protocol_lists_reads_and_confines(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: mem}
        sources:
          mem: {url: "memory://team/docs", maxBytes: 4KiB}
        collections:
          - {source: mem, glob: "**/*", uri: "mem://{path}"}
        templates:
          - {uriTemplate: "mem://by-path/{+path}", name: p, source: mem, path: "{path}"}
        """)

    async def main() -> None:
        agg = await ResourceService.open(path)
        assert [e.uri for e in agg.catalog.entries] == ["mem://a.md", "mem://big.bin", "mem://sub/b.txt"]
        assert (await agg.read("mem://sub/b.txt")).content.text == "bee"
        assert (await agg.read("mem://by-path/a.md")).content.text == "# A\n"
        with pytest.raises(ResourceTooLarge):
            await agg.read("mem://big.bin")
        for uri in ["mem://by-path/../other/secret.md", "mem://by-path/..%2Fother%2Fsecret.md", "mem://by-path/x::y"]:
            with pytest.raises(ResourceNotFound):
                await agg.read(uri)

    anyio.run(main)


def test_unknown_protocol_is_a_located_error(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: x}
        sources:
          odd: {url: "nosuchproto://bucket/x"}
        """)
    with pytest.raises(ManifestError) as err:
        anyio.run(ResourceService.open, path)
    issue = err.value.issues[0]
    assert issue.key == "sources.odd.url" and issue.line == 4 and "nosuchproto" in issue.message
