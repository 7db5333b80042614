"""heap.py: a catalog built whole (a full relist) is moved out of the collector's full passes once swapped in, when
it is big enough to matter; a small one is left alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator import heap
from aggregator.service import ResourceService
from tests.conftest import write_manifest


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """What a test freezes goes back to the collector after it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _tracked(catalog_lists: list[list[str]]) -> bool:
    """Whether the collector's generations hold any of these lists (frozen ones are in none)."""
    ids = {id(uris) for uris in catalog_lists}
    return any(id(o) in ids for o in gc.get_objects())


@pytest.mark.parametrize("freeze_at", [1, 1_000])
def test_a_full_relist_freezes_a_big_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None,
                                             freeze_at: int) -> None:
    monkeypatch.setattr(heap, "FREEZE_AT", freeze_at)
    (tmp_path / "docs").mkdir()
    for i in range(20):
        (tmp_path / "docs" / f"f{i}.md").write_text("x\n")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: heap}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "*.md", uri: "d://{path}"}
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            (tmp_path / "docs" / "new.md").write_text("y\n")
            assert (await service.refresh_listing()).listing_changed
            lists = [block[0] for block in service.catalog.entries._blocks]  # noqa: SLF001
            big = len(service.catalog) >= freeze_at
            assert (gc.get_freeze_count() > 0) == big
            assert _tracked(lists) != big
        finally:
            await service.aclose()

    anyio.run(main)
