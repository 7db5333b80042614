"""A source kind serving the files inside a zip archive, read-only: `url: archive://./handbook.zip`.

The example of docs/writing-a-source-kind.md: one module holds the kind's declaration and its Source. Registered by
the entry point `archive = "archive_kind:ArchiveKind"` in the group `aggregator.source_kinds`.
"""

from __future__ import annotations

import calendar
import zipfile
from collections.abc import Sequence
from pathlib import Path

import anyio.to_thread

from aggregator.globs import path_filter
from aggregator.manifest.model import SourceSpec
from aggregator.manifest.source_urls import local_path
from aggregator.paths import is_servable
from aggregator.sources import (Blob, FileInfo, Setting, Source, SourceError, SourceKind, SourceNotFound,
                                SourceTooLarge)


class ArchiveSource(Source):
    """The files of one zip archive under `root` (a folder in it). The archive is opened per call: a replaced
    file is seen at once, and nothing stays open."""

    def __init__(self, id: str, path: str, root: str = "") -> None:
        self.id, self.path = id, path
        self.root = root.strip("/") + "/" if root.strip("/") else ""

    def _members(self) -> dict[str, zipfile.ZipInfo]:
        try:
            with zipfile.ZipFile(self.path) as archive:  # names that could leave the root ("../x") are never served
                return {i.filename[len(self.root):]: i for i in archive.infolist() if not i.is_dir()
                        and i.filename.startswith(self.root) and is_servable(i.filename[len(self.root):])}
        except (OSError, zipfile.BadZipFile) as exc:
            raise SourceError(f"{self.describe()} cannot be read: {exc}") from None

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        wanted = path_filter(pattern, exclude, hidden)
        members = await anyio.to_thread.run_sync(self._members)
        return [_info(path, info) for path, info in sorted(members.items()) if wanted(path)]

    async def stat(self, path: str) -> FileInfo:
        info = (await anyio.to_thread.run_sync(self._members)).get(path)
        if info is None:
            raise SourceNotFound(f"no {path} in {self.describe()}")
        return _info(path, info)

    async def read(self, path: str, max_bytes: int) -> Blob:
        return await anyio.to_thread.run_sync(self._read, path, max_bytes)

    def _read(self, path: str, max_bytes: int) -> Blob:
        info = self._members().get(path)
        if info is None:
            raise SourceNotFound(f"no {path} in {self.describe()}")
        try:
            with zipfile.ZipFile(self.path) as archive, archive.open(info) as member:
                data = member.read(max_bytes + 1)  # the size in the archive is a claim: count what comes out
        except (OSError, zipfile.BadZipFile) as exc:
            raise SourceError(f"{self.describe()} cannot be read: {exc}") from None
        if len(data) > max_bytes:
            raise SourceTooLarge(max(info.file_size, len(data)), max_bytes)
        return Blob(data, version=_version(info))

    def describe(self) -> str:
        return f"archive {Path(self.path).name}"


def _info(path: str, info: zipfile.ZipInfo) -> FileInfo:
    mtime = float(calendar.timegm((*info.date_time, 0, 0, 0)))
    return FileInfo(path, info.file_size, mtime, _version(info))


def _version(info: zipfile.ZipInfo) -> str:
    return f"{info.CRC:08x}-{info.file_size}"


class ArchiveKind(SourceKind):
    """`archive://./docs.zip` (relative to the manifest's folder) or `archive:///srv/docs.zip`."""

    name = "archive"
    schemes = frozenset({"archive"})
    url_help = "archive://./bundle.zip (the files inside a zip archive)"
    settings = {"root": Setting({"description": "archive sources: the folder inside the archive to serve, e.g. "
                                                "handbook-1.2 (default: all of it).", "type": "string"}, "")}

    def locate(self, url: str, base: Path) -> str:
        return local_path(url[len("archive://"):], base)

    def reads_this_machine(self, url: str) -> bool:
        return True  # a manifest read from a URL may not name this machine's files

    def open(self, spec: SourceSpec) -> Source:
        return ArchiveSource(spec.id, spec.url, spec.settings["root"])
