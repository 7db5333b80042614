"""Watching never stops the server: a watcher that fails degrades to polling (watchfiles, on a name that is not
UTF-8 it cannot report), logged once, and later changes are still noticed. On Linux such names are watched as any
other: served end to end through inotify."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from aggregator.inotify_watch import available
from tests.conftest import server_params, write_manifest
from tests.test_live import BASE, QUIET, Inbox, listened, uris
from tests.served import patched_command, watchers_up

FULL_RELIST = "full relist after changes"


def create_bytes_name(folder: Path, name: bytes, data: bytes = b"") -> None:
    """Create a file whose name is raw bytes (here not valid UTF-8) holding `data`."""
    fd = os.open(os.fsencode(folder) + b"/" + name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def unpolled_server(manifest: Path, *global_args: str) -> StdioServerParameters:
    """`aggregator [global_args] serve manifest` whose folder poller, were a watch to fail, would look once an hour:
    what such a server notices in seconds its watches told it."""
    command = patched_command("aggregator.watch", POLL_SECONDS=3600.0)
    return StdioServerParameters(command=command[0], args=[*command[1:], *global_args, "serve", str(manifest)],
                                 env=server_params(manifest).env)


@pytest.mark.skipif(not available(), reason="inotify is Linux's")
@pytest.mark.parametrize(("mode", "log_format"), [("legacy", "text"), ("auto", "json")])
def test_names_that_are_not_utf8_are_served_live_through_inotify(tmp_path: Path, mode: str, log_format: str) -> None:
    """A folder holding a Latin-1 name stays on inotify: a second such file added is told by list_changed and listed
    under its percent-encoded URI, one written is told by `updated`, one deleted by list_changed, and a UTF-8 name
    after them too, each applied in place (no full relist), with the poller an hour away. The DEBUG log, text or
    JSON, holds no traceback, no logging error and no fall back to polling."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    create_bytes_name(docs, b"caf\xe9.md", b"# cafe\n")
    manifest = write_manifest(tmp_path, BASE)
    log = tmp_path / "server.log"
    params = unpolled_server(manifest, "--log-level", "DEBUG", "--log-format", log_format)
    cafe, naive = "docs://caf%E9.md", "docs://na%EFve.md"
    told = [ResourcesListChanged(), ResourceUpdated(uri=cafe), ResourcesListChanged(), ResourcesListChanged()]

    def steps(client: Client) -> list[tuple[Any, Any]]:
        """Each change made, with what to check once it was told."""
        async def naive_listed() -> None:
            assert await uris(client) == ["docs://a.md", cafe, naive]
            assert (await client.read_resource(naive)).contents[0].text == "# naive\n"

        return [(lambda: create_bytes_name(docs, b"na\xefve.md", b"# naive\n"), naive_listed),
                (lambda: create_bytes_name(docs, b"caf\xe9.md", b"# cafe, longer\n"), None),
                (lambda: os.unlink(os.fsencode(docs) + b"/na\xefve.md"), None),
                (lambda: (docs / "b.md").write_text("# B\n"), None)]

    async def legacy(client: Client, inbox: Inbox) -> list[Any]:
        await watchers_up(docs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.subscribe_resource(cafe)
        events: list[Any] = []
        for (action, check), expected in zip(steps(client), told, strict=True):
            action()
            kind, uri = await inbox.next() or ("nothing", None)
            events.append(ResourcesListChanged() if kind == "list_changed" else ResourceUpdated(uri=uri or kind))
            assert events[-1] == expected, events
            if check is not None:
                await check()
        assert await inbox.next(QUIET) is None
        return events

    async def main() -> list[Any]:
        inbox = Inbox()
        with log.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode=mode, cache=None,
                              message_handler=inbox) as client:
                assert await uris(client) == ["docs://a.md", cafe]
                if mode == "legacy":
                    events = await legacy(client, inbox)
                else:
                    counted = [(action, i + 1, check) for i, (action, check) in enumerate(steps(client))]
                    events = await listened(client, counted, quiet=QUIET, watched=[docs],
                                            resources_list_changed=True, resource_subscriptions=[cafe])
                assert await uris(client) == ["docs://a.md", "docs://b.md", cafe]
                assert (await client.read_resource(cafe)).contents[0].text == "# cafe, longer\n"
                return events

    assert anyio.run(main) == told
    text = log.read_text(errors="replace")
    for wrong in ("polling", "Traceback", "Logging error", FULL_RELIST):
        assert wrong not in text, text[-4000:]


def test_watchfiles_gives_up_the_manifest_folder_on_a_name_it_cannot_report(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """watchfiles (other platforms than Linux) cannot report a name that is not UTF-8: the manifest's watch ends
    with one warning, and the caller's periodic digest check takes over."""
    import aggregator.watch as watch

    monkeypatch.setattr(watch, "_native", lambda: False)
    manifest = write_manifest(tmp_path, BASE)

    async def touched() -> None:
        pass

    async def main() -> None:
        with anyio.fail_after(10):  # returns once the watcher failed
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch.watch_manifest, [str(manifest)], touched)
                await watchers_up(tmp_path)  # watchfiles watches through inotify too, on Linux
                create_bytes_name(tmp_path, b"caf\xe9.yaml")

    with caplog.at_level("WARNING", logger="aggregator.watch"):
        anyio.run(main)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "periodic check" in said[0], said


def test_only_the_folder_holding_the_bad_name_is_polled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """watchfiles (other platforms than Linux), three sources, two of them on nested folders: a name that is not
    UTF-8 in one folder sends that folder (and the source nested in it) to polling with one warning each; the other
    keeps its watcher, and every source still hears of its changes."""
    import aggregator.watch as watch
    from aggregator.watch import POLL_SECONDS, Change, watch_folders

    monkeypatch.setattr(watch, "_native", lambda: False)

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
