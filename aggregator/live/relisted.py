"""One source listed again (a poll of a remote source, an upstream's list_changed) and applied to the catalog in
proportion to what changed.

The listing is compared with what the catalog lists of the source: files that came, changed (size, modification time)
or went are applied with catalog_delta.apply_files (an upstream's own resources and templates with
catalog_published.apply_upstream), and the rest of the catalog is not listed or built again. What it cannot apply so
(a collision, a manifest changed meanwhile, a source that cannot be listed now) it says with FullRelist.

Comparing walks the whole listing, so it runs in a worker thread (`off_loop`), outside the swap lock, against the
catalog served then; under the lock it is compared again only if another change was swapped in meanwhile, and the
next catalog is built in a worker thread too (a listing that came back whole changes every entry). The loop serves
the old catalog until the swap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import anyio.to_thread

from aggregator import heap
from aggregator.catalog import Catalog, Entry
from aggregator.catalog_delta import Delta, NeedsRelist
from aggregator.catalog_published import PublishedChanges, apply_upstream, published_changes
from aggregator.compiler import collection_key
from aggregator.live.delta import FullRelist, files_applied, swap_delta
from aggregator.manifest.model import CollectionSpec, Manifest
from aggregator.service import ResourceService
from aggregator.snapshot import Snapshot
from aggregator.sources import FileInfo, SourceError
from aggregator.sources.base import Published
from aggregator.tracing import span

__all__ = ["listing_changes", "relist_source", "relist_upstream"]

T = TypeVar("T")
logger = logging.getLogger("aggregator.catalog")  # where compile_catalog says what it keeps of a source that is down


async def relist_source(service: ResourceService, source: str) -> Delta | None:
    """List the collections of `source` again and swap in the catalog with what came, changed or went; the Delta,
    or None if nothing listed changed (no swap). SourceError if it cannot be listed now (the catalog keeps its
    listing); FullRelist, or ManifestError when a new URI collides, if the whole catalog must be listed again."""
    async with heap.relisting(listed_entries(service.snapshot, source)):  # settled once its listing is gone
        return await _relist_source(service, source)


async def _relist_source(service: ResourceService, source: str) -> Delta | None:
    snapshot = service.snapshot
    src = snapshot.sources.get(source)
    if src is None:
        raise FullRelist(f"source {source!r} is not in the current manifest")
    if src.publishes:
        raise FullRelist(f"source {source!r} publishes its own resources")
    specs = {collection_key(c): c for c in snapshot.manifest.collections if c.source == source}
    listed: dict[CollectionSpec, list[FileInfo]] = {}
    for key, spec in specs.items():  # outside the swap lock: a big listing must not hold up other changes
        with span("aggregator.source.list", source_id=source, source_kind=snapshot.manifest.sources[source].kind,
                  glob=spec.glob) as traced:
            listed[key] = await src.list(spec.glob, spec.exclude, hidden=spec.hidden)
            traced.set(files=len(listed[key]))
    compared = service.snapshot.catalog
    changes = await off_loop(listing_changes, compared, listed)  # outside the swap lock too
    async with service.swapping():
        now = service.snapshot
        if now.sources.get(source) is not src or {collection_key(c) for c in now.manifest.collections
                                                  if c.source == source} != specs.keys():
            raise FullRelist(f"the collections of source {source!r} changed while it was listed")
        if now.catalog is not compared:  # a change swapped in meanwhile: compared again with what it made
            changes = await off_loop(listing_changes, now.catalog, listed)
        upserted, removed = changes
        if not (upserted or removed):
            return None
        return swap_delta(service, await off_loop(files_applied, now.catalog, now.manifest, source, upserted,
                                                  removed))


async def relist_upstream(service: ResourceService, source: str) -> Delta | None:
    """List a source that tells of its own changes (an MCP upstream) again: its collections' files, the files
    resources name in it, and what it publishes; swap in the catalog with what came, changed or went. The Delta, or
    None if nothing listed changed (no swap). A source that cannot be listed now keeps what it listed while that is
    younger than its staleIfError, else lists nothing, as compile_catalog decides. FullRelist if the manifest
    changed meanwhile (or the source's parts fall on both sides of staleIfError); ManifestError when a new URI or
    template collides."""
    async with heap.relisting(listed_entries(service.snapshot, source)):  # settled once its listing is gone
        return await _relist_upstream(service, source)


async def _relist_upstream(service: ResourceService, source: str) -> Delta | None:
    snapshot = service.snapshot
    manifest, src = snapshot.manifest, snapshot.sources.get(source)
    if src is None:
        raise FullRelist(f"source {source!r} is not in the current manifest")
    specs = {collection_key(c): c for c in manifest.collections if c.source == source}
    named = {r.path for r in manifest.resources if r.source == source and r.path is not None}
    listed: dict[CollectionSpec, list[FileInfo]] = {}
    stated: dict[str, FileInfo | None] = dict.fromkeys(named)  # not found, unless stat'ed below
    down: SourceError | None = None
    try:  # outside the swap lock: a listing must not hold up other changes
        for key, spec in specs.items():
            with span("aggregator.source.list", source_id=source, source_kind=manifest.sources[source].kind,
                      glob=spec.glob) as traced:
                listed[key] = await src.list(spec.glob, spec.exclude, hidden=spec.hidden)
                traced.set(files=len(listed[key]))
        published = await src.published() if src.publishes else None
        found, _ = await src.stat_many(named) if named else ([], set())
        stated.update((info.path, info) for info in found)
    except SourceError as exc:
        down = exc
    compared, changes = service.snapshot.catalog, None
    if down is None:  # outside the swap lock too
        changes = await off_loop(_upstream_changes, compared, source, listed, published)
    async with service.swapping():
        now = service.snapshot
        if now.manifest is not manifest or now.sources.get(source) is not src:
            raise FullRelist(f"the manifest changed while source {source!r} was listed")
        catalog, at = now.catalog, time.monotonic()
        kept = False
        if down is not None:
            if not src.pushes_changes:  # compile_catalog reports it (or skips it, if optional)
                raise FullRelist(f"source {source!r} cannot be listed now ({down})")
            kept = _kept_while_down(catalog, manifest, source, specs, down, at)
            listed = {} if kept else dict.fromkeys(specs, [])
            published = catalog.published.get(source) if kept else None
        if changes is None or catalog is not compared:  # a change swapped in meanwhile: compared with what it made
            changes = await off_loop(_upstream_changes, catalog, source, listed, published)
        upserted, removed, changed = changes
        try:
            delta = await off_loop(apply_upstream, catalog, manifest, source, upserted, removed, stated, published,
                                   at, changed)
        except NeedsRelist as exc:
            raise FullRelist(str(exc)) from None
        if kept:  # what was kept counts its age from when it was listed, as compile_catalog's does
            delta.catalog.listed_at.update((key, catalog.listed_at[key]) for key in specs)
            if source in catalog.published_at:
                delta.catalog.published_at[source] = catalog.published_at[source]
        if not (delta.added or delta.removed or delta.updated or delta.listing_changed
                or delta.catalog.templates is not catalog.templates):
            if down is None:  # the catalog served stays, now known current (staleIfError counts from here)
                catalog.listed_at.update(dict.fromkeys(listed, at))
                if published is not None:
                    catalog.published[source] = published
                    catalog.published_at[source] = at
            return None
        service.swap_catalog(delta.catalog, delta.gone, delta.listing,
                             delta.added | delta.removed | delta.updated)
        return delta


def listed_entries(snapshot: Snapshot, source: str) -> int:
    """How many entries the catalog lists of `source` (its collections' and what it publishes): what its next
    listing is expected to hold. O(collections)."""
    catalog = snapshot.catalog
    published = catalog.published.get(source)
    return sum(len(catalog.collections.get(collection_key(c), ())) for c in snapshot.manifest.collections
               if c.source == source) + (len(published.resources) if published is not None else 0)


def _kept_while_down(catalog: Catalog, manifest: Manifest, source: str, specs: Collection[CollectionSpec],
                     down: SourceError, at: float) -> bool:
    """Whether what `catalog` lists of `source`, which cannot be listed now, is kept (younger than its
    staleIfError) rather than dropped, as compile_catalog decides per collection and for what it publishes (said
    in the log as compile_catalog says it); FullRelist when its parts fall on both sides."""
    spec = manifest.sources[source]
    listed_at = [catalog.listed_at.get(key) for key in specs]
    if source in catalog.published:
        listed_at.append(catalog.published_at.get(source))
    young = {when is not None and at - when <= spec.stale_if_error for when in listed_at}
    if len(young) > 1:
        raise FullRelist(f"source {source!r} cannot be listed now ({down}), and only part of its listing is kept")
    kept = young != {False}
    logger.warning("%s: %s: source %r cannot be listed (%s); %s", spec.where, spec.key, source, down,
                   "serving its last listing (staleIfError)" if kept else "its listing is empty until it is back")
    return kept


async def off_loop(func: Callable[..., T], *args: Any) -> T:
    """`func(*args)` in a worker thread: a whole listing compared or applied (a million entries: seconds) must
    not stall the event loop. What it reads of a catalog is immutable but for caches set whole, so the loop
    serves the same catalog meanwhile; a catalog it builds is not served until swapped in. Given up (left to
    finish) if the caller is cancelled: it changes nothing."""
    return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True)


def _upstream_changes(catalog: Catalog, source: str, listed: Mapping[CollectionSpec, Sequence[FileInfo]],
                      published: Published | None) -> tuple[list[FileInfo], set[str], PublishedChanges]:
    """What `apply_upstream` takes of `catalog` for what `source` lists (`listed`) and publishes now."""
    upserted, removed = listing_changes(catalog, listed)
    return upserted, removed, published_changes(catalog, source, published)


def listing_changes(catalog: Catalog, listed: Mapping[CollectionSpec, Sequence[FileInfo]]
                    ) -> tuple[list[FileInfo], set[str]]:
    """What `apply_files` takes for collections (by `collection_key`) listed again: the files that are new or whose
    entry would differ (size, modification time, the type the backend gives), and the paths no longer listed."""
    upserted: dict[str, FileInfo] = {}
    removed: set[str] = set()
    for key, files in listed.items():
        before, found = catalog.paths_of(key), 0
        for info in files:
            old = before.get(info.path)
            if old is None:
                upserted[info.path] = info
            else:
                found += 1
                if _differs(old, info):
                    upserted[info.path] = info
        if found < len(before):  # every listed entry was found again: none went
            removed |= before.keys() - {info.path for info in files}
    return list(upserted.values()), removed - upserted.keys()


def _differs(entry: Entry, info: FileInfo) -> bool:
    """Whether the entry listed for a file would be built otherwise from `info` (what a listing can tell)."""
    if entry.mtime != info.mtime or (entry.convert is None and entry.size != info.size):
        return True
    return (info.mime_type is not None and entry.convert is None and entry.display.mime_type is None
            and entry.mime_type != info.mime_type)
