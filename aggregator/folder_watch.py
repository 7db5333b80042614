"""Watching a tree folder by folder: one non-recursive watch per folder rather than watchfiles' recursive mode.

A recursive watch starts with a walk of the whole tree that stats every entry (notify's walkdir follows links) while
holding the GIL: for 1,000,000 files, 10 s in which no Python thread runs, a second full walk after the listing's,
and the server's first answer held back behind it. Here one walk finds the folders (it reads folders only, no stat a
file, and gives the GIL back at each read), each folder is watched on its own, and the set follows the tree: when a
folder comes (created, moved in, renamed) or goes, the watch is made again over the new set, the old one kept until
the new one is up, so no change falls between the two (one seen by both is told twice, which costs a second look).
This is the watchfiles watcher (other platforms than Linux); `inotify_watch` watches the same way over inotify, with
the walks and the catch-up (`folders_under`, `changed_since`, `came_and_went`) from here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from operator import methodcaller

import anyio
import anyio.from_thread
import anyio.to_thread
from watchfiles import Change, watch

__all__ = ["Batch", "came_and_went", "changed_since", "folders_under", "watch_tree"]

Batch = set[tuple[Change, str]]
_IS_FOLDER = methodcaller("is_dir", follow_symlinks=False)
_IS_LINK = methodcaller("is_symlink")


def folders_under(roots: Iterable[str], plain: Mapping[str, int] | None = None) -> set[str]:
    """Every folder under the roots, the roots included, and links to folders that stay inside the root holding
    them (each real folder walked once through links, so a cycle ends). Blocking: run it in a thread.

    `plain` (a source's `plain_folders`): folders known to hold neither subfolders nor links while their
    modification time (ns) is the one given; such a folder is looked at (one stat), not read."""
    plain = plain or {}
    found: set[str] = set()
    for root in roots:
        real_root = os.path.realpath(root)
        visited = {real_root}
        stack = [root]
        found.add(root)
        while stack:
            folder = stack.pop()
            try:
                if folder in plain and os.stat(folder).st_mtime_ns == plain[folder]:
                    continue  # still as a listing found it: nothing under it but files
                with os.scandir(folder) as listing:
                    entries = list(listing)
            except OSError:
                continue  # gone or unreadable: nothing under it to watch
            for entry in _folders_and_links(entries):
                if entry.is_symlink():
                    try:
                        real = os.path.realpath(entry.path)
                        if real in visited or not os.path.isdir(real) or not _within(real_root, real):
                            continue
                    except OSError:
                        continue
                    visited.add(real)
                found.add(entry.path)
                stack.append(entry.path)
    return found


def changed_since(times: Mapping[str, int], roots: Iterable[str]) -> Batch:
    """What may have changed in the folders whose modification time moved from the one in `times` (a listing's:
    `Source.folder_times`): (modified, folder) for each, which a consumer looks at again whole; in a root, its files
    and the folders not in `times` instead (a root is the whole tree; a file deleted from it is not found here).
    Blocking: run it in a thread."""
    roots = set(roots)
    moved: list[str] = []
    for folder, mtime in times.items():
        try:
            if os.stat(folder).st_mtime_ns == mtime:
                continue
        except OSError:
            continue  # gone: the time of the folder holding it moved too
        moved.append(folder)
    batch: Batch = set()
    whole: list[str] = []  # folders named whole: what is under them is not named again
    for folder in sorted(moved):
        if folder in roots:
            try:
                with os.scandir(folder) as entries:
                    batch.update((Change.modified, e.path) for e in entries if not (e.path in times and _safely(e)))
            except OSError:
                continue
        elif not any(_within(taken, folder) for taken in whole):
            whole.append(folder)
            batch.add((Change.modified, folder))
    return batch


def came_and_went(batch: Batch, watched: Container[str], roots: Iterable[str]) -> tuple[set[str], set[str]]:
    """(folders that came, folders that went) by `batch`: a path under `roots` that is a folder now and is not
    `watched`, a watched path that was deleted and is no folder now."""
    came, went = set(), set()
    for change, path in batch:
        if change == Change.deleted:
            if path in watched and not os.path.isdir(path):
                went.add(path)
        elif path not in watched and os.path.isdir(path) and any(_within(r, path) for r in roots):
            came.add(path)
    return came, went


def _folders_and_links(entries: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
    """The entries that are folders or links: two C-level passes (d_type, no stat) where the file system gives
    types, else one entry at a time (one that cannot be looked at is left out)."""
    try:
        return [*filter(_IS_FOLDER, entries), *filter(_IS_LINK, entries)]
    except OSError:
        return [e for e in entries if _safely(e)]


def _safely(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_symlink() or entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _within(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


class _Watches:
    """The folders watched and the watchers running over them, newest last; one of them is live."""

    def __init__(self, roots: list[str], folders: set[str]) -> None:
        self.roots = roots
        self.folders = folders
        self.flags: dict[int, threading.Event] = {}  # by generation: set to stop that watcher
        self.live = -1
        self.made = 0

    def moved(self, batch: Batch) -> tuple[set[str], set[str]]:
        return came_and_went(batch, self.folders, self.roots)

    def apply(self, came: set[str], went: set[str]) -> None:
        if went:
            prefixes = tuple(path + os.sep for path in went)
            self.folders = {f for f in self.folders if f not in went and not f.startswith(prefixes)}
        self.folders |= came

    def up(self, generation: int) -> None:
        """Watcher `generation` watches now: older ones stop (or it does, if a newer one is up already)."""
        if generation < self.live:
            self.flags[generation].set()
            return
        self.live = generation
        for older in [g for g in self.flags if g < generation]:
            self.flags.pop(older).set()


async def watch_tree(roots: Iterable[str], deliver: Callable[[Batch], Awaitable[None]], stop: anyio.Event,
                     *, debounce_ms: int, step_ms: int, rust_timeout_ms: int,
                     plain: Mapping[str, int] | None = None, since: Mapping[str, int] | None = None) -> None:
    """`deliver(batch)` for each batch of (change, absolute path) under `roots` until `stop`; raises what a watcher
    raises (a name it cannot report, no watches left ...). Watchers run in worker threads. `plain`: as for
    `folders_under`, which it spares reading most folders again right after a listing read them. `since`: the
    listing's folder times (`changed_since`): once the first watches are up, what changed between the listing and
    them is delivered too, so a change in that window is not lost."""
    roots = list(roots)
    state = _Watches(roots, await anyio.to_thread.run_sync(folders_under, roots, plain))
    caught_up = since is None

    async def catch_up(times: Mapping[str, int]) -> None:
        batch = await anyio.to_thread.run_sync(changed_since, times, roots)
        if batch and not stop.is_set():
            await deliver(batch)

    async with anyio.create_task_group() as tg:
        async def follow(generation: int, folders: list[str]) -> None:
            mine = state.flags[generation]
            came_up = False

            class Stop:
                def is_set(self) -> bool:
                    return mine.is_set() or stop.is_set()

            async def heard(batch: Batch) -> None:
                nonlocal came_up, caught_up
                if not came_up:  # the first batch (empty after rust_timeout_ms) says the watches are made
                    came_up = True
                    state.up(generation)
                    if not caught_up and since is not None:
                        caught_up = True
                        tg.start_soon(catch_up, since)
                if not batch or mine.is_set():
                    return
                came, went = state.moved(batch)
                state.apply(came, went)  # at once: the same batch from an overlapping watcher finds them known
                await deliver(batch)
                if came or went:
                    if came:
                        state.apply(await anyio.to_thread.run_sync(folders_under, came), set())
                    start(sorted(state.folders))

            def run() -> None:
                for batch in watch(*folders, debounce=debounce_ms, step=step_ms, stop_event=Stop(),
                                   rust_timeout=rust_timeout_ms, yield_on_timeout=True, recursive=False,
                                   ignore_permission_denied=True):
                    anyio.from_thread.run(heard, batch)

            try:
                for attempt in range(3):
                    try:
                        await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
                        return
                    except FileNotFoundError:  # a folder went between finding it and watching it: find them again
                        if attempt == 2 or came_up:
                            raise
                        state.folders = await anyio.to_thread.run_sync(folders_under, roots, plain)
                        folders = sorted(state.folders)
            finally:
                mine.set()  # cancelled: the thread ends at its next look (rust_timeout_ms)

        def start(folders: list[str]) -> None:
            generation = state.made
            state.made += 1
            state.flags[generation] = threading.Event()
            tg.start_soon(follow, generation, folders)

        start(sorted(state.folders))
