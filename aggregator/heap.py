"""The process's heap after big transient work: freed memory given back to the system, a catalog built whole moved
out of the cyclic collector's reach.

CPython frees the objects of a parsed 60 MB message, but glibc's malloc keeps the pages in its arenas, so the
process's RSS stays at its peak for as long as it lives. `trim` (`malloc_trim(0)`) returns what is free at the top of
each arena and the free pages inside it: after a 1.45M-entry upstream listing, RSS falls back to what the kept
entries cost. Elsewhere (musl, macOS) it is a no-op.

The collector's full pass walks every tracked container, and a catalog's row lists hold a reference per row: at
1,000,000 rows a pass costs about 200 ms with the event loop stopped, and CPython runs one whenever the objects
that survived since the last outgrow a quarter of the old ones. Rows are never part of a reference cycle (a
replaced catalog is freed by reference counting), so after a catalog is built whole and swapped in, `settle`
freezes everything alive (`gc.freeze`): full passes then walk only what came after, a catalog's incremental
successors included (they share the frozen blocks and add a few of their own).

A relist of a big source (a poll, an upstream's list_changed) creates as many objects as the source lists, in a
worker thread, and the collector's full passes, which come ever sooner as those pile up, walk all of them with every
thread stopped (the event loop too: 180-640 ms a pass at a million, relist_stall). `relisting` pauses collection while
such a relist runs, and once it is over (however it ends) settles: what it left is collected, everything alive
frozen (the next catalog's own objects with it), free memory given back (the listing and the catalog replaced).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread

__all__ = ["BIG_LISTING", "FREEZE_AT", "relisting", "settle", "trim"]

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


FREEZE_AT = 50_000
"""Catalog entries from which a catalog built whole is frozen; below, a full pass costs a few milliseconds."""


def settle(entries: int) -> bool:
    """After a catalog of `entries` built whole was swapped in, if it is big enough to matter: collect what the
    build left (cyclic garbage frozen would never be collected), then freeze every object alive. True if it froze."""
    if entries < FREEZE_AT:
        return False
    gc.collect()
    gc.freeze()
    return True


_relists = 0
"""Big relists running (they may overlap: one source's poll while another upstream relists)."""
_resume = False
"""Whether automatic collection was on when the first of them began (start-up pauses it too: `startup`)."""


@asynccontextmanager
async def relisting(entries: int) -> AsyncIterator[None]:
    """Around a relist of a source that listed `entries`: from `FREEZE_AT` on, no automatic collection meanwhile,
    and once the last such relist is over, however it ends: the heap settled (`settle`), automatic collection back
    as it was, then free memory trimmed in a worker thread. Nothing at all for a smaller one."""
    global _relists, _resume
    if entries < FREEZE_AT:
        yield
        return
    if _relists == 0:
        _resume = gc.isenabled()
        gc.disable()
    _relists += 1
    try:
        yield
    finally:
        _relists -= 1
        if _relists == 0:
            try:
                # Its listing went with the relist's frames: a pass over what is not frozen yet (the catalog built
                # on a frozen one adds a few blocks), then the next catalog is out of the collector's way.
                settle(entries)
            finally:
                if _resume:
                    gc.enable()
            # Giving back what a million-entry relist freed takes malloc_trim 100 ms and more (ctypes lets the
            # loop run meanwhile); bounded, so a cancelled relist waits for it too.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(trim)
