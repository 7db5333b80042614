"""Why a document could not be converted, said so a client can be told (no path, no library internals)."""

from __future__ import annotations

__all__ = ["ConversionFailed", "OverLimit", "Unreadable"]


class ConversionFailed(Exception):
    """The document cannot be converted as it is (encrypted, corrupt, not what its name says): asking again gives
    the same answer until the file changes. `why` is client-safe."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class OverLimit(ConversionFailed):
    """The document passes one of the manifest's `convert` limits (`key`, as the manifest spells it)."""

    def __init__(self, why: str, key: str) -> None:
        super().__init__(f"{why} (limit convert.{key})")
        self.key = key


class Unreadable(ConversionFailed):
    """A parser gave up on the document: it is corrupt, or an allocation failed under convert.maxMemory and the
    parser reported it as a broken file (zipfile, lxml and openpyxl turn a MemoryError into errors of their own).
    The pool tells the two apart by converting it once more in a fresh worker with more memory (pool.py)."""
