"""Watching never stops the server: a watcher that fails (a file name that is not UTF-8) degrades to polling,
logged once, and later changes are still noticed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client

from tests.conftest import MODES, server_params, write_manifest
from tests.test_live import BASE, save
from tests.served import watchers_up

NOTICED = 15.0  # seconds a change may take to show once watching fell back to polling (it polls every 2 s)

# The collection lists notes/ only, so this test holds whatever listing makes of a name that is not UTF-8:
# it is about the watchers, which see the whole folder (and the manifest's folder) whatever the globs.
NOTES = BASE.replace('glob: "*.md"', 'glob: "notes/*.md"')


def create_bytes_name(folder: Path, name: bytes) -> None:
    """Create an empty file whose name is raw bytes (here not valid UTF-8)."""
    fd = os.open(os.fsencode(folder) + b"/" + name, os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)


@pytest.mark.parametrize("mode", MODES)
def test_non_utf8_names_while_serving_degrade_watching_to_polling(tmp_path: Path, mode: str) -> None:
    (tmp_path / "docs" / "notes").mkdir(parents=True)
    (tmp_path / "docs" / "notes" / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, NOTES)
    errlog_path = tmp_path / "server.log"

    async def uris(client: Client) -> list[str]:
        return [r.uri for r in (await client.list_resources()).resources]

    async def until_listed(client: Client, uri: str) -> None:
        with anyio.fail_after(NOTICED):
            while uri not in await uris(client):
                await anyio.sleep(0.2)

    async def main() -> None:
        with errlog_path.open("w") as errlog:
            async with Client(stdio_client(server_params(manifest), errlog=errlog), mode=mode, cache=None) as client:
                assert await uris(client) == ["docs://notes/a.md"]
                await watchers_up(tmp_path, tmp_path / "docs")
                create_bytes_name(tmp_path / "docs", b"caf\xe9.md")  # in a watched source folder
                create_bytes_name(tmp_path, b"caf\xe9.yaml")  # beside the manifest (its folder is watched)
                await anyio.sleep(1.0)
                assert await uris(client) == ["docs://notes/a.md"]  # still serving
                for i in range(3):  # more events on the bad names: still one warning per watch
                    (tmp_path / "docs" / os.fsdecode(b"caf\xe9.md")).write_text(f"{i}")
                    (tmp_path / os.fsdecode(b"caf\xe9.yaml")).write_text(f"{i}")
                    await anyio.sleep(0.1)

                (tmp_path / "docs" / "notes" / "b.md").write_text("# B\n")  # noticed by polling the folder
                await until_listed(client, "docs://notes/b.md")
                assert (await client.read_resource("docs://notes/b.md")).contents[0].text == "# B\n"

                save(manifest, NOTES + 'resources:\n  - {uri: "note://n", name: n, text: hi}\n')  # by the digest check
                await until_listed(client, "note://n")

    anyio.run(main)
    log = errlog_path.read_text(errors="replace")
    print(log)
    docs_warnings = [line for line in log.splitlines() if "watching" in line and str(tmp_path / "docs") in line]
    manifest_warnings = [line for line in log.splitlines() if "watching" in line and "manifest" in line]
    assert len(docs_warnings) == 1, log
    assert len(manifest_warnings) == 1, log
    assert "Traceback" not in log, log


def test_only_the_folder_holding_the_bad_name_is_polled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three sources, two of them on nested folders: a name that is not UTF-8 in one folder sends that folder (and
    the source nested in it) to polling with one warning each; the other keeps its watcher, and every source
    still hears of its changes."""
    from aggregator.watch import POLL_SECONDS, Change, watch_folders

    outer, inner, other = tmp_path / "outer", tmp_path / "outer" / "inner", tmp_path / "other"
    for folder in (inner, other):
        folder.mkdir(parents=True)
    roots = {"outer": str(outer), "inner": str(inner), "other": str(other)}
    heard: list[tuple[str, set[tuple[Change, str]]]] = []

    async def on_change(source: str, changes: set[tuple[Change, str]]) -> None:
        heard.append((source, changes))

    def saw(source: str, path: str) -> bool:
        return any(sid == source and any(p == path for _, p in changes) for sid, changes in heard)

    async def until(condition: Any, timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not condition():
                await anyio.sleep(0.02)

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_folders, roots, on_change, stop)
            await anyio.sleep(0.5)
            (inner / "x.md").write_text("x")  # nested roots: both sources hear of it
            await until(lambda: saw("outer", "inner/x.md") and saw("inner", "x.md"), 5)
            create_bytes_name(inner, b"caf\xe9.md")
            await anyio.sleep(0.5)
            (other / "y.md").write_text("y")
            await until(lambda: saw("other", "y.md"), 2)  # a watcher: well inside one poll interval
            (inner / "z.md").write_text("z")
            await until(lambda: saw("outer", "inner/z.md") and saw("inner", "z.md"), POLL_SECONDS * 4)
            stop.set()

    with caplog.at_level("WARNING", logger="aggregator.watch"):
        anyio.run(main)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sorted(w.split("'")[1] for w in warnings) == ["inner", "outer"], warnings
    assert all("polling" in w for w in warnings)


@pytest.mark.parametrize("watcher", ["native", "watchfiles"])
def test_folders_are_watched_one_by_one_off_the_event_loop_following_the_tree(tmp_path: Path, watcher: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A recursive watch starts with a walk that stats every file holding the GIL (10 s for 1,000,000 files, the
    server's first answer held back): folders are watched one by one instead, from worker threads, and the set
    follows the tree: a folder created, renamed or moved in is watched at its new path, one that goes is not.
    Both watchers: inotify's own (`native`, Linux) and watchfiles' (elsewhere)."""
    import threading

    import aggregator.folder_watch as folder_watch
    import aggregator.watch as watch
    from aggregator.inotify_watch import available
    from aggregator.watch import Change, watch_folders

    if watcher == "native" and not available():
        pytest.skip("no inotify here")
    if watcher == "watchfiles":
        monkeypatch.setattr(watch, "_native", lambda: False)

    calls: list[tuple[threading.Thread, bool]] = []
    real = folder_watch.watch

    def seen(*args: Any, **kwargs: Any) -> Any:  # the real watcher, noting how and where it is made
        calls.append((threading.current_thread(), kwargs.get("recursive", True)))
        return real(*args, **kwargs)

    monkeypatch.setattr(folder_watch, "watch", seen)
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    (outside / "d" / "e").mkdir(parents=True)
    (outside / "d" / "e" / "in.md").write_text("in")
    heard: list[tuple[Change, str]] = []

    async def on_change(source: str, changes: set[tuple[Change, str]]) -> None:
        heard.extend(changes)

    async def until_heard(path: str, write: Path | None = None) -> None:
        """Wait until `path` is heard of, writing `write` again meanwhile (a new folder's watch may not be up yet
        at the first write: the folder's own event is what tells a listing to look inside it)."""
        with anyio.fail_after(10):
            while not any(p == path for _, p in heard):
                if write is not None:
                    write.write_text(str(len(heard)))
                await anyio.sleep(0.1)

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_folders, {"docs": str(root)}, on_change, stop)
            await until_heard("a/x.md", root / "a" / "x.md")
            (root / "b").mkdir()
            await until_heard("b/y.md", root / "b" / "y.md")  # a new folder is watched
            (root / "b").rename(root / "c")
            await until_heard("c")
            heard.clear()
            await until_heard("c/z.md", root / "c" / "z.md")  # at its new name
            assert not any(p.startswith("b/") for _, p in heard), heard
            (outside / "d").rename(root / "d")  # moved in: said as the folder, then its folders are watched
            await until_heard("d")
            await until_heard("d/e/w.md", root / "d" / "e" / "w.md")
            (root / "a" / "x.md").unlink()
            (root / "a").rmdir()
            await until_heard("a")
            stop.set()

    anyio.run(main)
    if watcher == "watchfiles":
        assert calls and all(thread is not threading.main_thread() and not recursive for thread, recursive in calls)
        assert len(calls) >= 4  # made again as folders came and went


def _settled_tree(root: Path) -> None:
    """root/a/{1,2}.md and root/b/3.md, every folder last changed a minute ago (a listing vouches for its time)."""
    for folder, names in {"a": ["1.md", "2.md"], "b": ["3.md"]}.items():
        (root / folder).mkdir(parents=True)
        for name in names:
            (root / folder / name).write_text(f"# {name}\n")
    past = os.stat(root).st_mtime - 60
    for folder in (root / "a", root / "b", root):
        os.utime(folder, (past, past))


def test_changed_since_names_the_folders_whose_time_moved(tmp_path: Path) -> None:
    """A folder changed since a listing read it is named whole; in a root, its files and new folders are named
    instead (a root is the whole tree)."""
    from aggregator.folder_watch import changed_since
    from aggregator.watch import Change

    root = tmp_path / "root"
    _settled_tree(root)
    times = {str(f): os.stat(f).st_mtime_ns for f in (root, root / "a", root / "b")}
    assert changed_since(times, [str(root)]) == set()
    (root / "a" / "new.md").write_text("new")
    (root / "b" / "3.md").unlink()
    assert changed_since(times, [str(root)]) == {(Change.modified, str(root / "a")), (Change.modified, str(root / "b"))}
    (root / "top.md").write_text("top")
    (root / "c").mkdir()
    assert changed_since(times, [str(root)]) == {
        (Change.modified, str(root / "a")), (Change.modified, str(root / "b")),
        (Change.modified, str(root / "top.md")), (Change.modified, str(root / "c"))}


def test_a_change_between_the_listing_and_the_watch_is_not_lost(tmp_path: Path) -> None:
    """The catalog is listed, then files come and go in folders it read before any watch is up (at 1,000,000
    files that window is seconds long): once the watches are up the listing follows them all the same."""
    docs = tmp_path / "docs"
    _settled_tree(docs)
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: live}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "**/*.md", uri: "docs://{path}"}
        """)

    async def main() -> None:
        from aggregator.service import ResourceService
        from aggregator.supervisor import Supervisor
        from aggregator.notify import Notifier

        def listed() -> list[str]:
            return sorted(str(e.uri) for e in service.catalog.page(None, 100).items)

        service = await ResourceService.open(manifest)
        try:
            assert listed() == ["docs://a/1.md", "docs://a/2.md", "docs://b/3.md"]
            (docs / "a" / "new.md").write_text("# new\n")  # listed, and not yet watched
            (docs / "b" / "3.md").unlink()
            live = Supervisor(service, Notifier())
            async with anyio.create_task_group() as tg:
                tg.start_soon(live.run)
                with anyio.fail_after(10):
                    while listed() != ["docs://a/1.md", "docs://a/2.md", "docs://a/new.md"]:
                        await anyio.sleep(0.05)
                live.stop()
                tg.cancel_scope.cancel()
        finally:
            await service.aclose()

    anyio.run(main)
