"""Apply files that came, changed or went to the catalog in proportion to the change (catalog_delta), when it can.

What it cannot apply (a folder that came or went, a collision, a collection never listed) it says with FullRelist:
the caller lists the catalog again as before.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from aggregator.catalog_delta import Delta, NeedsRelist, apply_files, stat_paths
from aggregator.compiler import collection_key
from aggregator.service import ResourceService
from aggregator.sources import FileInfo

__all__ = ["FullRelist", "apply_changed_files", "swap_applied"]


class FullRelist(Exception):
    """The change cannot be applied incrementally (the message says why): list the catalog again."""


async def apply_changed_files(service: ResourceService, source: str, paths: set[str]) -> Delta | None:
    """Stat `paths` of `source` and swap in the catalog with them applied; the Delta, or None if nothing listed
    changed (no swap). FullRelist, or ManifestError when a new URI collides, if the change needs a full relist
    (the catalog is unchanged then)."""
    async with service.swapping():
        snapshot = service.snapshot
        src = snapshot.sources.get(source)
        if src is None:
            raise FullRelist(f"source {source!r} is not in the current manifest")
        found, missing = await stat_paths(src, paths)
        _check_files_only(service, source, missing, src.watch_root())
        return swap_applied(service, source, found, missing)


def swap_applied(service: ResourceService, source: str, upserted: Iterable[FileInfo], removed: Collection[str]
                 ) -> Delta | None:
    """Apply files of `source` (see `apply_files`) to the current catalog and swap the result in, under
    `service.swapping()`; the Delta, or None if nothing listed changed. FullRelist or ManifestError otherwise."""
    snapshot = service.snapshot
    try:
        delta = apply_files(snapshot.catalog, snapshot.manifest, source, upserted, removed)
    except NeedsRelist as exc:
        raise FullRelist(str(exc)) from None
    if not (delta.added or delta.removed or delta.updated):
        return None
    service.swap_catalog(delta.catalog, delta.gone)
    return delta


def _check_files_only(service: ResourceService, source: str, missing: set[str], root: str | None) -> None:
    """FullRelist if a path that is not a file now is a folder (came) or held listed files (went): a watcher
    names the folder, not every file under it."""
    if not missing:
        return
    listed = [service.catalog.paths_of(collection_key(spec)) for spec in service.manifest.collections
              if spec.source == source]
    for path in missing:
        if root is not None and os.path.isdir(os.path.join(root, path)):
            raise FullRelist(f"folder {path!r} came")
        if any(path in paths for paths in listed):
            continue  # a listed file that went
        # Not a listed file: a scan of the listed paths (string prefixes only) tells a folder that went.
        prefix = path + "/"
        if any(p.startswith(prefix) for paths in listed for p in paths):
            raise FullRelist(f"folder {path!r} went")
