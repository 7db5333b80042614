"""Converted text kept on disk across restarts (`server.documents.cacheDir`). A file is named by the sha256 of the
document's bytes, its format and the conversion's settings, so a changed document or setting never finds the old
text; it holds a sha256 of its text, so a damaged file is ignored (and replaced by the next conversion). Files are
written whole then renamed into place; past `cacheBytes` the least recently used go first."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import anyio.to_thread

from aggregator.manifest.model import ConvertSettings, DocumentsSettings

__all__ = ["StoredConversions", "stored_conversions"]

logger = logging.getLogger("aggregator")

_VERSION = b"aggregator-converted-1\n"
"""First line of every file: a different layout (or converters that write differently) gets new names."""


class StoredConversions:
    """Converted text under `folder`, at most `max_bytes` of it."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes

    def name(self, document: bytes, fmt: str, limits: ConvertSettings) -> str:
        settings = json.dumps({"format": fmt, "limits": asdict(limits)}, sort_keys=True).encode()
        return hashlib.sha256(_VERSION + settings + b"\0" + hashlib.sha256(document).digest()).hexdigest() + ".md"

    async def get(self, name: str) -> str | None:
        """The text kept under `name`; None when there is none or it is damaged."""
        return await anyio.to_thread.run_sync(self._get, name)

    async def put(self, name: str, text: str) -> None:
        """Keep `text` under `name` (a failure to write is logged, never raised: the read has its text)."""
        await anyio.to_thread.run_sync(self._put, name, text)

    def _get(self, name: str) -> str | None:
        path = self.folder / name
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head, _, body = data.partition(b"\n")
        if head != hashlib.sha256(body).hexdigest().encode():
            logger.warning("documents cache: %s is damaged; converting again", name)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return body.decode("utf-8", "surrogatepass")

    def _put(self, name: str, text: str) -> None:
        body = text.encode("utf-8", "surrogatepass")
        if len(body) > self.max_bytes:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".writing-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
                os.replace(temporary, self.folder / name)
            except BaseException:
                os.unlink(temporary)
                raise
            self._trim()
        except OSError as exc:
            logger.warning("documents cache: cannot write to %s: %s", self.folder, exc)

    def _trim(self) -> None:
        """Remove the least recently used files until what is kept fits in max_bytes."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".md") and entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                files.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                return
            try:
                os.unlink(path)
            except OSError:
                continue
            total -= size


def stored_conversions(settings: DocumentsSettings) -> StoredConversions | None:
    """The disk store `server.documents` asks for; None without a cacheDir."""
    return None if settings.cache_dir is None else StoredConversions(settings.cache_dir, settings.cache_bytes)
