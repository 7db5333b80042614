"""Giving freed heap memory back to the system after a big transient allocation.

CPython frees the objects of a parsed 60 MB message, but glibc's malloc keeps the pages in its arenas, so the
process's RSS stays at its peak for as long as it lives. `malloc_trim(0)` returns what is free at the top of each
arena and the free pages inside it: after a 1.45M-entry upstream listing, RSS falls back to what the kept entries
cost. Elsewhere (musl, macOS) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any

__all__ = ["BIG_LISTING", "trim"]

logger = logging.getLogger("aggregator.heap")

BIG_LISTING = 100_000
"""Entries parsed in one listing past which its transient memory is worth a trim (a trim costs a few ms)."""

_libc: Any = None
_looked = False


def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where there is none (looked up once)."""
    global _libc, _looked
    if not _looked:
        _looked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = libc.malloc_trim
            _libc.argtypes, _libc.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):  # not glibc
            _libc = None
    return _libc


def trim() -> bool:
    """Return free heap memory to the system (glibc); False where that cannot be done."""
    fn = _malloc_trim()
    if fn is None:
        return False
    try:
        fn(0)
    except OSError:  # pragma: no cover - a libc that refuses the call
        logger.debug("malloc_trim failed", exc_info=True)
        return False
    return True
