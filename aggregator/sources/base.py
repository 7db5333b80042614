"""The one interface every source kind implements, and the errors it may raise.

Sources know files and bytes, nothing of MCP. Paths are '/'-separated and relative to the source root;
callers pass them through `aggregator.paths.safe_relpath` first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    """Relative to the source root, '/'-separated."""
    size: int | None = None
    mtime: float | None = None
    """Seconds since the epoch, UTC."""
    version: str | None = None
    """ETag, object id or mtime+size: equal versions mean equal bytes (None when the backend gives none)."""
    mime_type: str | None = None
    """The type the backend knows the file to have (a SQL table's schema document is JSON), if any."""


@dataclass(frozen=True, slots=True)
class Blob:
    """A file's bytes as read, with what the backend said about them."""

    data: bytes
    mime_type: str | None = None
    """The type the backend declared (an HTTP Content-Type), if any."""
    version: str | None = None


class SourceError(Exception):
    """A backend failure. Its message is for the server log only, never for a client."""


class SourceNotFound(SourceError):
    """No such file in the source (or the path was refused as unsafe)."""


class SourceTooLarge(SourceError):
    """The file is bigger than the read limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


@runtime_checkable
class Source(Protocol):
    """A place files come from: list them, stat one, read one."""

    id: str
    url_paths: bool
    """True when paths become URL paths and queries (HTTP): template values are percent-encoded into them."""

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        """Every file whose relative path matches the glob `pattern` and none of `exclude` (wildcards match
        hidden names only when `hidden`)."""
        ...

    async def stat(self, path: str) -> FileInfo:
        """Size and modification time of one file; SourceNotFound if absent."""
        ...

    async def read(self, path: str, max_bytes: int) -> Blob:
        """The whole file; SourceTooLarge if it holds more than `max_bytes`."""
        ...

    def describe(self) -> str:
        """A short label for logs (no credentials)."""
        ...
