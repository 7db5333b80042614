"""heap.py: a catalog built whole (a full relist) is moved out of the collector's full passes once swapped in, when
it is big enough to matter; a small one is left alone. A relist of a big source (a poll) runs with automatic
collection paused and settles the heap once over; automatic collection is on again however it ends."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest

from aggregator import heap
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.sources import SourceError
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


def _polled(tmp_path: Path, root: str, objects: int) -> Path:
    fs = fsspec.filesystem("memory")
    fs.pipe({f"{root}/f{i:03}.md": b"x" for i in range(objects)})
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: heap}}
        sources:
          store: {{url: "memory://{root}", poll: 1h}}
        collections:
          - {{source: store, glob: "**/*.md", uri: "s://{{path}}"}}
        """)


def _drop(root: str) -> None:
    fs = fsspec.filesystem("memory")
    for key in [key for key in fs.store if key.startswith(root + "/")]:
        del fs.store[key]


def _serving(manifest: Path, root: str, body: Callable[[ResourceService], Awaitable[None]]) -> None:
    """Run `body` with the service of `manifest` open, then take the store's objects under `root` away."""

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            await body(service)
        finally:
            await service.aclose()

    try:
        anyio.run(main)
    finally:
        _drop(root)


class _Listing:
    """Wraps a source's `list`: whether automatic collection was on during each listing; `fail` makes it raise,
    `hold` makes it wait for ever (to be cancelled)."""

    def __init__(self, source: Any, fail: bool = False, hold: bool = False) -> None:
        self.list, self.fail, self.hold = source.list, fail, hold
        self.collecting: list[bool] = []
        self.started = anyio.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.collecting.append(gc.isenabled())
        self.started.set()
        if self.fail:
            raise SourceError("listing failed: gone")
        if self.hold:
            await anyio.sleep_forever()
        return await self.list(*args, **kwargs)


@pytest.mark.parametrize("freeze_at", [1, 1_000])
def test_a_big_poll_lists_with_collection_paused_then_settles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             unfrozen: None, freeze_at: int) -> None:
    """A poll of a source that lists `FREEZE_AT` entries or more: no automatic collection while it is listed and
    applied; after it, the next catalog frozen, free memory trimmed and automatic collection on again. A smaller
    one changes nothing of this."""
    monkeypatch.setattr(heap, "FREEZE_AT", freeze_at)
    trims: list[bool] = []
    monkeypatch.setattr(heap, "trim", lambda: trims.append(True) or True)
    root = "/heap-poll"
    manifest = _polled(tmp_path, root, 20)

    async def poll(service: ResourceService) -> None:
        listing = _Listing(service.sources["store"])
        monkeypatch.setattr(service.sources["store"], "list", listing)
        fsspec.filesystem("memory").pipe_file(f"{root}/new.md", b"y")
        delta = await CatalogUpdates(service, Notifier()).source_polled("store")
        assert delta is not None and delta.added == {"s://new.md"}
        big = freeze_at == 1
        assert listing.collecting == [not big]
        assert gc.isenabled()
        assert (gc.get_freeze_count() > 0) == big
        assert bool(trims) == big
        lists = [block[0] for block in service.catalog.entries._blocks]  # noqa: SLF001
        assert _tracked(lists) != big

    _serving(manifest, root, poll)


@pytest.mark.parametrize("how", ["fails", "cancelled"])
def test_collection_is_on_again_after_a_big_poll_that_fails_or_is_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None, how: str) -> None:
    monkeypatch.setattr(heap, "FREEZE_AT", 1)
    root = f"/heap-poll-{how}"
    manifest = _polled(tmp_path, root, 20)

    async def poll(service: ResourceService) -> None:
        listing = _Listing(service.sources["store"], fail=how == "fails", hold=how == "cancelled")
        monkeypatch.setattr(service.sources["store"], "list", listing)
        updates = CatalogUpdates(service, Notifier())
        if how == "fails":
            assert await updates.source_polled("store") is None  # its last listing served
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(updates.source_polled, "store")
                await listing.started.wait()
                assert not gc.isenabled()
                tg.cancel_scope.cancel()
        assert listing.collecting == [False]
        assert gc.isenabled()
        assert len(service.catalog) == 20

    _serving(manifest, root, poll)


def test_overlapping_big_relists_turn_collection_on_once_the_last_is_over(unfrozen: None) -> None:
    async def main() -> None:
        async with heap.relisting(heap.FREEZE_AT):
            async with heap.relisting(heap.FREEZE_AT):
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()

    anyio.run(main)


def test_a_big_relist_leaves_collection_off_if_it_was_off(unfrozen: None) -> None:
    async def main() -> None:
        async with heap.relisting(heap.FREEZE_AT):
            pass

    gc.disable()
    try:
        anyio.run(main)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_big_upstream_relist_lists_with_collection_paused_then_settles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None) -> None:
    """An upstream's list_changed relisted in place (tests/upstream_server.py adds a resource when `add/x` is read):
    as a poll, no automatic collection while its listing is read, the heap settled once it is swapped in."""
    from tests.test_upstream_scale import gateway
    monkeypatch.setattr(heap, "FREEZE_AT", 10)
    manifest = gateway(tmp_path, "", UPSTREAM_RESOURCES="30", UPSTREAM_CHANGES="1")

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            source = service.sources["up"]
            collecting: list[bool] = []
            published = source.published

            async def listed() -> Any:
                collecting.append(gc.isenabled())
                return await published()

            monkeypatch.setattr(source, "published", listed)
            told = anyio.Event()

            async def heard(paths: object) -> None:  # as pushed.py hears it: the next listing asks again
                if paths is None:
                    told.set()

            source.changes(heard)
            await service.read("up+test://add/x")  # the upstream adds `added/x` and says list_changed
            with anyio.fail_after(30):
                await told.wait()
            await CatalogUpdates(service, Notifier()).upstream_listed("up")
            assert service.catalog.get("up+test://added/x") is not None
            assert collecting == [False]
            assert gc.isenabled() and gc.get_freeze_count() > 0
        finally:
            await service.aclose()

    anyio.run(main)
