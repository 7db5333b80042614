"""Apply files that came, changed or went to the catalog in proportion to the change (catalog_delta), when it can.

Folders moved in or out are applied in place too: only the moved folder is walked, and what was listed under a
folder that went is found in the catalog's URI order. What it cannot apply (a collision, a collection never listed,
a source that failed) it says with FullRelist: the caller lists the catalog again as before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from aggregator.catalog import Catalog
from aggregator.catalog_delta import Delta, NeedsRelist, apply_files, changed_files
from aggregator.manifest.model import Manifest
from aggregator.service import ResourceService
from aggregator.sources import FileInfo, SourceError

__all__ = ["FullRelist", "apply_changed_files", "files_applied", "swap_applied", "swap_delta"]


class FullRelist(Exception):
    """The change cannot be applied incrementally (the message says why): list the catalog again."""


async def apply_changed_files(service: ResourceService, source: str, paths: set[str],
                              relooked: Collection[str] = ()) -> Delta | None:
    """Stat `paths` of `source` (walking those that are folders now; `relooked`: as `changed_files` says) and swap
    in the catalog with them applied; the
    Delta, or None if nothing listed changed (no swap). FullRelist, or ManifestError when a new URI collides, if the
    change needs a full relist (the catalog is unchanged then)."""
    async with service.swapping():
        snapshot = service.snapshot
        src = snapshot.sources.get(source)
        if src is None:
            raise FullRelist(f"source {source!r} is not in the current manifest")
        try:
            found, gone = await changed_files(snapshot.catalog, snapshot.manifest, source, src, paths, relooked)
        except SourceError as exc:  # the batch as a whole failed (a timeout): a listing says what is there
            raise FullRelist(f"looking at the changed paths failed: {exc}") from None
        return swap_applied(service, source, found, gone)


def swap_applied(service: ResourceService, source: str, upserted: Iterable[FileInfo], removed: Collection[str]
                 ) -> Delta | None:
    """Apply files of `source` (see `apply_files`) to the current catalog and swap the result in, under
    `service.swapping()`; the Delta, or None if nothing listed changed. FullRelist or ManifestError otherwise."""
    snapshot = service.snapshot
    return swap_delta(service, files_applied(snapshot.catalog, snapshot.manifest, source, upserted, removed))


def files_applied(catalog: Catalog, manifest: Manifest, source: str, upserted: Iterable[FileInfo],
                  removed: Collection[str]) -> Delta | None:
    """`apply_files` to `catalog`; None if nothing listed changed, FullRelist instead of NeedsRelist. Reads the
    catalog only (safe in a worker thread while the loop serves it)."""
    try:
        delta = apply_files(catalog, manifest, source, upserted, removed)
    except NeedsRelist as exc:
        raise FullRelist(str(exc)) from None
    return delta if delta.added or delta.removed or delta.updated else None


def swap_delta(service: ResourceService, delta: Delta | None) -> Delta | None:
    """Swap in `delta`'s catalog (built on the current one, under `service.swapping()`), unless None."""
    if delta is not None:
        service.swap_catalog(delta.catalog, delta.gone, delta.listing, delta.added | delta.removed | delta.updated)
    return delta
