"""Watching folders through inotify directly (Linux), with a mask of only the changes that matter.

watchfiles (the Rust `notify` crate) asks inotify for every event, IN_OPEN and IN_CLOSE_NOWRITE included: each file
the server opens to answer a read woke its thread (15-25 us of CPU per read and a GIL hand-over, issue 29). Here a
watch asks for what changes a folder's listing or a file's bytes (created, deleted, moved, written, attributes) and
the inotify descriptor is read on the event loop when it is readable: reading files wakes nothing.

The tree is watched as `folder_watch` does, folder by folder and following the tree (a folder that comes is walked
and watched before it is told, so a listing of it misses nothing; one that goes drops its watches), with the same
settle (`step_ms` without news, at most `debounce_ms`) and the same catch-up of a listing (`since`). A queue
overflow is answered by looking again at every root's entries, folders whole (as `changed_since` does for a root,
a file deleted from a root itself meanwhile is not found), and by finding the tree's folders again. No inotify
watch left raises, as watchfiles did, with the path in the message (`watch._roots_named`). A name that is not UTF-8
is told as `os.fsdecode` spells it (surrogate escapes), as a listing does: the kernel gives the name's bytes, which
watchfiles could not report (it raised, and the root was polled).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.to_thread
from watchfiles import Change

from aggregator.folder_watch import Batch, came_and_went, changed_since, folders_under

__all__ = ["MASK", "available", "watch_folders_changes", "watch_tree"]

try:
    import inotify_simple
except ImportError:  # not Linux, or not installed: watchfiles watches instead
    inotify_simple = None

# <sys/inotify.h>
_MODIFY, _ATTRIB, _CLOSE_WRITE, _MOVED_FROM, _MOVED_TO, _CREATE = 0x02, 0x04, 0x08, 0x40, 0x80, 0x100
_DELETE, _DELETE_SELF, _MOVE_SELF, _OVERFLOW, _IGNORED, _ONLYDIR = 0x200, 0x400, 0x800, 0x4000, 0x8000, 0x01000000
_ADDED, _DELETED, _CHANGED = _CREATE | _MOVED_TO, _DELETE | _MOVED_FROM, _MODIFY | _CLOSE_WRITE | _ATTRIB
_SELF = _DELETE_SELF | _MOVE_SELF
MASK = _ADDED | _DELETED | _CHANGED | _SELF | _ONLYDIR
"""What a folder's watch asks for: never IN_OPEN, IN_ACCESS or IN_CLOSE_NOWRITE (reading a file tells nothing)."""
_READ_BYTES = 64 * 1024


def available() -> bool:
    """Whether folders can be watched here through inotify (Linux with inotify_simple installed)."""
    return inotify_simple is not None and sys.platform == "linux"


class WatchLimit(OSError):
    """No inotify watch left (fs.inotify.max_user_watches); the message names the folder that could not be watched."""


class Watches:
    """One inotify instance and the folders it watches: watch descriptor -> paths (a folder reached through links
    has one descriptor and several paths) and path -> descriptor. Used from one thread at a time."""

    def __init__(self) -> None:
        assert inotify_simple is not None
        self.inotify = inotify_simple.INotify(nonblocking=True)
        self.fd = self.inotify.fileno()
        self.paths: dict[int, set[str]] = {}
        self.wd_of: dict[str, int] = {}

    def add(self, folders: Iterable[str]) -> None:
        """Watch each folder; one that is gone or not readable is left out (its parent's events tell of it)."""
        for folder in folders:
            try:
                wd = self.inotify.add_watch(folder, MASK)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise WatchLimit(errno.ENOSPC, f'no inotify watch left (fs.inotify.max_user_watches = '
                                                   f'{_max_watches()}) watching "{folder}"') from None
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
                    continue
                raise
            self.paths.setdefault(wd, set()).add(folder)
            self.wd_of[folder] = wd

    def drop(self, folders: Iterable[str]) -> None:
        """Stop watching these folders and every watched folder under them."""
        prefixes = tuple(folder + os.sep for folder in folders)
        gone = [path for path in self.wd_of if path in folders or path.startswith(prefixes)] if prefixes else []
        for path in gone:
            wd = self.wd_of.pop(path)
            paths = self.paths.get(wd, set())
            paths.discard(path)
            if not paths:
                self.paths.pop(wd, None)
                try:
                    self.inotify.rm_watch(wd)
                except OSError:
                    pass  # the kernel dropped it already (the folder was deleted)

    def read(self) -> tuple[Batch, bool]:
        """The changes waiting on the descriptor (without blocking), and whether the kernel's queue overflowed."""
        batch: Batch = set()
        overflowed = False
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                return batch, overflowed
            for event in inotify_simple.parse_events(data):
                if event.mask & _OVERFLOW:
                    overflowed = True
                elif event.mask & _IGNORED:  # the kernel dropped this watch (folder deleted or unmounted)
                    for path in self.paths.pop(event.wd, ()):
                        self.wd_of.pop(path, None)
                else:
                    self._heard(event, batch)

    def _heard(self, event: Any, batch: Batch) -> None:
        wd, mask, name = event.wd, event.mask, event.name
        for folder in self.paths.get(wd, ()):
            path = os.path.join(folder, name) if name else folder
            if mask & _ADDED:
                batch.add((Change.added, path))
            elif mask & _DELETED or mask & _SELF:
                batch.add((Change.deleted, path))
            elif mask & _CHANGED:
                batch.add((Change.modified, path))

    def close(self) -> None:
        self.inotify.close()


def _max_watches() -> str:
    try:
        with open("/proc/sys/fs/inotify/max_user_watches", encoding="ascii") as limit:
            return limit.read().strip()
    except OSError:
        return "unknown"


async def _settled(watches: Watches, stop: anyio.Event, debounce_ms: int, step_ms: int) -> tuple[Batch, bool]:
    """Wait for changes, then gather more until `step_ms` passes without any or `debounce_ms` since the first."""
    while True:
        await anyio.wait_readable(watches.fd)
        batch, overflowed = watches.read()
        if batch or overflowed:
            break
    first = time.monotonic()
    while (time.monotonic() - first) * 1000 < debounce_ms and not stop.is_set():
        await anyio.sleep(step_ms / 1000)
        more, overflow = watches.read()
        if not more and not overflow:
            break
        batch |= more
        overflowed = overflowed or overflow
    return batch, overflowed


async def _until_stopped(stop: anyio.Event, body: Callable[[], Awaitable[None]]) -> None:
    """Run `body` until it returns or `stop` is set."""
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            await body()
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        await stop.wait()
        tg.cancel_scope.cancel()


async def watch_tree(roots: Iterable[str], deliver: Callable[[Batch], Awaitable[None]], stop: anyio.Event,
                     *, debounce_ms: int, step_ms: int, plain: Mapping[str, int] | None = None,
                     since: Mapping[str, int] | None = None) -> None:
    """`folder_watch.watch_tree` over inotify: `deliver(batch)` for each settled batch of (change, absolute path)
    under `roots` until `stop`; raises a `WatchLimit` naming the folder. The tree's first walk and
    watches are made in a worker thread, then the descriptor is read on the event loop."""
    roots = list(roots)
    folders = await anyio.to_thread.run_sync(folders_under, roots, plain)
    watches = Watches()
    try:
        # One task reads the descriptor and changes the watches (the walks and inotify_add_watch calls in worker
        # threads meanwhile): a batch is read, settled and delivered before the next is read, the kernel queueing it.
        await anyio.to_thread.run_sync(watches.add, sorted(folders))

        async def follow() -> None:
            if since is not None:
                batch = await anyio.to_thread.run_sync(changed_since, since, roots)
                if batch:
                    await deliver(batch)
            while True:
                batch, overflowed = await _settled(watches, stop, debounce_ms, step_ms)
                if overflowed:  # changes were lost: every root's entries are looked at again, the tree found again
                    batch |= await anyio.to_thread.run_sync(changed_since, dict.fromkeys(roots, -1), roots)
                    found = await anyio.to_thread.run_sync(folders_under, roots)
                    watches.drop(set(watches.wd_of) - found)
                    await anyio.to_thread.run_sync(watches.add, sorted(found - set(watches.wd_of)))
                else:
                    came, went = came_and_went(batch, watches.wd_of, roots)
                    watches.drop(went)
                    if came:  # watched before it is told: a listing of it then misses nothing
                        found = await anyio.to_thread.run_sync(folders_under, came)
                        await anyio.to_thread.run_sync(watches.add, sorted(found))
                if batch and not stop.is_set():
                    await deliver(batch)

        await _until_stopped(stop, follow)
    finally:
        watches.close()


async def watch_folders_changes(folders: Iterable[str], on_change: Callable[[], Awaitable[None]],
                                stop: anyio.Event | None, *, debounce_ms: int, step_ms: int) -> None:
    """Call `on_change()` after each settled batch of changes in `folders` (not below them) until `stop` (or
    cancelled); raises as `watch_tree` does."""
    stop = stop if stop is not None else anyio.Event()
    watches = Watches()
    try:
        watches.add(folders)

        async def follow() -> None:
            while True:
                batch, overflowed = await _settled(watches, stop, debounce_ms, step_ms)
                if (batch or overflowed) and not stop.is_set():
                    await on_change()

        await _until_stopped(stop, follow)
    finally:
        watches.close()
