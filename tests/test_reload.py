"""reload.py: the next snapshot keeps unchanged sources (object, epoch and so cached content), replaces changed
ones, says which listed URIs now read elsewhere, and with `guard` refuses what looks like a half-written save.
The settle window and the swap are tested through the supervisor (test_live_manifest.py)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from aggregator.reload import Reloaded, SuspiciousReload, next_snapshot
from aggregator.service import ResourceService
from aggregator.snapshot import Snapshot, close_sources
from tests.conftest import write_manifest


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
