"""A local folder, confined to its real root; only regular files are ever opened.

Every path is resolved (symlinks included) and must stay inside the root, component-wise. Listing walks
with `os.scandir`: links to files or folders that stay inside the root are followed (each folder is walked once
through links, so a cycle ends), links that point outside the root are skipped, and the source logs once how many.

A FIFO, socket or device is refused before it is opened (and opened with O_NONBLOCK, so one swapped in meanwhile
cannot block the open). Every call (resolve, stat, open, read, walk) runs in the source's own threads under its
`timeout` and `maxConcurrency` (see `threads.ThreadSlots`): a hung mount fails its reads after `timeout` and holds at
most `maxConcurrency` threads, while other sources keep serving. A listing fails once it read no folder for
`timeout` (it may take longer in all: a million files do).

Names are `os.fsdecode` strings (`byte_names`): a name that is not UTF-8 keeps its bytes as surrogate escapes.
"""

from __future__ import annotations

import builtins  # `builtins.list` in annotations below the class's own `list` method
import errno
import logging
import os
import stat as stat_mode
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from aggregator.globs import glob_prefix, path_filter
from aggregator.paths import UnsafePath, is_servable, is_within, safe_relpath
from aggregator.sources.base import Blob, FileInfo, FileSink, Source, SourceError, SourceNotFound, SourceTooLarge
from aggregator.sources.cached_read import inline_possible, read_if_cached
from aggregator.sources.progress import ListingProgress
from aggregator.sources.threads import ThreadSlots

__all__ = ["LocalSource"]

T = TypeVar("T")
logger = logging.getLogger("aggregator.sources.local")
# Open flags: never follow a link swapped in after resolving, never block on a FIFO, never become a terminal.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_NOCTTY", 0))
# Further reads of a file that turned out larger than fstat said.
_GROWTH_CHUNK = 256 * 1024
# Errors that mean "there is no such file to serve" rather than "the folder failed".
_NAME = attrgetter("name")
_IS_DIR = os.DirEntry.is_dir
_IS_LINK = os.DirEntry.is_symlink
_SETTLED_NS = 2_000_000_000
"""How long before a walk a folder must have last changed for `plain_folders` to vouch for it (file systems keep
times in clock ticks: a change in the tick the folder was read in may leave its time as it was)."""
_ABSENT = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.ENAMETOOLONG, errno.ENXIO}


class LocalSource(Source):
    """Files under one folder on this machine."""

    byte_names = True
    """Paths are `os.fsdecode` names: undecodable bytes are surrogate escapes, encoded back by the OS calls."""

    def __init__(self, id: str, root: str, *, timeout: float = 30.0, max_concurrency: int = 8) -> None:
        self.id = id
        self.root = os.path.realpath(root)
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self._threads = ThreadSlots(max_concurrency, f"source {id}")
        self._outside_logged: set[tuple[str, ...]] = set()
        if not os.path.isdir(self.root):
            raise SourceError(f"folder {root!r} does not exist or is not a folder")
        self.inline = inline_possible(self.root)
        self._times: dict[str, int] = {}  # `folder_times`, from the last listing that walked the whole root
        self._plain: set[str] = set()  # which of them hold only files (`plain_folders`)
        """Whether small files already in the page cache are read on the event loop (a local file system)."""

    def describe(self) -> str:
        return f"local folder {self.root}"

    def watch_root(self) -> str:
        return self.root

    def plain_folders(self) -> dict[str, int]:
        return {folder: self._times[folder] for folder in self._plain}

    def folder_times(self) -> dict[str, int]:
        return self._times

    def busy_threads(self) -> int:
        """Threads running a call of this source now (stuck ones included)."""
        return self._threads.busy

    async def _call(self, func: Callable[..., T], *args: Any, alive: Callable[[], object] | None = None) -> T:
        try:
            return await self._threads.run(self.timeout, func, *args, alive=alive)
        except TimeoutError:
            raise SourceError(f"{self.describe()}: no answer within {self.timeout:g}s") from None

    def resolve(self, path: str) -> str:
        """The real absolute path of `path`, or SourceNotFound if it is unsafe or escapes the root (blocking)."""
        return self._resolve_stat(path)[0]

    def _resolve_stat(self, path: str) -> tuple[str, os.stat_result | None]:
        """`resolve(path)` and, when no segment under the root is a link, the final segment's lstat (no link, so
        it is the file's own stat); None when links were followed (the caller stats the real path then).

        The root is real (resolved at start), so when no segment under it is a link, root + path is the real path:
        one lstat per segment below the root instead of `realpath`'s one per segment from `/`. A link anywhere
        under the root falls back to `realpath` and the containment check."""
        try:
            safe_relpath(path)
        except UnsafePath as exc:
            raise SourceNotFound(f"refused path: {exc}") from None
        current = self.root.rstrip("/")  # "/" joins as "": segments are never empty nor absolute (safe_relpath)
        st: os.stat_result | None = None
        for segment in path.split("/"):
            current = current + "/" + segment  # what os.path.join gives here, at a fraction of its cost
            try:
                st = os.lstat(current)
            except OSError as exc:
                raise _os_error("stat", exc) from None
            if stat_mode.S_ISLNK(st.st_mode):
                break
        else:
            return current, st
        real = os.path.realpath(os.path.join(self.root, *path.split("/")))
        if not is_within(self.root, real) or real == self.root:
            raise SourceNotFound("path resolves outside the source root")
        return real, None

    async def stat(self, path: str) -> FileInfo:
        return await self._call(self._stat_file, path)

    def _stat_file(self, path: str) -> FileInfo:
        st = _regular_file(self.resolve(path))
        return FileInfo(path, st.st_size, st.st_mtime, _version(st.st_mtime, st.st_size))

    async def stat_many(self, paths: Iterable[str], folders: bool = False
                        ) -> tuple[builtins.list[FileInfo], set[str]]:
        return await self._call(self._stat_files, builtins.list(paths), folders)

    def _stat_files(self, paths: builtins.list[str], folders: bool) -> tuple[builtins.list[FileInfo], set[str]]:
        found: builtins.list[FileInfo] = []
        missing: set[str] = set()
        outside: builtins.list[str] = []
        for path in paths:
            try:
                found.append(self._stat_file(path))
            except SourceError:
                missing.add(path)
                if folders:
                    found += self._files_under(path, outside)
        self._note_outside_links(outside)
        return found, missing

    def _files_under(self, path: str, outside: builtins.list[str]) -> builtins.list[FileInfo]:
        """Every file under `path` if it is a folder now (as a full walk reaching it lists them), else none."""
        try:
            if not os.path.isdir(self.resolve(path)):
                return []
        except SourceError:
            return []  # gone, or a name refused
        return [FileInfo(rel, st.st_size, st.st_mtime, _version(st.st_mtime, st.st_size))
                for rel, st in self._walk(path, outside)]

    async def read(self, path: str, max_bytes: int) -> Blob:
        if self.inline:
            blob = self._read_cached(path, max_bytes)
            if blob is not None:
                return blob
        return await self._call(self._read_file, path, max_bytes)

    def _read_cached(self, path: str, max_bytes: int) -> Blob | None:
        """The file at `path` read on the event loop when that cannot block (`cached_read`); None: take a thread.
        Only the plain case: no link on the way, a regular file within `max_bytes`; errors are the thread's."""
        try:
            real, st = self._resolve_stat(path)
        except SourceError:
            return None
        if st is None or st.st_size > max_bytes:
            return None
        got = read_if_cached(real, st)
        if got is None:
            return None
        data, st = got
        return Blob(data, version=_version(st.st_mtime, st.st_size))

    def _read_file(self, path: str, max_bytes: int) -> Blob:
        real, st = self._resolve_stat(path)
        # Checked before open: a FIFO, socket or device is never opened.
        if st is None:
            _regular_file(real)
        elif not stat_mode.S_ISREG(st.st_mode):
            raise SourceNotFound("not a regular file")
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as exc:
            raise _os_error("open", exc) from None
        try:
            st = os.fstat(fd)
            if not stat_mode.S_ISREG(st.st_mode):  # swapped after the check
                raise SourceNotFound("not a regular file")
            if st.st_size > max_bytes:
                raise SourceTooLarge(st.st_size, max_bytes)
            try:
                data = read_at_most(fd, st.st_size, max_bytes)
            except OSError as exc:
                raise _os_error("read", exc) from None
        finally:
            os.close(fd)
        if len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        return Blob(data, version=_version(st.st_mtime, st.st_size))

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        progress = ListingProgress(self.id, "files")
        # `timeout` bounds a listing's silence (no folder read), not its length: a million files take minutes.
        return await self._call(self._list, pattern, tuple(exclude), hidden, progress, alive=progress.alive)

    def _list(self, pattern: str, exclude: tuple[str, ...], hidden: bool, progress: ListingProgress
              ) -> builtins.list[FileInfo]:
        files: list[FileInfo] = []

        def add(path: str, size: int | None, mtime: float | None, mime: str | None) -> None:
            assert size is not None and mtime is not None
            files.append(FileInfo(path, size, mtime, _version(mtime, size)))

        self._scan(pattern, exclude, hidden, add, progress)
        return files

    async def scan(self, pattern: str, exclude: Sequence[str], hidden: bool, sink: FileSink) -> None:
        progress = ListingProgress(self.id, "files")
        await self._call(self._scan, pattern, tuple(exclude), hidden, sink, progress, alive=progress.alive)

    def _scan(self, pattern: str, exclude: tuple[str, ...], hidden: bool, sink: FileSink,
              progress: ListingProgress) -> None:
        """`_list` telling `sink` of each file as the walk finds it (in path order), without a FileInfo each."""
        wanted = path_filter(pattern, exclude, hidden)
        prefix = glob_prefix(pattern)
        if prefix and not is_servable(prefix):
            return  # `docs/../*` would list `docs/../a.md`: a name no read accepts, and none to walk for
        outside: list[str] = []
        seen = found = 0
        for batch in self._batches(prefix, outside, progress):
            seen += len(batch)
            progress.add(len(batch))  # a call a folder: a call a file was a tenth of the walk's own work
            for rel, st in batch:
                if wanted(rel):
                    sink(rel, st.st_size, st.st_mtime, None)
                    found += 1
        progress.done(found)
        self._note_outside_links(outside)

    def _note_outside_links(self, outside: builtins.list[str]) -> None:
        """Log the links a walk skipped for leading outside the root: once per source and set of links."""
        key = tuple(sorted(outside))
        if not key or key in self._outside_logged or len(self._outside_logged) >= 64:
            return
        self._outside_logged.add(key)
        logger.info("source %r: %d link(s) lead outside the folder and are not listed, e.g. %s", self.id, len(key),
                    ", ".join(repr(p) for p in key[:3]))

    def _walk(self, prefix: str, outside: builtins.list[str], progress: ListingProgress | None = None
              ) -> Iterator[tuple[str, os.stat_result]]:
        """Yield (relative path, stat) for every regular file under `prefix`, following only inner symlinks, in
        path order (each folder's names sorted, a folder's files where its name plus '/' sorts), so listings come
        sorted; links leading outside the root are added to `outside`; `progress` hears of each folder read."""
        for batch in self._batches(prefix, outside, progress):
            yield from batch

    def _batches(self, prefix: str, outside: builtins.list[str], progress: ListingProgress | None = None
                 ) -> Iterator[builtins.list[tuple[str, os.stat_result]]]:
        """`_walk`'s files in runs (a folder's files up to its next subfolder): a folder of plain files (no
        subfolder, no link: most of them) is one run made in one comprehension, a few C calls a file."""
        start = os.path.realpath(os.path.join(self.root, *prefix.split("/"))) if prefix else self.root
        if not is_within(self.root, start) or not os.path.isdir(start):
            return
        visited = {start}
        # Folders of plain files, for a watcher setting up: only from a walk of the whole root, and only those last
        # changed a while before they were read (a change within the same clock tick would leave the time as it was).
        plain: set[str] | None = set() if start == self.root else None
        times: dict[str, int] = {}
        settled = time.time_ns() - _SETTLED_NS
        # One iterator of sorted names per folder being walked: a folder is walked where it sorts, then its parent
        # goes on after it.
        stack = [_sorted_folder(start, prefix + "/" if prefix else "")]
        while stack:
            if progress is not None:
                progress.step()
            folder = stack[-1]
            vouched = plain is not None and 0 <= folder.mtime_ns < settled
            if vouched:
                times[folder.path] = folder.mtime_ns
            if folder.plain is not None:
                stack.pop()
                if vouched and plain is not None:
                    plain.add(folder.path)
                if folder.plain:
                    yield folder.plain
                continue
            run: builtins.list[tuple[str, os.stat_result]] = []
            for rel, entry in folder.entries:
                try:
                    if entry.is_symlink():
                        real = os.path.realpath(entry.path)
                        if not is_within(self.root, real):
                            if os.path.exists(real):  # a dangling link is no file to tell about
                                outside.append(rel)
                            continue
                        st = os.stat(real)
                        if stat_mode.S_ISDIR(st.st_mode):
                            if real not in visited:
                                visited.add(real)
                                stack.append(_sorted_folder(real, rel + "/"))
                                break
                        elif stat_mode.S_ISREG(st.st_mode):
                            run.append((rel, st))
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(_sorted_folder(entry.path, rel + "/"))
                        break
                    elif entry.is_file(follow_symlinks=False):
                        run.append((rel, entry.stat(follow_symlinks=False)))
                except OSError:
                    continue
            else:
                stack.pop()  # every name seen: the folder is done
            if run:
                yield run
        if plain is not None:
            self._plain, self._times = plain, times  # the walk ended (an abandoned one keeps the last whole one's)


class _Folder:
    """One folder being walked (`path`, modified at `mtime_ns` just before it was read, -1 if unknown): its
    (relative path, entry) pairs in path order, or, for a folder of plain files, the (relative path, stat) of its
    regular files made at once (`plain`; None for any other folder)."""

    __slots__ = ("entries", "mtime_ns", "path", "plain")

    def __init__(self, path: str, mtime_ns: int, entries: Iterator[tuple[str, os.DirEntry[str]]],
                 plain: builtins.list[tuple[str, os.stat_result]] | None = None) -> None:
        self.path, self.mtime_ns, self.entries, self.plain = path, mtime_ns, entries, plain


def _sorted_folder(folder: str, rel_prefix: str) -> _Folder:
    """(relative path, entry) of each name in `folder`, in the order of the paths under it: a subfolder's name
    sorts with a '/' after it (`a.md` < `a/...` < `a0.md`), as its files' paths do. Nothing when it cannot be read.
    A folder with neither subfolders nor links comes as its files' stats at once."""
    try:
        mtime_ns = os.stat(folder).st_mtime_ns  # before reading it: a change after this leaves a later time
        with os.scandir(folder) as listing:
            entries = builtins.list(listing)
    except OSError:
        return _Folder(folder, -1, iter(()), [])
    try:
        nested = any(map(_IS_DIR, entries))  # C-level: most folders hold only files
    except OSError:
        nested = True
    if nested:
        entries.sort(key=lambda e: e.name + "/" if _is_folder(e) else e.name)
    else:
        entries.sort(key=_NAME)
        try:
            if not any(map(_IS_LINK, entries)):  # from the entry's type (d_type): no call to the OS
                return _Folder(folder, mtime_ns, iter(()), [(rel_prefix + e.name, e.stat(follow_symlinks=False))
                                                            for e in entries if e.is_file(follow_symlinks=False)])
        except OSError:
            pass  # one went meanwhile: the careful loop skips just that one
    return _Folder(folder, mtime_ns, ((rel_prefix + e.name, e) for e in entries))


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether `entry` is a folder or a link to one (a dangling or unreadable one is not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def read_at_most(fd: int, expected: int, max_bytes: int) -> bytes:
    """The bytes of `fd` to its end, but never more than `max_bytes + 1` (one past the limit tells the caller it
    was passed). The first read asks for `expected + 1` bytes (fstat's size): a buffer of the file's size rather
    than of the limit (a 10 MiB allocation per read costs more than the read); a file that grew since is read on."""
    limit = max_bytes + 1
    chunks: list[bytes] = []
    total = 0
    want = min(expected, max_bytes) + 1
    while total < limit:
        chunk = os.read(fd, min(want, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        want = max(want, _GROWTH_CHUNK)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _regular_file(real: str) -> os.stat_result:
    """The stat of `real` if it is a regular file; SourceNotFound for anything else or nothing."""
    try:
        st = os.stat(real)
    except OSError as exc:
        raise _os_error("stat", exc) from None
    if not stat_mode.S_ISREG(st.st_mode):
        raise SourceNotFound("not a regular file")
    return st


def _os_error(call: str, exc: OSError) -> SourceError:
    if exc.errno in _ABSENT:
        return SourceNotFound(f"{call}: {exc.strerror}")
    return SourceError(f"{call} failed: {exc.strerror or exc}")


def _version(mtime: float, size: int) -> str:
    return f"{mtime!r}:{size}"
