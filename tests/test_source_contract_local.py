"""The source contract for local folders: files in a temporary folder, a secret beside it and links out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aggregator.sources import Source
from tests.source_contract import OUTSIDE, Opener, SourceContract, open_kind


def local_source(root: Path, files: dict[str, bytes], scheme: str = "", **settings: object) -> Source:
    """`files` written under `root`, `OUTSIDE` beside it (and in a sibling folder), links leading out of it."""
    for path, data in files.items():
        full = root.joinpath(*path.split("/"))
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
    (root.parent / "outside.txt").write_bytes(OUTSIDE)
    (root.parent / f"{root.name}_old").mkdir(exist_ok=True)
    (root.parent / f"{root.name}_old" / "outside.txt").write_bytes(OUTSIDE)
    os.symlink(root.parent / "outside.txt", root / "link-out.txt")
    os.symlink(root.parent / f"{root.name}_old", root / "folder-out")
    return open_kind(f"{scheme}{root}", **settings)


class TestLocalContract(SourceContract):
    scheme = ""
    """How the folder is written in the manifest: a bare path here."""

    @pytest.fixture
    def make_source(self, tmp_path: Path) -> Opener:
        def open(files: dict[str, bytes], **settings: object) -> Source:
            root = tmp_path / "root"
            root.mkdir()
            return local_source(root, files, self.scheme, **settings)

        return open

    def write(self, source: Source, path: str, data: bytes) -> None:
        Path(source.root, *path.split("/")).write_bytes(data)  # type: ignore[attr-defined]

    def remove(self, source: Source, path: str) -> None:
        Path(source.root, *path.split("/")).unlink()  # type: ignore[attr-defined]

    def test_links_out_of_the_root_are_neither_listed_nor_read(self, make_source: Opener) -> None:
        async def body(source: Source) -> None:
            listed = [f.path for f in await source.list("**", hidden=True)]
            assert not any(p.startswith(("link-out", "folder-out")) for p in listed)
            for path in ("link-out.txt", "folder-out/outside.txt"):
                await self.refuses(source, path)

        self.run(make_source, body)

    async def refuses(self, source: Source, path: str) -> None:
        from aggregator.sources import SourceNotFound

        for call in (source.stat, lambda p: source.read(p, 1 << 20)):
            with pytest.raises(SourceNotFound):
                await call(path)


class TestFileUrlContract(TestLocalContract):
    scheme = "file://"


class TestLocalUrlContract(TestLocalContract):
    """fsspec's other name for the local filesystem: the same folder source, confined the same way."""

    scheme = "local://"
