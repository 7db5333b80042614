"""Hot reload and subscriptions end to end: the official client over stdio on both wires."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from tests.conftest import server_params, write_manifest
from tests.served import serve_http, wait_until, wait_watched, watchers_up

QUIET = 0.8  # seconds to wait for a notification that must not come
SOON = 5.0   # seconds a notification that must come may take

BASE = """
version: 1
server: {name: live}
sources:
  docs: {url: ./docs}
collections:
  - {source: docs, glob: "*.md", uri: "docs://{path}"}
"""


def live_folder(folder: Path, manifest: str = BASE) -> Path:
    """`folder` with docs/a.md, docs/b.md and manifest.yaml holding `manifest` (a folder source `docs` in it)."""
    docs = folder / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    (docs / "b.md").write_text("# B\n")
    write_manifest(folder, manifest)
    return folder


@pytest.fixture
def live_dir(tmp_path: Path) -> Path:
    return live_folder(tmp_path)


def save(path: Path, text: str) -> None:
    """Save as editors do: write a temporary file, then rename it over the original."""
    tmp = path.with_suffix(".tmp~")
    tmp.write_text(text)
    os.replace(tmp, path)


class Inbox:
    """Notifications a legacy client received, by kind."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        kind = type(message).__name__
        if kind == "ResourceListChangedNotification":
            self.events.append(("list_changed", None))
        elif kind == "ResourceUpdatedNotification":
            self.events.append(("updated", str(message.params.uri)))
        else:
            return
        self.arrived.set()

    async def next(self, timeout: float = SOON) -> tuple[str, str | None] | None:
        with anyio.move_on_after(timeout):
            while not self.events:
                self.arrived = anyio.Event()
                await self.arrived.wait()
            return self.events.pop(0)
        return None


async def uris(client: Client) -> list[str]:
    return [r.uri for r in (await client.list_resources()).resources]


def test_legacy_reload_broken_save_subscribe_delete_unsubscribe(live_dir: Path) -> None:
    manifest = live_dir / "manifest.yaml"
    inbox = Inbox()

    async def main() -> None:
        async with Client(server_params(manifest), mode="legacy", cache=None, message_handler=inbox) as client:
            assert await uris(client) == ["docs://a.md", "docs://b.md"]

            save(manifest, BASE + 'resources:\n  - {uri: "note://n", name: n, text: hello}\n')
            assert await inbox.next() == ("list_changed", None)
            assert await inbox.next(QUIET) is None  # exactly one
            assert "note://n" in await uris(client)

            save(manifest, BASE + "resources: [ {uri: broken\n")  # invalid YAML: keep serving, send nothing
            assert await inbox.next(QUIET) is None
            assert "note://n" in await uris(client)
            save(manifest, BASE.replace("name: live", "name: live") + "# only a comment changed\n" +
                 'resources:\n  - {uri: "note://n", name: n, text: hello}\n')
            assert await inbox.next(QUIET) is None  # same listing: nothing to tell

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource("docs://a.md")
                (live_dir / "docs" / "a.md").write_text("# A, edited\n")
                assert await inbox.next() == ("updated", "docs://a.md")
                assert (await client.read_resource("docs://a.md")).contents[0].text == "# A, edited\n"

                (live_dir / "docs" / "b.md").unlink()
                assert await inbox.next() == ("list_changed", None)
                assert "docs://b.md" not in await uris(client)

                await client.unsubscribe_resource("docs://a.md")
                (live_dir / "docs" / "a.md").write_text("# A, again\n")
                assert await inbox.next(QUIET) is None

    anyio.run(main)


def test_modern_listen_gets_list_changed_and_updated(live_dir: Path) -> None:
    manifest = live_dir / "manifest.yaml"

    async def main() -> None:
        async with Client(server_params(manifest), mode="auto", cache=None) as client:
            assert client.server_capabilities.resources.subscribe
            async with client.listen(resources_list_changed=True, resource_subscriptions=["docs://a.md"]) as sub:
                events: list[Any] = []

                async def collect() -> None:
                    async for event in sub:
                        events.append(event)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect)
                    await watchers_up(manifest.parent)
                    save(manifest, BASE + 'resources:\n  - {uri: "note://m", name: m, text: hi}\n')
                    await _until(lambda: events)
                    (live_dir / "docs" / "a.md").write_text("# A2\n")
                    await _until(lambda: len(events) >= 2)
                    (live_dir / "docs" / "b.md").write_text("# B2\n")  # not subscribed: no event
                    await anyio.sleep(QUIET)
                    tg.cancel_scope.cancel()
                assert events == [ResourcesListChanged(), ResourceUpdated(uri="docs://a.md")]
                assert (await client.read_resource("docs://a.md")).contents[0].text == "# A2\n"

    anyio.run(main)


def test_no_reload_flag(live_dir: Path) -> None:
    manifest = live_dir / "manifest.yaml"
    inbox = Inbox()

    async def main() -> None:
        async with Client(server_params(manifest, "--no-reload"), mode="legacy", cache=None,
                          message_handler=inbox) as client:
            save(manifest, BASE + 'resources:\n  - {uri: "note://n", name: n, text: hello}\n')
            assert await inbox.next(QUIET * 2) is None
            assert "note://n" not in await uris(client)

    anyio.run(main)


async def _until(condition: Any, timeout: float = SOON) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


@pytest.mark.parametrize(("gap", "mode"), [(0.1, "legacy"), (0.5, "auto")])
def test_two_chunk_save_never_serves_its_valid_first_half(live_dir: Path, gap: float, mode: str) -> None:
    """An in-place save written in two chunks `gap` apart, whose first chunk alone is a valid manifest listing
    nothing: 16 concurrent readers of a resource in both versions see no failure (the reload waits for the file
    to settle, and a reload emptying the catalog waits one more settle window)."""
    manifest = live_dir / "manifest.yaml"
    new = BASE + 'resources:\n  - {uri: "note://n", name: n, text: hello}\n'
    cut = new.index("collections:")
    first, rest = new[:cut], new[cut:]  # `first` declares the source but lists nothing
    reads = failed = 0

    async def main() -> None:
        async with Client(server_params(manifest), mode=mode, cache=None) as client:
            done = anyio.Event()

            async def reader() -> None:
                nonlocal reads, failed
                while not done.is_set():
                    try:
                        await client.read_resource("docs://a.md")
                    except MCPError:
                        failed += 1
                    reads += 1

            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(reader)
                await anyio.sleep(0.5)
                with manifest.open("r+") as handle:  # in place, as `>` in a shell or a plain editor save
                    handle.truncate(0)
                    handle.write(first)
                    handle.flush()
                    await anyio.sleep(gap)
                    handle.write(rest)
                await _until_listed(client, "note://n", timeout=15.0)
                await anyio.sleep(0.5)
                done.set()

    anyio.run(main)
    print(f"two-chunk save, gap {gap}s: {failed} of {reads} reads failed")
    assert reads > 100
    assert failed == 0


async def _until_listed(client: Client, uri: str, timeout: float = SOON) -> None:
    with anyio.fail_after(timeout):
        while uri not in await uris(client):
            await anyio.sleep(0.05)


async def listened(client: Any, steps: Sequence[tuple[Any, ...]], settle: float = 0.3,
                   quiet: float = 0.0, watched: Sequence[Path] = (), **listen: Any) -> list[Any]:
    """The events a modern-wire `client.listen(**listen)` stream hears while `steps` run: each is an action, the
    number of events that must have arrived (within 5 s) before the next one and, optionally, an async check to run
    then. The first step runs once the server
    watches the folders `watched` (tests/served.py), or else `settle` s after the stream opened; the stream is kept
    `quiet` s after the last step (for events that must not come)."""
    events: list[Any] = []
    async with client.listen(**listen) as sub:
        async def collect() -> None:
            async for event in sub:
                events.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            if watched:
                await watchers_up(*watched)
            else:
                await anyio.sleep(settle)
            for action, count, *check in steps:
                action()
                with anyio.fail_after(5):
                    while len(events) < count:
                        await anyio.sleep(0.02)
                if check and check[0] is not None:
                    await check[0]()
            await anyio.sleep(quiet)
            tg.cancel_scope.cancel()
    return events


def test_writing_back_the_last_good_manifest_clears_the_reload_error(tmp_path: Path) -> None:
    """After a broken save, saving exactly the content that last loaded reloads it (its mtime changed), clears
    /healthz's lastReloadError and says in the log that the manifest recovered."""
    import httpx2 as httpx

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    good = BASE.replace("server: {name: live}", "server: {name: live, reloadSettle: 0s}")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(good)

    with serve_http(manifest, tmp_path) as server:
        def health_until(done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
            found: dict[str, Any] = {}

            def check() -> bool:
                found.update(httpx.get(server.base + "/healthz", timeout=5).json())
                return done(found)

            wait_until(check, "/healthz", process=server.process, log=server.log, timeout=20)
            return found

        before = health_until(lambda h: h["resources"] == 1)
        wait_watched(tmp_path, tmp_path / "docs")
        save(manifest, good + "resources:\n  - {uri: 'note://x', name: x, source: nope, path: x}\n")
        failed = health_until(lambda h: h["lastReloadError"] is not None)
        assert failed["generation"] == before["generation"]  # still serving the last good catalog
        save(manifest, good)
        recovered = health_until(lambda h: h["lastReloadError"] is None)
        assert recovered["resources"] == 1
    text = (tmp_path / "server.log").read_text()
    assert f"{manifest} recovered: the last reload failed" in text, text
    assert text.count("manifest reload failed;") == 1, text  # retries of the same broken files say it once
