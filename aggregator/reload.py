"""A reload: the manifest loaded again and the next snapshot built from it, keeping what did not change.

Unchanged sources are kept (their connections, cache epoch and cached content with them); collections over
watched or self-reporting sources are reused, and so are other kept sources' collections listed less than the
source's `ttl` ago. A guarded reload refuses what looks like a half-written save (`SuspiciousReload`). Nothing
here swaps: `ResourceService` swaps the result in.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import anyio.to_thread

from aggregator.catalog import Catalog
from aggregator.compiler import compile_catalog
from aggregator.entry_spans import Differing
from aggregator.listing_change import ListingChange
from aggregator.manifest import load_manifest
from aggregator.manifest.model import Manifest, ManifestError, ManifestIssue, SourceSpec
from aggregator.recompile import recompile
from aggregator.rows_change import catalog_change
from aggregator.snapshot import Snapshot, build_snapshot, close_sources
from aggregator.sources import Source, SourceError, open_source
from aggregator.sources.unopened import Unopened

__all__ = ["Reloaded", "SuspiciousReload", "next_snapshot", "open_sources"]


class SuspiciousReload(Exception):
    """A guarded reload would remove every resource of sources the new manifest still declares, or empty the
    catalog: what a half-written save looks like. Nothing was swapped."""

    def __init__(self, sources: tuple[str, ...]) -> None:
        self.sources = sources
        """The still-declared sources left without a resource; empty when the catalog as a whole would be empty."""
        what = f"source(s) {', '.join(map(repr, sources))}" if sources else "the catalog"
        super().__init__(f"the reload would remove every resource of {what}")


@dataclass(frozen=True, slots=True)
class Reloaded:
    """The next snapshot, and what it changes against the one it replaces."""

    previous: Snapshot
    """The snapshot it was built on and replaces."""
    snapshot: Snapshot
    replaced: frozenset[str]
    """Ids of the old snapshot's sources not kept (closed once no read holds them)."""
    content_changed: set[str]
    """URIs listed before and after whose content now comes from elsewhere."""
    listing: ListingChange
    """Whose listings changed (when the catalog was compiled whole, the two catalogs compared in one walk)."""
    differing: Differing
    """Where the two catalogs' entries may differ (the console's history compares only these)."""
    gone: frozenset[tuple[str, str]] | None = None
    """Files no longer listed when the catalog was built on the old one; None when it was compiled whole (the swap
    compares the two catalogs' files)."""


def open_sources(manifest: Manifest, skip: Mapping[str, Source] = {}) -> dict[str, Source]:
    """Open every declared source but those in `skip`; ManifestError locating each one that cannot be opened,
    unless it is `optional` (then an `Unopened` stands in for it, and the rest serves)."""
    sources: dict[str, Source] = {}
    issues: list[ManifestIssue] = []
    for spec in manifest.sources.values():
        if spec.id in skip:
            continue
        try:
            sources[spec.id] = open_source(spec)
        except SourceError as exc:
            if spec.optional:
                sources[spec.id] = Unopened.instead_of(spec, exc)
                continue
            issues.append(ManifestIssue(spec.where.file, spec.where.line, spec.where.col, f"{spec.key}.url", str(exc)))
    if issues:
        raise ManifestError(issues)
    return sources


async def next_snapshot(old: Snapshot, watched: Iterable[str], guard: bool) -> Reloaded:
    """Load `old`'s manifest file again and build the snapshot to replace `old`; ManifestError (located) if it is
    bad, and with `guard` SuspiciousReload if it would leave a source it still declares without resources (or the
    catalog empty). Sources it opened are closed again when it raises."""
    # Off the event loop: includes may be URLs, and a big manifest takes seconds to check. Read with the
    # running manifest's cap: the new file's own setting is not known before it is read.
    manifest = await anyio.to_thread.run_sync(functools.partial(
        load_manifest, old.manifest.path, max_bytes=old.manifest.server.max_manifest_bytes),
        abandon_on_cancel=True)  # a shutdown does not wait for a slow include
    kept = {sid: src for sid, src in old.sources.items() if not isinstance(src, Unopened)  # tried again
            and sid in manifest.sources and _same_source(old.manifest.sources[sid], manifest.sources[sid])}
    fresh = open_sources(manifest, skip=kept)
    sources = {**kept, **fresh}
    # Watched folders and sources that tell of their own changes keep their listings current themselves.
    pushing = {sid for sid, src in kept.items() if src.pushes_changes}
    still, now, before = (set(watched) | pushing) & set(kept), time.monotonic(), old.catalog
    reuse = {key: entries for key, entries in before.collections.items() if key.source in kept and (
        key.source in still or now - before.listed_at.get(key, 0.0) < old.limits[key.source].ttl)}
    try:
        # Built on the old catalog in proportion to what changed, else (what only a full compile reports) whole.
        recompiled = await recompile(before, old.manifest, manifest, sources, set(kept), still,
                                     {sid: old.limits[sid].ttl for sid in kept}, reuse, before.generation + 1)
        catalog = recompiled.catalog if recompiled is not None else await compile_catalog(
            manifest, sources, before.generation + 1, reuse, before.listed_at, before)
    except BaseException:
        await close_sources(fresh.values())
        raise
    emptied = _emptied_sources(before, old.manifest, catalog, manifest) if guard else None
    if emptied is not None:
        await close_sources(fresh.values())
        raise SuspiciousReload(emptied)
    epochs = {**{sid: old.epochs[sid] for sid in kept}, **{sid: catalog.generation for sid in fresh}}
    replaced = frozenset(old.sources) - set(kept)
    snapshot = build_snapshot(manifest, catalog, sources, epochs)
    if recompiled is not None:
        return Reloaded(old, snapshot, replaced, set(recompiled.content_changed), recompiled.listing,
                        recompiled.differing, recompiled.gone)
    compared = catalog_change(before, catalog, replaced)  # one walk of both: O(catalog), as the compile was
    return Reloaded(old, snapshot, replaced, compared.content_changed, compared.listing, compared.differing)


def _same_source(a: SourceSpec, b: SourceSpec) -> bool:
    """Equal but for where the manifest wrote them."""
    return replace(a, where=b.where, key=b.key) == b


def _emptied_sources(old: Catalog, old_manifest: Manifest, new: Catalog, manifest: Manifest
                     ) -> tuple[str, ...] | None:
    """Sources still declared in `manifest` that have resources in `old` (compiled from `old_manifest`) and none
    in `new` (() when only the catalog as a whole would become empty); None when the new catalog looks like a
    deliberate edit."""
    before, after = _serving(old, old_manifest), _serving(new, manifest)
    emptied = tuple(sorted(sid for sid in before - after if sid in manifest.sources))
    if emptied:
        return emptied
    return () if len(old) and not len(new) else None


def _serving(catalog: Catalog, manifest: Manifest) -> set[str]:
    """Sources with at least one entry in `catalog` (compiled from `manifest`), asked of what produced the entries
    (collections, resources, upstreams' lists) rather than of every entry."""
    serving = {r.source for r in manifest.resources if r.source is not None}
    serving |= {key.source for key, entries in catalog.collections.items() if entries}
    return serving | {sid for sid, offered in catalog.published.items() if offered.resources}

