"""The catalog and the cyclic garbage collector: a catalog built whole is moved out of the collector's reach.

The collector's full pass walks every tracked container, and a catalog's row lists hold a reference per row: at
1,000,000 rows a pass costs about 200 ms with the event loop stopped, and CPython runs one whenever the objects
that survived since the last outgrow a quarter of the old ones. `serve` freezes what start-up made (`gc.freeze`:
the SDK's modules, the first catalog); a catalog built whole later (a full relist, a reload compiled whole) would
be walked again by every full pass, so once it is swapped in the garbage is collected and everything alive frozen
again. Rows are never part of a reference cycle (a replaced catalog is freed by reference counting), and a
catalog's incremental successors share its frozen blocks and add a few of their own.
"""

from __future__ import annotations

import gc

__all__ = ["FREEZE_AT", "settle"]

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
