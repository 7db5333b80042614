"""The source contract for any fsspec protocol, through the in-memory filesystem (memory://)."""

from __future__ import annotations

import uuid

import fsspec
import pytest

from aggregator.sources import Source
from tests.source_contract import OUTSIDE, Opener, SourceContract, open_kind


def memory_source(top: str, files: dict[str, bytes], **settings: object) -> Source:
    """`files` under memory://top/root, `OUTSIDE` beside it (top/outside.txt, top/root_old/outside.txt)."""
    fs = fsspec.filesystem("memory")
    fs.pipe({**{f"/{top}/root/{p}": d for p, d in files.items()}, f"/{top}/outside.txt": OUTSIDE,
             f"/{top}/root_old/outside.txt": OUTSIDE})
    return open_kind(f"memory://{top}/root", **settings)


class TestMemoryContract(SourceContract):
    @pytest.fixture
    def make_source(self) -> Opener:
        self.top = f"contract-{uuid.uuid4().hex[:12]}"
        yield lambda files, **settings: memory_source(self.top, files, **settings)
        fsspec.filesystem("memory").rm(f"/{self.top}", recursive=True)

    def write(self, source: Source, path: str, data: bytes) -> None:
        fsspec.filesystem("memory").pipe(f"/{self.top}/root/{path}", data)

    def remove(self, source: Source, path: str) -> None:
        fsspec.filesystem("memory").rm(f"/{self.top}/root/{path}")
