"""Folders watched through inotify (Linux): a watch asks only for changes, so reading files wakes nothing (issue 29),
and every kind of change still reaches the source as watchfiles told it."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aggregator.watch import Change, watch_folders
from tests.served import watchers_up

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")

_WATCH = re.compile(r"^inotify wd:\S+ ino:(?P<ino>[0-9a-f]+) sdev:\S+ mask:(?P<mask>[0-9a-f]+)", re.M)
IN_ACCESS, IN_CLOSE_NOWRITE, IN_OPEN = 0x01, 0x10, 0x20


def watch_masks(folder: Path) -> list[int]:
    """The masks of this process's inotify watches on `folder` (/proc/self/fdinfo)."""
    masks = []
    for name in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path(f"/proc/self/fdinfo/{name}").read_text(errors="replace")
        except OSError:
            continue
        masks += [int(m["mask"], 16) for m in _WATCH.finditer(text) if int(m["ino"], 16) == folder.stat().st_ino]
    return masks


class Heard:
    """What `watch_folders` told, per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[tuple[Change, str]]]] = []

    async def __call__(self, source: str, changes: set[tuple[Change, str]]) -> None:
        self.calls.append((source, changes))

    def changes(self) -> set[tuple[Change, str]]:
        return {change for _, changes in self.calls for change in changes}

    async def until(self, condition: Callable[[set[tuple[Change, str]]], bool], timeout: float = 5) -> None:
        with anyio.fail_after(timeout):
            while not condition(self.changes()):
                await anyio.sleep(0.02)


@asynccontextmanager
async def watching(root: Path, *watched: Path) -> AsyncIterator[Heard]:
    """`watch_folders` on `root` (source "docs") until the block ends, once `watched` folders are watched."""
    heard = Heard()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_folders, {"docs": str(root)}, heard, stop)
        await watchers_up(root, *watched)
        await anyio.sleep(0.1)
        yield heard
        stop.set()


def test_reading_files_under_a_watched_tree_wakes_no_watcher(tmp_path: Path) -> None:
    """200 files opened and read under watched folders: no watch asks for opens, reads or closes without a write,
    so nothing is heard (watchfiles asked for them all, mask 0xfee, and its thread woke at every read)."""
    root = tmp_path / "docs"
    folders = [root / f"d{i}" for i in range(4)]
    for folder in folders:
        folder.mkdir(parents=True)
        for i in range(50):
            (folder / f"f{i}.md").write_text(f"# {i}\n")

    async def main() -> None:
        async with watching(root, *folders) as heard:
            await anyio.sleep(0.3)  # the writes above may still be told
            heard.calls.clear()
            for folder in folders:
                for i in range(50):
                    with open(folder / f"f{i}.md", "rb") as handle:
                        assert handle.read()
            await anyio.sleep(0.3)
            assert heard.calls == []
            for folder in (root, *folders):
                masks = watch_masks(folder)
                assert masks and all(m & (IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE) == 0 for m in masks), masks

    anyio.run(main)


def test_each_kind_of_change_is_told(tmp_path: Path) -> None:
    """Created, written (closed, or kept open), attributes, deleted, renamed in a folder and across folders, a folder
    created, moved out and deleted, a link to a folder inside the tree: each told as watchfiles told it."""
    root = tmp_path / "docs"
    a, b, outside = root / "a", root / "b", tmp_path / "outside"
    for folder in (a, b, outside):
        folder.mkdir(parents=True)
    (a / "old.md").write_text("old")

    async def main() -> None:
        async with watching(root, a, b) as heard:
            async def told(*changes: tuple[Change, str]) -> None:
                await heard.until(lambda seen: set(changes) <= seen)
                heard.calls.clear()

            (a / "new.md").write_text("new")
            await told((Change.added, "a/new.md"))
            with open(a / "new.md", "a") as handle:  # written and still open: IN_MODIFY
                handle.write("more")
                handle.flush()
                await told((Change.modified, "a/new.md"))
            os.chmod(a / "new.md", 0o600)
            await told((Change.modified, "a/new.md"))
            (a / "new.md").rename(a / "renamed.md")
            await told((Change.deleted, "a/new.md"), (Change.added, "a/renamed.md"))
            (a / "renamed.md").rename(b / "moved.md")
            await told((Change.deleted, "a/renamed.md"), (Change.added, "b/moved.md"))
            (b / "moved.md").rename(outside / "gone.md")
            await told((Change.deleted, "b/moved.md"))
            (a / "old.md").unlink()
            await told((Change.deleted, "a/old.md"))
            (root / "c").mkdir()
            await told((Change.added, "c"))
            (root / "c" / "in.md").write_text("in")  # the folder was watched before it was told
            await told((Change.added, "c/in.md"))
            (root / "c").rename(outside / "c")
            await told((Change.deleted, "c"))
            (outside / "c" / "after.md").write_text("after")  # moved out: no longer watched
            (root / "link").symlink_to(b, target_is_directory=True)
            await told((Change.added, "link"))
            (b / "through.md").write_text("x")  # b watched at both its paths
            await told((Change.added, "b/through.md"), (Change.added, "link/through.md"))
            (root / "c2").mkdir()
            await told((Change.added, "c2"))
            (root / "c2").rmdir()
            await told((Change.deleted, "c2"))
            assert not any("after.md" in path for _, path in heard.changes())

    anyio.run(main)


def test_a_queue_overflow_looks_at_every_root_entry_again(tmp_path: Path) -> None:
    """More changes than the kernel queues (fs.inotify.max_queued_events) while a batch is handled: the next batch
    names every entry of the root (folders are looked at again whole), and a folder made meanwhile is watched."""
    root = tmp_path / "docs"
    root.mkdir()
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if queued > 20_000:
        pytest.skip(f"max_queued_events is {queued}")
    release = anyio.Event()
    heard = Heard()

    async def slow(source: str, changes: set[tuple[Change, str]]) -> None:
        await heard(source, changes)
        await release.wait()

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_folders, {"docs": str(root)}, slow, stop)
            await watchers_up(root)
            (root / "first.md").write_text("first")
            await heard.until(lambda seen: (Change.added, "first.md") in seen)
            (root / "new").mkdir()  # not watched yet: the watcher is held in the batch before
            for i in range(queued // 2 + 100):  # each: IN_CREATE and IN_CLOSE_WRITE
                (root / f"{i}.md").touch()
            release.set()
            await heard.until(lambda seen: {(Change.modified, "new"), (Change.modified, "1000.md")} <= seen)
            (root / "new" / "later.md").write_text("later")
            await heard.until(lambda seen: (Change.added, "new/later.md") in seen)
            stop.set()

    anyio.run(main)


def test_stopping_closes_every_watch(tmp_path: Path) -> None:
    """Once stopped, no inotify watch of the tree is left open (and no thread of its own ever ran)."""
    root = tmp_path / "docs"
    (root / "a").mkdir(parents=True)

    async def main() -> None:
        async with watching(root, root / "a"):
            assert watch_masks(root / "a")
        assert watch_masks(root) == watch_masks(root / "a") == []

    anyio.run(main)


def test_no_watch_left_polls_that_root_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """inotify_add_watch failing with ENOSPC (fs.inotify.max_user_watches spent: the kernel's answer is put in its
    place, as spending the machine's shared limit would starve other processes): the root holding that folder is
    polled, with one warning that names the setting; the other root keeps its watch."""
    import errno

    import inotify_simple

    from aggregator.watch import POLL_SECONDS

    full, other = tmp_path / "full", tmp_path / "other"
    (full / "deep").mkdir(parents=True)
    other.mkdir()
    real = inotify_simple.INotify.add_watch

    def add_watch(self: inotify_simple.INotify, path: str, mask: int) -> int:
        if os.path.basename(path) == "deep":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, path, mask)

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", add_watch)
    heard = Heard()

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_folders, {"full": str(full), "other": str(other)}, heard, stop)
            await watchers_up(other)
            (other / "a.md").write_text("a")
            await heard.until(lambda seen: (Change.added, "a.md") in seen, 2)  # watched: well inside a poll
            (full / "deep" / "b.md").write_text("b")
            await heard.until(lambda seen: (Change.added, "deep/b.md") in seen, POLL_SECONDS * 4)
            stop.set()

    with caplog.at_level("WARNING", logger="aggregator.watch"):
        anyio.run(main)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'full'" in warnings[0] and "max_user_watches" in warnings[0], warnings
    assert "polling" in warnings[0]


def _make(path: bytes, data: bytes = b"") -> None:
    """Create (or overwrite) the file at raw bytes `path`."""
    with open(path, "wb") as handle:
        handle.write(data)


def test_names_that_are_not_utf8_are_told_as_any_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A Latin-1 name (b'caf\\xe9.md') created, written, renamed, deleted, a folder of such a name and a file in it:
    each told with the name as `os.fsdecode` spells it (surrogate escapes), as the listing spells it, and the root
    stays on inotify (no warning, and no poll: one would come in an hour), a UTF-8 name beside them still told."""
    import aggregator.watch as watch

    monkeypatch.setattr(watch, "POLL_SECONDS", 3600.0)
    root = tmp_path / "docs"
    root.mkdir()
    raw = os.fsencode(root)
    cafe, naive, folder = os.fsdecode(b"caf\xe9.md"), os.fsdecode(b"na\xefve.md"), os.fsdecode(b"d\xe9j\xe0")

    async def main() -> None:
        async with watching(root) as heard:
            async def told(*changes: tuple[Change, str]) -> None:
                await heard.until(lambda seen: set(changes) <= seen)
                heard.calls.clear()

            _make(raw + b"/caf\xe9.md", b"1")
            await told((Change.added, cafe))
            _make(raw + b"/caf\xe9.md", b"22")
            await told((Change.modified, cafe))
            os.rename(raw + b"/caf\xe9.md", raw + b"/na\xefve.md")
            await told((Change.deleted, cafe), (Change.added, naive))
            os.mkdir(raw + b"/d\xe9j\xe0")
            await told((Change.added, folder))
            _make(raw + b"/d\xe9j\xe0/caf\xe9.md")  # the folder was watched before it was told
            await told((Change.added, f"{folder}/{cafe}"))
            os.unlink(raw + b"/na\xefve.md")
            await told((Change.deleted, naive))
            (root / "plain.md").write_text("plain")
            await told((Change.added, "plain.md"))

    with caplog.at_level("WARNING", logger="aggregator.watch"):
        anyio.run(main)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


def test_a_name_that_is_not_utf8_beside_the_manifest_keeps_its_watch(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The manifest's folder holding a Latin-1 name: saves of the manifest are still heard through its watch, and
    watching it does not end (no warning, no fall back to the periodic digest check)."""
    from aggregator.watch import watch_manifest

    manifest = tmp_path / "manifest.yaml"
    manifest.write_text("version: 1\n")
    heard: list[int] = []

    async def touched() -> None:
        heard.append(len(heard))

    async def until(count: int) -> None:
        with anyio.fail_after(5):
            while len(heard) < count:
                await anyio.sleep(0.02)

    async def main() -> None:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_manifest, [str(manifest)], touched, stop)
            await watchers_up(tmp_path)
            _make(os.fsencode(tmp_path) + b"/caf\xe9.yaml", b"x")
            await until(1)
            await anyio.sleep(0.2)
            manifest.write_text("version: 1\n# saved\n")
            await until(len(heard) + 1)
            assert watch_masks(tmp_path)  # still watched
            stop.set()

    with caplog.at_level("WARNING", logger="aggregator.watch"):
        anyio.run(main)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


_NAMES = st.binary(min_size=1, max_size=255).filter(lambda n: b"/" not in n and b"\0" not in n and n not in
                                                    (b".", b".."))
"""Any name a Linux file system takes: bytes but '/' and NUL, at most 255 of them."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(b"caf\xe9.md")
@example(b"\xff\xfe")
@example(b"\xed\xa0\x80")  # a UTF-8-encoded surrogate: not UTF-8 either
@given(name=_NAMES)
def test_any_byte_name_is_told_as_the_path_it_is(tmp_path: Path, name: bytes) -> None:
    """Whatever its bytes, a file created and deleted in a watched folder is told (added, then deleted) at one
    path, and that path is the file's: it encodes back to the same bytes and opens the same file."""
    from aggregator.inotify_watch import Watches

    folder = str(tmp_path)
    raw = os.fsencode(folder) + b"/" + name
    watches = Watches()
    try:
        watches.add([folder])
        _make(raw, b"x")
        added, _ = watches.read()  # inotify queues the event before the call that made it returns
        os.unlink(raw)
        deleted, _ = watches.read()
    finally:
        watches.close()
    (path,) = {p for _, p in added}
    assert os.fsencode(path) == raw
    assert {c for c, _ in added} == {Change.added, Change.modified} and deleted == {(Change.deleted, path)}
