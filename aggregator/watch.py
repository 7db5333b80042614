"""Filesystem watchers: the manifest (with its folder, for editors' atomic renames and Kubernetes ConfigMap
symlink swaps) and the folders of local sources. Each calls back with debounced batches of changes.

On Linux the folders are watched through inotify with a mask of changes only (`inotify_watch`: reading a file
wakes nothing), elsewhere through watchfiles. inotify gives names as bytes: one that is not UTF-8 is told as
`os.fsdecode` spells it (surrogate escapes), as listings and URIs carry it (`paths`), so on Linux it costs no watch.

Watching never stops the server. When a watcher fails (the OS runs out of watches; a folder vanishes; elsewhere
than Linux, a file name that is not UTF-8, which watchfiles cannot report) one warning names the folder, and the
watch degrades: the manifest to the caller's periodic digest check, a source folder to polling its tree every
`POLL_SECONDS`.
"""

from __future__ import annotations

import logging
import os
import stat as stat_mode
from functools import partial
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

import anyio
import anyio.to_thread
from watchfiles import Change, awatch

from aggregator.folder_watch import watch_tree

__all__ = ["POLL_SECONDS", "Change", "poll_folder", "watch_folders", "watch_manifest"]

logger = logging.getLogger("aggregator.watch")

DEBOUNCE_MS = 50
STEP_MS = 20
# How often the watcher thread looks at its stop flag: bounds how long shutting a watcher down takes.
RUST_TIMEOUT_MS = 200
POLL_SECONDS = 2.0
"""How often a folder whose watcher failed is walked for changes."""

FolderCallback = Callable[[str, set[tuple[Change, str]]], Awaitable[None]]
Snapshot = dict[str, tuple[int, int, int]]
"""Relative path -> (mtime ns, size, inode) of every file under a root."""


async def watch_manifest(paths: Iterable[str], on_change: Callable[[], Awaitable[None]],
                         stop: anyio.Event | None = None) -> None:
    """Call `on_change` after any change in the folders holding `paths` (the caller decides if content changed).

    Watching the folder, not the file, sees a file replaced by rename and a `..data` symlink swapped. Returns
    when `stop` is set, or after one warning if the watcher fails: the caller's periodic check takes over.
    """
    folders = sorted({os.path.dirname(os.path.abspath(p)) for p in paths})
    try:
        if _native():
            from aggregator.inotify_watch import watch_folders_changes

            await watch_folders_changes(folders, on_change, stop, debounce_ms=DEBOUNCE_MS, step_ms=STEP_MS)
            return
        async for _ in awatch(*folders, debounce=DEBOUNCE_MS, step=STEP_MS, stop_event=stop, recursive=False,
                              rust_timeout=RUST_TIMEOUT_MS, ignore_permission_denied=True):
            await on_change()
    except Exception as exc:
        logger.warning("watching the manifest's folder %s failed (%s): saves are noticed by the periodic check "
                       "instead", ", ".join(folders), _reason(exc))


async def watch_folders(roots: dict[str, str], on_change: FolderCallback, stop: anyio.Event | None = None,
                        plain: Mapping[str, int] | None = None, since: Mapping[str, int] | None = None) -> None:
    """Call `on_change(source_id, {(change, relative path)})` for file changes under each root, until `stop`.
    `plain`: folders the sources' listings found holding only files (`Source.plain_folders`), not read again.
    `since`: the listings' folder times (`Source.folder_times`): what changed after a listing read a folder and
    before the watches came up is told once they are.

    A root whose watcher fails is polled instead (one warning names it); the other roots keep a watcher. A
    failing `on_change` is logged and watching goes on.
    """
    if not roots:
        return
    stop = stop if stop is not None else anyio.Event()
    watched: dict[str, list[str]] = {}
    for sid, root in roots.items():
        watched.setdefault(os.path.realpath(root), []).append(sid)
    async with anyio.create_task_group() as tg:
        while watched and not stop.is_set():
            try:
                await _watch(watched, on_change, stop, plain, since)
                break
            except Exception as exc:
                reason = _reason(exc)
                # The failed batch is lost with the watcher, and the message names the path it could not report:
                # the roots holding that path are polled, the others get a new watcher.
                for root in _roots_named(reason, watched) or sorted(watched):
                    for sid in watched.pop(root):
                        logger.warning("watching source %r (folder %s) failed (%s): its changes are noticed by "
                                       "polling every %gs instead", sid, root, reason, POLL_SECONDS)
                        tg.start_soon(poll_folder, sid, root, on_change, stop)


async def _watch(watched: dict[str, list[str]], on_change: FolderCallback, stop: anyio.Event,
                 plain: Mapping[str, int] | None = None, since: Mapping[str, int] | None = None) -> None:
    """Watch the roots folder by folder until `stop`, delivering each batch (`folder_watch`: no recursive watch,
    whose setup walked and stat-ed the whole tree holding the GIL, 10 s for 1,000,000 files). Through inotify on
    Linux (`inotify_watch`: opening a file to read it wakes nothing), else watchfiles."""
    if _native():
        from aggregator import inotify_watch

        await inotify_watch.watch_tree(watched, partial(_dispatch, watched, on_change), stop,
                                       debounce_ms=DEBOUNCE_MS, step_ms=STEP_MS, plain=plain, since=since)
        return
    await watch_tree(watched, partial(_dispatch, watched, on_change), stop, debounce_ms=DEBOUNCE_MS, step_ms=STEP_MS,
                     rust_timeout_ms=RUST_TIMEOUT_MS, plain=plain, since=since)


def _native() -> bool:
    """Whether folders are watched through inotify here (`inotify_watch`) rather than watchfiles."""
    from aggregator.inotify_watch import available

    return available()


async def _dispatch(watched: dict[str, list[str]], on_change: FolderCallback, batch: set[tuple[Change, str]]) -> None:
    """Hand one batch of absolute paths to `on_change`, per source whose root holds them."""
    grouped: dict[str, set[tuple[Change, str]]] = {}
    for change, path in batch:
        for root, sids in watched.items():
            if path.startswith(root + os.sep):  # nested roots: every source that holds the file hears of it
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                for sid in sids:
                    grouped.setdefault(sid, set()).add((change, relative))
    for sid, changes in grouped.items():
        await _deliver(on_change, sid, changes)


async def poll_folder(source: str, root: str, on_change: FolderCallback, stop: anyio.Event) -> None:
    """Walk `root` every `POLL_SECONDS` until `stop` and report what changed as the watcher would. The first
    report names every file as added: what a failed watcher had not reported yet is unknown."""
    before: Snapshot = {}
    failing = False
    while not stop.is_set():
        try:
            now = await anyio.to_thread.run_sync(_snapshot, root)
        except Exception as exc:
            if not failing:  # once, not every poll
                logger.warning("polling folder %s of source %r failed (%s); trying again every %gs", root, source,
                               _reason(exc), POLL_SECONDS)
            failing = True
        else:
            failing = False
            changes = _changes(before, now)
            before = now
            if changes:
                await _deliver(on_change, source, changes)
        with anyio.move_on_after(POLL_SECONDS):
            await stop.wait()


def _snapshot(root: str) -> Snapshot:
    """Every file under `root` (symlinks as themselves, not followed), with what shows it changed."""
    return {relative: (st.st_mtime_ns, st.st_size, st.st_ino) for relative, st in _walk(root)}


def _walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    stack = [(root, "")]  # a stack, not recursion: folders may nest deeper than Python recurses
    while stack:
        folder, prefix = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # gone or unreadable: its files count as deleted
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat_mode.S_ISDIR(st.st_mode):
                stack.append((entry.path, prefix + entry.name + "/"))
            else:
                yield prefix + entry.name, st


def _changes(before: Snapshot, now: Snapshot) -> set[tuple[Change, str]]:
    changes = {(Change.added, path) for path in now.keys() - before.keys()}
    changes |= {(Change.deleted, path) for path in before.keys() - now.keys()}
    changes |= {(Change.modified, path) for path in now.keys() & before.keys() if now[path] != before[path]}
    return changes


async def _deliver(on_change: FolderCallback, source: str, changes: set[tuple[Change, str]]) -> None:
    # A failure handling changes (a listing that fails) is not a failure of watching: log it and keep watching.
    try:
        await on_change(source, changes)
    except Exception:
        logger.exception("handling file changes of source %r failed; still watching it", source)


def _reason(exc: BaseException) -> str:
    """The messages of an exception and, for a group (anyio's task groups wrap them), of each one inside."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _roots_named(message: str, roots: Iterable[str]) -> list[str]:
    return sorted(root for root in roots if root + os.sep in message or f'"{root}"' in message)
