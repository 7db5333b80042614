"""A relist of one big source does not hold up the event loop (issue 26): comparing the whole listing with the
catalog and building the next catalog run off the loop, so reads through the real server are answered while a
relist of tens of thousands of entries is under way, from the catalog served until the swap; and a change swapped in
meanwhile is not lost (the listing is compared again with the catalog it made).

Each test wraps a step of the relist (`Gate`) so that its first call after the test arms it waits until a read is
answered meanwhile: on the event loop no read can be, so the step waits out `WAIT` in vain and says so."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest
from mcp import Client

from aggregator.live import relisted
from aggregator.service import ResourceService
from tests.conftest import write_manifest
from tests.test_live_inprocess import running
from tests.test_upstream_scale import gateway

WAIT = 5.0
"""Seconds a gated step waits for a read answered meanwhile (reads answer in milliseconds when the loop is free)."""
OBJECTS = 50_000
RESOURCES = 20_000


class Gate:
    """Wraps `func`: once armed, its first call waits (in the thread that runs it) until `answered` is set, at most
    `WAIT` seconds, and keeps whether it was (`during`); then, if `hold` is given, until `hold` is set."""

    def __init__(self, func: Callable[..., Any], hold: threading.Event | None = None) -> None:
        self.func = func
        self.hold = hold
        self.armed = False
        self.answered = threading.Event()
        self.during: bool | None = None
        self.calls = 0
        self.waiting = threading.Event()

    def arm(self) -> None:
        self.answered.clear()
        self.armed = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.calls += 1
            if self.during is None:
                self.answered.clear()  # only a read answered from here on counts
                self.waiting.set()
                self.during = self.answered.wait(WAIT)
                if self.hold is not None:
                    self.hold.wait(WAIT * 4)
        return self.func(*args, **kwargs)


async def read_meanwhile(client: Client, uri: str, text: str, gates: list[Gate], stop: anyio.Event) -> int:
    """Read `uri` over and over until `stop`, checking its text and telling `gates` of each answer; how many."""
    count = 0
    while not stop.is_set():
        assert (await client.read_resource(uri)).contents[0].text == text
        count += 1
        for gate in gates:
            gate.answered.set()
    return count


def _store(root: str, objects: int) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe({f"{root}/d{i // 1000:03}/f{i % 1000:03}.md": b"x" for i in range(objects)})


def _drop(root: str) -> None:
    """Take the store's objects away (fsspec's recursive rm is quadratic in them)."""
    fs = fsspec.filesystem("memory")
    for key in [key for key in fs.store if key.startswith(root + "/")]:
        del fs.store[key]
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if d != root and not d.startswith(root + "/")]


def _polled(tmp_path: Path, root: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# a\n")
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: big-poll}}
        sources:
          store: {{url: "memory://{root}", poll: 300ms}}
          docs: {{url: ./docs}}
        collections:
          - {{source: store, glob: "**/*.md", uri: "store://{{path}}"}}
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        """)


async def _listed(service: ResourceService, uri: str) -> None:
    with anyio.fail_after(30):
        while service.catalog.get(uri) is None:
            await anyio.sleep(0.02)


def test_reads_are_answered_while_a_poll_compares_a_big_listing(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root = "/relist-loop-poll"
    _store(root, OBJECTS)
    manifest = _polled(tmp_path, root)
    gate = Gate(relisted.listing_changes)
    monkeypatch.setattr(relisted, "listing_changes", gate)

    async def main() -> None:
        async with running(manifest) as (server, live):
            service: ResourceService = live.service
            assert len(service.catalog) == OBJECTS + 1
            async with Client(server, mode="auto", cache=None) as client:
                stop = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_meanwhile, client, "docs://a.md", "# a\n", [gate], stop)
                    gate.arm()
                    fsspec.filesystem("memory").pipe_file(f"{root}/new.md", b"new")
                    await _listed(service, "store://new.md")
                    stop.set()
                assert gate.during is True  # a read was answered while the listing was compared
                assert (await client.read_resource("store://new.md")).contents[0].text == "new"
                assert len(service.catalog) == OBJECTS + 2
                assert live.file_changes["relist"] == 0

    try:
        anyio.run(main)
    finally:
        _drop(root)


def test_a_change_swapped_in_while_a_poll_compares_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing is compared outside the swap lock: a folder change applied meanwhile swaps in another catalog,
    so the poll compares again with that one and loses neither change."""
    root = "/relist-loop-meanwhile"
    _store(root, 2_000)
    manifest = _polled(tmp_path, root)
    release = threading.Event()
    gate = Gate(relisted.listing_changes, hold=release)
    monkeypatch.setattr(relisted, "listing_changes", gate)

    async def main() -> None:
        async with running(manifest) as (server, live):
            service: ResourceService = live.service
            async with Client(server, mode="auto", cache=None) as client:
                stop = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_meanwhile, client, "docs://a.md", "# a\n", [gate], stop)
                    gate.arm()
                    fsspec.filesystem("memory").pipe_file(f"{root}/new.md", b"new")
                    with anyio.fail_after(30):
                        while not gate.waiting.is_set():
                            await anyio.sleep(0.01)
                    compared = service.catalog
                    (tmp_path / "docs" / "b.md").write_text("# b\n")  # swapped in while the poll compares
                    await _listed(service, "docs://b.md")
                    assert service.catalog is not compared and service.catalog.get("store://new.md") is None
                    release.set()
                    await _listed(service, "store://new.md")
                    stop.set()
                assert gate.during is True
                assert gate.calls == 2  # compared again with the catalog the folder change made
                assert service.catalog.get("docs://b.md") is not None
                assert (await client.read_resource("docs://b.md")).contents[0].text == "# b\n"
                fresh = await ResourceService.open(manifest)
                try:
                    assert list(service.catalog.entries) == list(fresh.catalog.entries)
                finally:
                    await fresh.aclose()

    try:
        anyio.run(main)
    finally:
        release.set()
        _drop(root)


def test_reads_are_answered_while_an_upstream_relist_compares_and_applies(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream of RESOURCES resources says list_changed: comparing its listing and building the next catalog
    both leave the loop free."""
    manifest = gateway(tmp_path, "", UPSTREAM_RESOURCES=str(RESOURCES), UPSTREAM_CHANGES="1")
    compare, apply = Gate(relisted.listing_changes), Gate(relisted.apply_upstream)
    monkeypatch.setattr(relisted, "listing_changes", compare)
    monkeypatch.setattr(relisted, "apply_upstream", apply)

    async def main() -> None:
        async with running(manifest) as (server, live):
            service: ResourceService = live.service
            assert service.catalog.get(f"up+test://res/{RESOURCES - 1}") is not None
            async with Client(server, mode="auto", cache=None) as client:
                stop = anyio.Event()
                docs, text = "docs://a.md", "# A\n"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_meanwhile, client, docs, text, [compare, apply], stop)
                    compare.arm()
                    apply.arm()
                    assert (await client.read_resource("up+test://add/x")).contents[0].text == "added"
                    await _listed(service, "up+test://added/x")
                    stop.set()
                assert compare.during is True and apply.during is True
                assert live.file_changes["relist"] == 0

    anyio.run(main)
