"""The stand-in for a source marked `optional: true` that could not be opened (a SQLite file that is not there, a
folder that is missing, a driver not installed): every call fails with the reason it could not open, so its
collections list nothing, its reads are unavailable and the rest of the manifest serves. A reload opens it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import NoReturn

from aggregator.manifest.model import SourceSpec
from aggregator.sources.base import Blob, FileInfo, Source, SourceError

__all__ = ["SKIPPED", "Unopened"]

logger = logging.getLogger("aggregator.sources")

SKIPPED = "skipped (optional: true)"
"""How the log and validate say that an optional source serves nothing while the others serve."""


class Unopened(Source):
    """An optional source that could not be opened, failing every call with `reason`."""

    def __init__(self, id: str, reason: str) -> None:
        self.id = id
        self.reason = reason

    @classmethod
    def instead_of(cls, spec: SourceSpec, error: SourceError) -> Unopened:
        """The stand-in for `spec`, which failed to open with `error`; logged once, located."""
        logger.warning("%s: %s: cannot open source %r: %s; " + SKIPPED + ": serving without it until a reload "
                       "opens it", spec.where, spec.key, spec.id, error)
        return cls(spec.id, str(error))

    def describe(self) -> str:
        return f"source {self.id!r}"

    def _fail(self) -> NoReturn:
        raise SourceError(self.reason)

    async def probe(self) -> None:
        self._fail()

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        self._fail()

    async def stat(self, path: str) -> FileInfo:
        self._fail()

    async def read(self, path: str, max_bytes: int) -> Blob:
        self._fail()

    async def query(self, sql: str, params: Mapping[str, str | None], fmt: str, max_bytes: int) -> Blob:
        self._fail()
