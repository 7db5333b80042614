"""A relist of one big source does not hold up the event loop (issue 26): comparing the whole listing with the
catalog and building the next catalog run off the loop, so reads through the real server are answered while a
relist of tens of thousands of entries is under way, from the catalog served until the swap; and a change swapped in
meanwhile is not lost (the listing is compared again with the catalog it made).

Each test wraps a step of the relist (`Gate`) so that its first call after the test arms it waits until a read is
answered meanwhile: on the event loop no read can be, so the step waits out `WAIT` in vain and says so."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
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
        self.calls: list[Any] = []
        """The first argument of each call since armed (the catalog a comparison is made with)."""
        self.waiting = threading.Event()

    def arm(self) -> None:
        self.answered.clear()
        self.armed = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.calls.append(args[0] if args else None)
            if self.during is None:
                self.answered.clear()  # only a read answered from here on counts
                self.waiting.set()
                self.during = self.answered.wait(WAIT)
                if self.hold is not None:
                    self.hold.wait(WAIT * 4)
        return self.func(*args, **kwargs)


@asynccontextmanager
async def reading(manifest: Path, text: str, gates: list[Gate]) -> AsyncIterator[tuple[Any, Client]]:
    """The server of `manifest` in process (with its Supervisor) and a client of it that reads `docs://a.md` (its
    `text`) over and over meanwhile, telling `gates` of each answer; the gates are armed."""
    async with running(manifest) as (server, live):
        async with Client(server, mode="auto", cache=None) as client:
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_meanwhile, client, "docs://a.md", text, gates, stop)
                for gate in gates:
                    gate.arm()
                try:
                    yield live, client
                finally:
                    stop.set()


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
        async with reading(manifest, "# a\n", [gate]) as (live, client):
            service: ResourceService = live.service
            assert service.catalog.get("store://d049/f999.md") is not None
            fsspec.filesystem("memory").pipe_file(f"{root}/new.md", b"new")
            await _listed(service, "store://new.md")
            assert (await client.read_resource("store://new.md")).contents[0].text == "new"
        assert gate.during is True  # a read was answered while the listing was compared
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
        async with reading(manifest, "# a\n", [gate]) as (live, client):
            service: ResourceService = live.service
            fsspec.filesystem("memory").pipe_file(f"{root}/new.md", b"new")
            with anyio.fail_after(30):
                while not gate.waiting.is_set():
                    await anyio.sleep(0.01)
            (tmp_path / "docs" / "b.md").write_text("# b\n")  # swapped in while the poll compares
            await _listed(service, "docs://b.md")
            assert service.catalog is not gate.calls[0]
            release.set()
            await _listed(service, "store://new.md")
            assert (await client.read_resource("docs://b.md")).contents[0].text == "# b\n"
        assert gate.during is True
        assert len(gate.calls) >= 2 and gate.calls[1] is not gate.calls[0]  # compared again with the new catalog
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


@pytest.mark.parametrize("steps", [
    pytest.param([("aggregator.live.relisted", "listing_changes"), ("aggregator.live.relisted", "apply_upstream")],
                 id="compared-and-applied"),
    pytest.param([("aggregator.sources.mcp", "Packed"), ("aggregator.upstream.pages", "resource_page")],
                 id="page-checked-and-packed"),
])
def test_reads_are_answered_while_an_upstream_is_relisted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          steps: list[tuple[str, str]]) -> None:
    """An upstream of RESOURCES resources in one page says list_changed: its page is checked and recorded, the
    records packed into columns, the listing compared and the next catalog built, each off the loop (`steps`)."""
    import importlib

    manifest = gateway(tmp_path, "", UPSTREAM_RESOURCES=str(RESOURCES), UPSTREAM_CHANGES="1")
    gates = []
    for module, name in steps:
        owner = importlib.import_module(module)
        gates.append(Gate(getattr(owner, name)))
        monkeypatch.setattr(owner, name, gates[-1])

    async def main() -> None:
        async with reading(manifest, "# A\n", gates) as (live, client):
            assert live.service.catalog.get(f"up+test://res/{RESOURCES - 1}") is not None
            assert (await client.read_resource("up+test://add/x")).contents[0].text == "added"
            await _listed(live.service, "up+test://added/x")
        assert [gate.during for gate in gates] == [True] * len(gates)  # a read answered during each
        assert live.file_changes["relist"] == 0

    anyio.run(main)
