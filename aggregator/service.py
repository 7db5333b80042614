"""The running aggregator: the current snapshot (manifest, catalog, sources), swapped whole by reloads, and what
changes to content touch.

This is what protocol handlers call; it knows nothing of MCP. A read leases the current snapshot and hands it to
`reads.reader.Reader`, which finishes on it (docs/design.md, "The read path"); a reload builds the next snapshot
(`reload.py`) and swaps it in here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio

from aggregator import heap
from aggregator.cache import ContentCache
from aggregator.cache_keys import CacheKey, Forget
from aggregator.catalog import Catalog, Entry, FileTarget, Page, QueryTarget, RowsPage, Target, TemplateEntry
from aggregator.catalog_delta import entries_of_files, unlisted_files
from aggregator.compiler import compile_catalog
from aggregator.content import Content
from aggregator.documents.pool import DocumentPool
from aggregator.documents.stored import stored_conversions
from aggregator.listing_change import ListingChange
from aggregator.manifest import load_manifest
from aggregator.manifest.model import Manifest
from aggregator.reads.reader import Reader, Served
from aggregator.reads.relayed import MAX_PLANNED_URI, MAX_PLANS, RelayPlan, relay_plan
from aggregator.reload import Reloaded, SuspiciousReload, next_snapshot, open_sources
from aggregator.rows_change import catalog_change
from aggregator.snapshot import Lease, Leases, Snapshot, build_snapshot, close_sources
from aggregator.sources import Source
from aggregator.tracing import span

if TYPE_CHECKING:  # the cluster's modules are imported only with `server.cluster`
    from aggregator.cluster.shared_cache import SharedContent

__all__ = ["ResourceService", "Served", "ServedPage", "SuspiciousReload", "open_sources"]


P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class ServedPage(Generic[P]):
    """A listing page with its ttl and cache scope, from the snapshot it was paged from."""

    page: P
    ttl: float
    private: bool


class ResourceService:
    """Serves one manifest: listing pages, template pages and reads, each from one snapshot."""

    def __init__(self, manifest: Manifest, sources: Mapping[str, Source], catalog: Catalog,
                 cache: ContentCache[CacheKey, Content] | None = None) -> None:
        self._snapshot = build_snapshot(manifest, catalog, sources, {sid: catalog.generation for sid in sources})
        self._leases = Leases()
        self._plans = _Plans(self._snapshot)
        self._swapping = anyio.Lock()
        self._reader = Reader(cache if cache is not None else ContentCache(manifest.defaults.cache_bytes))
        self._reader.documents.stored = stored_conversions(manifest.server.documents)  # read at start only
        self.change_listeners: list[Callable[[set[tuple[str, str]] | None], None]] = []
        """Told when content changes: with the (source, path) files just invalidated, or None when a new catalog was
        swapped in (the search index follows both)."""
        self.delta_listeners: list[Callable[[int, frozenset[str]], None]] = []
        """Told first when a catalog built on the current one by catalog_delta is swapped in: its generation and the
        URIs whose entries came, went or changed in it (what follows the catalog need not compare all of it)."""
        self.swap_listeners: list[Callable[[ListingChange], None]] = []
        """Told of every catalog swapped in (reload, relisting, change applied in place), with whose listings and
        console detail it changed, whether or not list_changed is sent for it (the console's streams add them up)."""

    @classmethod
    async def open(cls, manifest_path: str | Path) -> ResourceService:
        """Load, validate and compile a manifest; ManifestError with every located problem."""
        manifest = load_manifest(manifest_path)
        sources = open_sources(manifest)
        try:
            catalog = await compile_catalog(manifest, sources)
        except BaseException:
            await close_sources(sources.values())
            raise
        return cls(manifest, sources, catalog)

    async def aclose(self) -> None:
        """Release what sources hold open (HTTP connection pools), those of the current snapshot and those a
        reload dropped that reads still held."""
        await self._leases.close_all()
        await close_sources(self._snapshot.sources.values())
        await self._reader.documents.aclose()

    # --- what reads share (kept by the reader) ------------------------------------------------------------

    @property
    def cache(self) -> ContentCache[CacheKey, Content]:
        """This replica's content cache, shared by every read."""
        return self._reader.caches.cache

    @property
    def shared(self) -> SharedContent | None:
        """The cluster's shared content cache (server.cluster), under this replica's own cache; None: off."""
        return self._reader.caches.shared

    @shared.setter
    def shared(self, shared: SharedContent | None) -> None:
        self._reader.caches.shared = shared

    @property
    def documents(self) -> DocumentPool:
        """The worker processes of `convert:` reads (their counts for /metrics)."""
        return self._reader.documents

    @property
    def source_errors(self) -> Counter[str]:
        """Failed backend calls per source id, since start (for /metrics)."""
        return self._reader.calls.errors

    @property
    def last_source_error(self) -> dict[str, tuple[float, str]]:
        """Per source id, when (time.time()) and why its last backend call failed (operator detail: the console)."""
        return self._reader.calls.last_error

    @property
    def last_source_success(self) -> dict[str, float]:
        """Per source id, when (time.time()) its last backend call succeeded."""
        return self._reader.calls.last_success

    # --- the current snapshot --------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """What is being served now. Code that awaits between two uses should hold one (`lease()`)."""
        return self._snapshot

    def lease(self) -> Lease:
        """`async with service.lease() as snapshot:` the current snapshot, whose sources stay open until the
        block ends even if a reload drops them meanwhile."""
        return self._leases.lease(self._snapshot)

    @property
    def manifest(self) -> Manifest:
        return self._snapshot.manifest

    @property
    def catalog(self) -> Catalog:
        return self._snapshot.catalog

    @property
    def sources(self) -> Mapping[str, Source]:
        return self._snapshot.sources

    @property
    def page_size(self) -> int:
        return self._snapshot.manifest.server.page_size

    @property
    def default_ttl(self) -> float:
        return self._snapshot.manifest.defaults.ttl

    # --- reloads -----------------------------------------------------------------------------------------

    async def reload(self, watched: Iterable[str] = (), *, guard: bool = False) -> Reloaded:
        """Load the manifest again and swap in its snapshot; returns it with what it changed (whose listings, URIs
        whose content, where the entries may differ).

        ManifestError (located) if the new manifest is bad, and with `guard` SuspiciousReload if it would leave a
        source it still declares without resources (or the catalog empty): the current snapshot keeps serving.
        Unchanged sources are kept (their connections and cached content with them); collections over `watched`
        sources that did not change are reused rather than listed again (a watcher keeps them current), and so are
        collections over other kept sources listed less than the source's `ttl` ago (source listings are cached with
        the source's ttl). Dropped sources close once the reads still holding them are done.
        """
        with span("aggregator.reload", guard=guard) as traced:
            try:
                async with self._swapping:  # one reload or relisting at a time: each builds on the one it replaces
                    reloaded = await self._reload(watched, guard)
                    traced.set(outcome="ok", generation=self.catalog.generation, resources=len(self.catalog),
                               listing_changed=reloaded.listing.listing_changed)
            except SuspiciousReload:
                traced.set(outcome="held back")
                raise
            except Exception:
                traced.set(outcome="failed")
                raise
            return reloaded

    async def _reload(self, watched: Iterable[str], guard: bool) -> Reloaded:
        old = self._snapshot
        reloaded = await next_snapshot(old, watched, guard)
        self._swap(reloaded.snapshot, reloaded.replaced, reloaded.gone, reloaded.listing)
        if reloaded.gone is None:  # compiled whole: a big catalog leaves the collector's full passes
            heap.settle(len(self.catalog))
        await self._leases.retire(src for sid, src in old.sources.items() if sid in reloaded.replaced)
        return reloaded

    async def refresh_listing(self) -> ListingChange:
        """List collections again (files appeared or vanished) and swap in the result; whose listings it changed
        (the two catalogs compared in one walk, as the compile took anyway)."""
        async with heap.relisting(len(self.catalog)):  # a big catalog leaves the collector's full passes
            return await self._refresh_listing()

    async def _refresh_listing(self) -> ListingChange:
        async with self._swapping:
            old = self._snapshot
            with span("aggregator.relist", generation=old.generation + 1):
                catalog = await compile_catalog(old.manifest, old.sources, old.generation + 1, previous=old.catalog)
            listing = catalog_change(old.catalog, catalog).listing
            # One manifest: the files gone are those of the URIs gone and of kept URIs naming another file now.
            self._swap(replace(old, catalog=catalog), (), unlisted_files(old.catalog, catalog), listing)
            heap.settle(len(catalog))  # one grown big too (`relisting` judges by the catalog it replaces)
            return listing

    def _swap(self, new: Snapshot, replaced: Collection[str], gone: Collection[tuple[str, str]] | None,
              listing: ListingChange) -> None:
        """Swap in `new`, which changed `listing`. `gone` (files no longer listed) is what a catalog built on the
        current one knows already; None: the two catalogs' files are compared whole."""
        old, self._snapshot = self._snapshot, new  # one reference: a read in flight keeps the snapshot it leased
        if gone is None:
            gone = old.catalog.targets() - new.catalog.targets()
        # Content of a replaced source, or of a resource no longer listed, must not outlive the swap.
        self.cache.invalidate_where(Forget.of(sources=replaced, files=gone))
        self._swapped(listing)
        self._tell(None)

    def swapping(self) -> anyio.Lock:
        """Held while a catalog is built on the current one and swapped in: one reload or relisting at a time."""
        return self._swapping

    def swap_catalog(self, catalog: Catalog, gone: Collection[tuple[str, str]], listing: ListingChange,
                     changed: frozenset[str] | None = None) -> None:
        """Swap in `catalog`, built on the current one by catalog_delta under `swapping()`, which changed `listing`:
        cached content of the `gone` files is forgotten and listeners told (`delta_listeners` of the `changed` URIs,
        when given); nothing is compared across the whole catalog."""
        self._snapshot = replace(self._snapshot, catalog=catalog)
        self.cache.invalidate_where(Forget.of(files=gone))
        if changed is not None:
            for listener in self.delta_listeners:
                listener(catalog.generation, changed)
        self._swapped(listing)
        self._tell(None)

    def _swapped(self, listing: ListingChange) -> None:
        for listener in list(self.swap_listeners):
            listener(listing)

    def _tell(self, files: set[tuple[str, str]] | None) -> None:
        for listener in self.change_listeners:
            listener(files)

    # --- change tracking ---------------------------------------------------------------------------------

    def invalidate_uris(self, uris: Iterable[str]) -> None:
        """Forget cached content of these URIs (files they read, or query results of their source)."""
        files, queries = set(), set()
        for _, target in self._snapshot.catalog.resolve_each(uris):
            if isinstance(target, QueryTarget):
                queries.add(target.source)
            elif isinstance(target, FileTarget):
                files.add((target.source, target.path))
        self.cache.invalidate_where(Forget.of(files=files, queries=queries))
        self._tell(files)

    def invalidate(self, source: str, paths: Iterable[str]) -> None:
        """Forget cached content of these files (they changed)."""
        wanted = {(source, p) for p in paths}
        self.cache.invalidate_where(Forget.of(files=wanted))
        self._tell(wanted)

    async def forget_shared(self, source: str, paths: Collection[str], data: bool = False) -> None:
        """Forget what the cluster's shared cache holds of these files of `source` (and, with `data`, its query
        results): a replica that saw them change calls this before telling the others. Nothing without a cluster."""
        if self.shared is None or source not in self._snapshot.manifest.sources:
            return
        from aggregator.cluster.link import source_fingerprint

        await self.shared.forget(source_fingerprint(self._snapshot.manifest.sources[source]), paths, data)

    async def versions(self, source: str, uris: Iterable[str]) -> dict[str, str | None]:
        """The backend's current version of each of `uris` that reads from `source` (None when it is gone)."""
        async with self.lease() as snapshot:
            wanted = _reads_of(snapshot.catalog, source, uris)
            versions = await snapshot.sources[source].poll(set(wanted.values()))
        return {uri: versions[path] for uri, path in wanted.items()}

    def reads_of(self, source: str, uris: Iterable[str]) -> dict[str, str | None]:
        """Those of `uris` that read from `source`, each with the path it reads (None: the source's query data)."""
        return _reads_of(self._snapshot.catalog, source, uris)

    def render_inputs(self, of: Iterable[str] | None = None) -> set[str]:
        """The URIs recent renders read: of every render, or of the renders `of` names and those they read."""
        return self._reader.render_inputs.read_by(of)

    def rendered_dependents(self, changed: Iterable[str], listing_changed: bool = False) -> set[str]:
        """Rendered URIs whose last render read one of `changed` (or listed resources, when the listing changed),
        and, in turn, the renders that read those."""
        return self._reader.render_inputs.dependents(changed, listing_changed)

    def paths_by_source(self, uris: Iterable[str]) -> dict[str, set[str]]:
        """The files these URIs read, by source (URIs that name no file are left out)."""
        found: dict[str, set[str]] = {}
        for _, target in self._snapshot.catalog.resolve_each(uris):
            if isinstance(target, FileTarget):
                found.setdefault(target.source, set()).add(target.path)
        return found

    def health(self) -> dict[str, Mapping[str, object]]:
        """The connection state of every source that keeps one (`Source.health`), by source id."""
        return {sid: health for sid, src in self._snapshot.sources.items() if (health := src.health()) is not None}

    def uris_for(self, source: str, paths: set[str], candidates: Iterable[str]) -> set[str]:
        """Listed URIs backed by these files, plus those of `candidates` (e.g. subscribed URIs) that resolve to them."""
        snapshot = self._snapshot
        catalog = snapshot.catalog
        uris = {e.uri for e in entries_of_files(catalog, snapshot.manifest, source, paths)}
        for uri, target in catalog.resolve_each(candidates):
            if isinstance(target, FileTarget) and target.source == source and target.path in paths:
                uris.add(uri)
        return uris

    # --- serving -----------------------------------------------------------------------------------------

    def list_page(self, cursor: str | None, scopes: frozenset[str] | None = None) -> ServedPage[Page[Entry]]:
        """A listing page of what a caller holding `scopes` may see (None: a trusted caller who sees everything)."""
        snapshot = self._snapshot
        return ServedPage(snapshot.catalog.page(cursor, snapshot.manifest.server.page_size, scopes),
                          snapshot.manifest.defaults.ttl, snapshot.listing_private(scopes))

    def list_rows(self, cursor: str | None, scopes: frozenset[str] | None = None) -> ServedPage[RowsPage]:
        """`list_page` as rows of the caller's view (`Catalog.page_rows`): for encoding without entries."""
        snapshot = self._snapshot
        return ServedPage(snapshot.catalog.page_rows(cursor, snapshot.manifest.server.page_size, scopes),
                          snapshot.manifest.defaults.ttl, snapshot.listing_private(scopes))

    def template_page(self, cursor: str | None, scopes: frozenset[str] | None = None
                      ) -> ServedPage[Page[TemplateEntry]]:
        snapshot = self._snapshot
        return ServedPage(snapshot.catalog.template_page(cursor, snapshot.manifest.server.page_size, scopes),
                          snapshot.manifest.defaults.ttl, snapshot.listing_private(scopes))

    def allowed(self, uri: str, scopes: frozenset[str] | None = None) -> Target:
        """What `uri` names if a caller holding `scopes` may read it; ResourceNotFound otherwise, so a caller
        cannot tell a hidden resource from a missing one."""
        return self._snapshot.allowed(uri, scopes)

    def template_for(self, uri_template: str, scopes: frozenset[str] | None = None) -> TemplateEntry | None:
        """The catalog's template spelled `uri_template`, if a caller holding `scopes` may see it."""
        return self._snapshot.template_for(uri_template, scopes)

    async def read(self, uri: str, scopes: frozenset[str] | None = None) -> Served:
        """The content of `uri` for a caller holding `scopes` (None: trusted), with its ttl and cache scope;
        ResourceNotFound, ResourceTooLarge or ResourceUnavailable otherwise."""
        # `async with self.lease()`, without the Lease and its two coroutines: every read that is not relayed is here.
        snapshot, leases = self._snapshot, self._leases
        leases.hold(snapshot)
        try:
            return await self._reader.read(snapshot, uri, scopes)
        finally:
            await leases.release(snapshot)


    def relay_plan(self, uri: str, refused: Callable[[str], bool]) -> RelayPlan | None:
        """How reads of `uri` by a trusted caller are relayed in callbacks while the current snapshot serves
        (`reads.relayed`: an uncached read of an upstream over a pipe), None: `read` it instead (also when
        `refused(uri)`: a URI the caller serves otherwise). Resolved once a URI and snapshot."""
        snapshot, plans = self._snapshot, self._plans
        if plans.snapshot is not snapshot:
            plans = self._plans = _Plans(snapshot)
        plan = plans.get(uri, _UNPLANNED)
        if plan is _UNPLANNED:
            plan = None if refused(uri) else relay_plan(self._reader, self._leases, snapshot, uri)
            if len(uri) <= MAX_PLANNED_URI:
                if len(plans) >= MAX_PLANS:
                    plans.clear()  # a bound, not an eviction order: the plans of URIs read again come back at once
                plans[uri] = plan
        return plan

    async def read_indexed(self, target: FileTarget) -> Content:
        """What the search index holds of a `convert:` file: its Markdown as reads get it, from the content cache
        or converted there as background work; ResourceNotConverted (or another RequestError) otherwise."""
        async with self.lease() as snapshot:
            return await self._reader.indexed(snapshot, target)


class _Plans(dict[str, "RelayPlan | None"]):
    """The relay plans of one snapshot's URIs (None: read the usual way)."""

    __slots__ = ("snapshot",)

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


_UNPLANNED: Any = object()


def _reads_of(catalog: Catalog, source: str, uris: Iterable[str]) -> dict[str, str | None]:
    wanted: dict[str, str | None] = {}
    for uri, target in catalog.resolve_each(uris):
        if isinstance(target, QueryTarget) and target.source == source:
            wanted[uri] = None
        elif isinstance(target, FileTarget) and target.source == source:
            wanted[uri] = target.path
    return wanted
