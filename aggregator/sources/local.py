"""A local folder, read through fsspec's local filesystem and confined to its real root.

Every path is resolved (symlinks included) and must stay inside the root, component-wise. Listing walks
with `os.scandir` rather than fsspec's `find`: it is twice as fast, never loops on symlink cycles and
skips links that point outside the root.
"""

from __future__ import annotations

import os
import stat as stat_mode
from collections.abc import Iterator, Sequence

import anyio.to_thread
import fsspec

from aggregator.globs import compile_glob, glob_prefix
from aggregator.paths import UnsafePath, is_within, safe_relpath
from aggregator.sources.base import Blob, FileInfo, SourceError, SourceNotFound, SourceTooLarge

__all__ = ["LocalSource"]


class LocalSource:
    """Files under one folder on this machine."""

    url_paths = False

    def __init__(self, id: str, root: str) -> None:
        self.id = id
        self.root = os.path.realpath(root)
        self._fs = fsspec.filesystem("file")
        if not os.path.isdir(self.root):
            raise SourceError(f"folder {root!r} does not exist or is not a folder")

    def describe(self) -> str:
        return f"local folder {self.root}"

    def resolve(self, path: str) -> str:
        """The real absolute path of `path`, or SourceNotFound if it is unsafe or escapes the root."""
        try:
            safe_relpath(path)
        except UnsafePath as exc:
            raise SourceNotFound(f"refused path: {exc}") from None
        real = os.path.realpath(os.path.join(self.root, *path.split("/")))
        if not is_within(self.root, real) or real == self.root:
            raise SourceNotFound("path resolves outside the source root")
        return real

    async def stat(self, path: str) -> FileInfo:
        real = self.resolve(path)
        return await anyio.to_thread.run_sync(self._stat_file, path, real)

    def _stat_file(self, path: str, real: str) -> FileInfo:
        try:
            info = self._fs.info(real)
        except FileNotFoundError:
            raise SourceNotFound("no such file") from None
        except OSError as exc:
            raise SourceError(f"stat failed: {exc.strerror or exc}") from None
        if info.get("type") != "file":
            raise SourceNotFound("not a file")
        size, mtime = int(info["size"]), float(info["mtime"])
        return FileInfo(path, size, mtime, _version(mtime, size))

    async def read(self, path: str, max_bytes: int) -> Blob:
        real = self.resolve(path)
        return await anyio.to_thread.run_sync(self._read_file, real, max_bytes)

    def _read_file(self, real: str, max_bytes: int) -> Blob:
        try:
            with self._fs.open(real, "rb") as handle:
                st = os.fstat(handle.fileno())
                size = st.st_size
                if not stat_mode.S_ISREG(st.st_mode):
                    raise SourceNotFound("not a file")
                if size > max_bytes:
                    raise SourceTooLarge(size, max_bytes)
                # Read one byte past the limit: the file may have grown since fstat.
                data = handle.read(max_bytes + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise SourceNotFound("no such file") from None
        except OSError as exc:
            raise SourceError(f"read failed: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise SourceTooLarge(len(data), max_bytes)
        return Blob(data, version=_version(st.st_mtime, size))

    async def list(self, pattern: str, exclude: Sequence[str] = ()) -> list[FileInfo]:
        return await anyio.to_thread.run_sync(self._list, pattern, tuple(exclude))

    def _list(self, pattern: str, exclude: tuple[str, ...]) -> list[FileInfo]:
        match = compile_glob(pattern).fullmatch
        excluded = [compile_glob(e).fullmatch for e in exclude]
        prefix = glob_prefix(pattern)
        files: list[FileInfo] = []
        for rel, st in self._walk(prefix):
            if match(rel) and not any(x(rel) for x in excluded):
                files.append(FileInfo(rel, st.st_size, st.st_mtime, _version(st.st_mtime, st.st_size)))
        return files

    def _walk(self, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
        """Yield (relative path, stat) for every regular file under `prefix`, following only inner symlinks."""
        start = os.path.realpath(os.path.join(self.root, *prefix.split("/"))) if prefix else self.root
        if not is_within(self.root, start) or not os.path.isdir(start):
            return
        stack = [(start, prefix + "/" if prefix else "")]
        visited = {start}
        while stack:
            folder, rel_prefix = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                rel = rel_prefix + entry.name
                try:
                    if entry.is_symlink():
                        real = os.path.realpath(entry.path)
                        if not is_within(self.root, real):
                            continue
                        st = os.stat(real)
                        if stat_mode.S_ISDIR(st.st_mode):
                            if real not in visited:
                                visited.add(real)
                                stack.append((real, rel + "/"))
                        elif stat_mode.S_ISREG(st.st_mode):
                            yield rel, st
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, rel + "/"))
                    elif entry.is_file(follow_symlinks=False):
                        yield rel, entry.stat(follow_symlinks=False)
                except OSError:
                    continue


def _version(mtime: float, size: int) -> str:
    return f"{mtime!r}:{size}"
