"""The running aggregator: the current snapshot (manifest, catalog, sources) and the content cache.

This is what protocol handlers call; it knows nothing of MCP. Reads go snapshot -> catalog -> cache -> source,
all on the one snapshot the read leased when it started.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

import anyio
import anyio.to_thread
from cachetools import LRUCache

from aggregator.cache import CachePolicy, ContentCache
from aggregator.cluster.link import source_fingerprint
from aggregator.cluster.shared_cache import SharedContent, SharedItem, shareable
from aggregator.cache_keys import CacheKey, FileKey, Forget, QueryKey
from aggregator.catalog import (Catalog, Entry, FileTarget, Page, QueryTarget, RenderTarget, Target, TemplateEntry,
                                TextTarget)
from aggregator.compiler import compile_catalog
from aggregator.content import Content, GzipError, GzipTooLarge, decode_body, gunzip
from aggregator.errors import (ResourceCorrupt, ResourceNotFound, ResourceOverBudget, ResourceRenderFailed,
                               ResourceTooLarge,
                               ResourceUnavailable)
from aggregator.manifest import load_manifest
from aggregator.manifest.model import Defaults, Manifest, ManifestError, ManifestIssue, SourceSpec
from aggregator.snapshot import Lease, Leases, Snapshot, SourceLimits, close_sources
from aggregator.tracing import Span, span
from aggregator.sources import Source, SourceError, SourceNotFound, SourceTooLarge, SourceUnsupported, open_source
from aggregator.sources.unopened import Unopened

__all__ = ["ResourceService", "Served", "ServedPage", "SuspiciousReload", "open_sources"]

logger = logging.getLogger("aggregator")
RENDER_INPUTS_KEPT = 4096
"""Rendered URIs whose inputs are remembered (template URIs are chosen by clients: the map must be bounded)."""


@dataclass(frozen=True, slots=True)
class Served:
    """A read's content with how long a client may keep it and whether it depends on who asked, all from the
    snapshot the content came from."""

    content: Content
    ttl: float
    """Seconds."""
    private: bool


@dataclass(frozen=True, slots=True)
class ServedPage:
    """A listing page with its ttl and cache scope, from the snapshot it was paged from."""

    page: Page
    ttl: float
    private: bool


def _content_changed(old: Catalog, new: Catalog, replaced: set[str]) -> set[str]:
    """Listed URIs in both catalogs whose content now comes from elsewhere (other text, file or source)."""
    changed = set()
    for entry in new.entries:
        before = old.get(entry.uri)
        if before is not None and ((before.source, before.path, before.text, before.decompress)
                                   != (entry.source, entry.path, entry.text, entry.decompress)
                                   or entry.source in replaced):
            changed.add(entry.uri)
    return changed


class SuspiciousReload(Exception):
    """A guarded reload would remove every resource of sources the new manifest still declares, or empty the
    catalog: what a half-written save looks like. Nothing was swapped."""

    def __init__(self, sources: tuple[str, ...]) -> None:
        self.sources = sources
        """The still-declared sources left without a resource; empty when the catalog as a whole would be empty."""
        what = f"source(s) {', '.join(map(repr, sources))}" if sources else "the catalog"
        super().__init__(f"the reload would remove every resource of {what}")


def _emptied_sources(old: Catalog, new: Catalog, manifest: Manifest) -> tuple[str, ...] | None:
    """Sources still declared in `manifest` that have resources in `old` and none in `new` (() when only the
    catalog as a whole would become empty); None when the new catalog looks like a deliberate edit."""
    before = {e.source for e in old.entries if e.source is not None}
    after = {e.source for e in new.entries if e.source is not None}
    emptied = tuple(sorted(sid for sid in before - after if sid in manifest.sources))
    if emptied:
        return emptied
    return () if len(old) and not len(new) else None


def _same_source(a: SourceSpec, b: SourceSpec) -> bool:
    """Equal but for where the manifest wrote them."""
    return replace(a, where=b.where, key=b.key) == b


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


class ResourceService:
    """Serves one manifest: listing pages, template pages and reads, each from one snapshot."""

    def __init__(self, manifest: Manifest, sources: Mapping[str, Source], catalog: Catalog,
                 cache: ContentCache[CacheKey, Content] | None = None) -> None:
        self._snapshot = _snapshot(manifest, catalog, sources, {sid: catalog.generation for sid in sources})
        self._leases = Leases()
        self._swapping = anyio.Lock()
        self.cache: ContentCache[CacheKey, Content] = cache if cache is not None else ContentCache(manifest.defaults.cache_bytes)
        self.source_errors: Counter[str] = Counter()
        """Failed backend calls per source id, since start (for /metrics)."""
        self.last_source_error: dict[str, tuple[float, str]] = {}
        """Per source id, when (time.time()) and why its last backend call failed (operator detail: the console)."""
        self._render_inputs: LRUCache[str, tuple[frozenset[str], bool]] = LRUCache(maxsize=RENDER_INPUTS_KEPT)
        """Rendered URI -> (URIs its last render read, whether it listed resources): who to tell when those change."""
        self.shared: SharedContent | None = None
        """The cluster's shared content cache (server.cluster), under this replica's own cache; None: off."""
        self.change_listeners: list[Callable[[set[tuple[str, str]] | None], None]] = []
        """Told when content changes: with the (source, path) files just invalidated, or None when a new catalog was
        swapped in (the search index follows both)."""

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

    async def reload(self, watched: Iterable[str] = (), *, guard: bool = False) -> tuple[bool, set[str]]:
        """Load the manifest again and swap in its snapshot; returns (listing changed, URIs whose content changed).

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
                    changed, content_changed = await self._reload(watched, guard)
                    traced.set(outcome="ok", generation=self.catalog.generation, resources=len(self.catalog),
                               listing_changed=changed)
            except SuspiciousReload:
                traced.set(outcome="held back")
                raise
            except Exception:
                traced.set(outcome="failed")
                raise
            return changed, content_changed

    async def _reload(self, watched: Iterable[str], guard: bool) -> tuple[bool, set[str]]:
        old = self._snapshot
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
            catalog = await compile_catalog(manifest, sources, before.generation + 1, reuse, before.listed_at, before)
        except BaseException:
            await close_sources(fresh.values())
            raise
        emptied = _emptied_sources(before, catalog, manifest) if guard else None
        if emptied is not None:
            await close_sources(fresh.values())
            raise SuspiciousReload(emptied)
        epochs = {**{sid: old.epochs[sid] for sid in kept}, **{sid: catalog.generation for sid in fresh}}
        replaced = set(old.sources) - set(kept)
        changed = self._swap(_snapshot(manifest, catalog, sources, epochs), replaced)
        await self._leases.retire(src for sid, src in old.sources.items() if sid in replaced)
        return changed, _content_changed(before, catalog, replaced)

    async def refresh_listing(self) -> bool:
        """List collections again (files appeared or vanished) and swap in the result; True if the listing changed."""
        async with self._swapping:
            old = self._snapshot
            with span("aggregator.relist", generation=old.generation + 1):
                catalog = await compile_catalog(old.manifest, old.sources, old.generation + 1, previous=old.catalog)
            return self._swap(replace(old, catalog=catalog), replaced=set())

    def _swap(self, new: Snapshot, replaced: set[str]) -> bool:
        old, self._snapshot = self._snapshot, new  # one reference: a read in flight keeps the snapshot it leased
        gone = old.catalog.targets() - new.catalog.targets()
        # Content of a replaced source, or of a resource no longer listed, must not outlive the swap.
        self.cache.invalidate_where(Forget.of(sources=replaced, files=gone))
        self._tell(None)
        return old.catalog.listing_signature != new.catalog.listing_signature

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
        if of is None:
            return {uri for reads, _ in self._render_inputs.values() for uri in reads}
        found: set[str] = set()
        frontier = {uri for uri in of if uri in self._render_inputs}
        while frontier:
            reads = {uri for render in frontier for uri in self._render_inputs.get(render, ((), False))[0]}
            frontier = {uri for uri in reads - found if uri in self._render_inputs}
            found |= reads
        return found

    def rendered_dependents(self, changed: Iterable[str], listing_changed: bool = False) -> set[str]:
        """Rendered URIs whose last render read one of `changed` (or listed resources, when the listing changed),
        and, in turn, the renders that read those."""
        found: set[str] = set()
        frontier = set(changed)
        while True:
            more = {uri for uri, (reads, listed) in self._render_inputs.items()
                    if uri not in found and (not reads.isdisjoint(frontier) or (listing_changed and listed))}
            if not more:
                return found
            found |= more
            frontier, listing_changed = more, False

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
        catalog = self._snapshot.catalog
        uris = {e.uri for e in catalog.entries_for(source, paths)}
        for uri, target in catalog.resolve_each(candidates):
            if isinstance(target, FileTarget) and target.source == source and target.path in paths:
                uris.add(uri)
        return uris

    # --- serving -----------------------------------------------------------------------------------------

    def list_page(self, cursor: str | None, scopes: frozenset[str] | None = None) -> ServedPage:
        """A listing page of what a caller holding `scopes` may see (None: a trusted caller who sees everything)."""
        snapshot = self._snapshot
        return ServedPage(snapshot.catalog.page(cursor, snapshot.manifest.server.page_size, scopes),
                          snapshot.manifest.defaults.ttl, snapshot.listing_private(scopes))

    def template_page(self, cursor: str | None, scopes: frozenset[str] | None = None) -> ServedPage:
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
        async with self.lease() as snapshot:
            return await self._read(snapshot, uri, scopes)

    async def _read(self, snapshot: Snapshot, uri: str, scopes: frozenset[str] | None) -> Served:
        target = snapshot.allowed(uri, scopes)
        match target:
            case TextTarget():
                content = Content(target.mime_type or "text/plain", text=target.text)
            case RenderTarget():
                with span("aggregator.render", uri=target.uri):
                    content = await self._render(snapshot, target, scopes)
            case QueryTarget():
                content = await self._query(snapshot, target)
            case FileTarget():
                content = await self._file(snapshot, target)
        ttl = snapshot.ttl(target) if content.max_age is None else min(snapshot.ttl(target), content.max_age)
        return Served(content, ttl, content.private or snapshot.private(target, scopes))

    async def _file(self, snapshot: Snapshot, target: FileTarget) -> Content:
        source, limits, path = snapshot.sources[target.source], snapshot.limits[target.source], target.path

        async def load() -> tuple[Content, str | None]:
            with _source_span("aggregator.source.read", snapshot, target, path):
                blob = await _backend_call(target, source, lambda: source.read(path, limits.max_bytes),
                                           self.source_errors, self.last_source_error)
            # An HTTP server may send a .gz with Content-Encoding: gzip, which the client already undid.
            undone = source.url_paths and not blob.data.startswith(b"\x1f\x8b")
            data = _gunzip(target, blob.data, limits.max_bytes) if target.decompress and not undone else blob.data
            # An upstream Content-Type beats a guess from the name, except for the bytes we decompressed.
            upstream = None if target.decompress else blob.mime_type
            declared = target.mime_type if target.mime_declared or not upstream else upstream
            content = decode_body(data, declared)
            if blob.max_age is not None or blob.private:
                content = replace(content, max_age=blob.max_age, private=blob.private)
            return content, blob.version

        async def revalidate(version: str) -> bool:
            with _source_span("aggregator.source.version", snapshot, target, path):
                return await _backend_call(target, source, lambda: source.version(path), self.source_errors,
                                           self.last_source_error) == version

        key = FileKey(target.source, snapshot.epochs[target.source], path, target.mime_type, target.decompress)
        shared = self._through_shared(source, load, lambda spec, cluster: cluster.file_item(
            spec, path, target.mime_type, target.decompress, limits.max_bytes, limits.ttl), snapshot, target.source)
        return await self.cache.get_or_load(key, limits.policy, shared, revalidate, stale_on=(ResourceUnavailable,))

    def _through_shared(self, source: Source, load: Callable[[], Awaitable[tuple[Content, str | None]]],
                        where: Callable[[SourceSpec, SharedContent], SharedItem], snapshot: Snapshot,
                        source_id: str) -> Callable[[], Awaitable[tuple[Content, str | None]]]:
        """`load`, or with the cluster's shared cache on and a remote source, `load` behind it: the local cache's
        misses ask Redis first (and single-flight across replicas)."""
        cluster = self.shared
        if cluster is None or not shareable(source):
            return load
        return lambda: cluster.load(where(snapshot.manifest.sources[source_id], cluster), load)

    async def _render(self, snapshot: Snapshot, target: RenderTarget, scopes: frozenset[str] | None) -> Content:
        """Run a `render:` template; it reads other resources as the caller would (hidden ones stay hidden), from
        the same snapshot. It runs in a worker thread within the manifest's `render:` budget (its reads come back
        to this loop)."""
        from aggregator.render import RenderError, RenderOverBudget, RenderTooLarge, render

        template = target.render
        read_uris: set[str] = set()
        listed = False

        async def read_text(written: str) -> str:
            uri = template.uri(written)
            read_uris.add(uri)
            content = (await self._read(snapshot, uri, scopes)).content
            if content.text is None:
                raise RenderError(f"{uri} is binary ({content.mime_type}): only text resources can be rendered")
            return content.text

        def list_resources(prefix: str) -> list[dict[str, object]]:
            nonlocal listed
            listed = True
            return [_entry_facts(e) for e in snapshot.catalog.under(template.uri(prefix), scopes)]

        limit = snapshot.manifest.defaults.max_bytes
        try:
            text = await render(template.text, dict(target.params), read_text, list_resources, limit,
                                snapshot.manifest.render)
        except RenderTooLarge:
            raise ResourceTooLarge(target.uri, limit + 1, limit) from None
        except (RenderOverBudget, ResourceOverBudget) as exc:  # the latter: a render this one read, same budget
            logger.warning("render %s failed: %s", target.uri, exc)
            raise ResourceOverBudget(target.uri) from None
        except (RenderError, ResourceRenderFailed) as exc:  # the latter: a render this one read failed by itself
            # The template itself is wrong (an undefined name ...): permanent until the manifest changes. What failed
            # may name another URI or a data value: the log gets it, the client a generic error.
            reason = _render_reason(exc)
            logger.warning("render %s failed: %s", target.uri, reason)
            raise ResourceRenderFailed(target.uri, reason) from None
        except (ResourceNotFound, ResourceTooLarge, ResourceUnavailable) as exc:
            # A resource it reads is missing or down: that may pass, so the render is unavailable, not broken.
            reason = _render_reason(exc)
            logger.warning("render %s failed: %s", target.uri, reason)
            raise ResourceUnavailable(target.uri, reason) from None
        finally:
            self._render_inputs[target.uri] = (frozenset(read_uris), listed)
        return Content(target.mime_type or "text/markdown", text=text)

    async def _query(self, snapshot: Snapshot, target: QueryTarget) -> Content:
        source, limits = snapshot.sources[target.source], snapshot.limits[target.source]
        run = source.query
        # A query's values are strings or None: the catalog comma-joins lists (SQL binds scalars).
        params = {name: value for name, value in target.params if not isinstance(value, tuple)}
        sql, fmt = target.query, target.format

        async def load() -> tuple[Content, str | None]:
            with _source_span("aggregator.source.read", snapshot, target, None):
                blob = await _backend_call(target, source, lambda: run(sql, params, fmt, limits.max_bytes),
                                           self.source_errors, self.last_source_error)
            return decode_body(blob.data, target.mime_type), None

        key = QueryKey(target.source, snapshot.epochs[target.source], sql, target.params, fmt)
        shared = self._through_shared(source, load, lambda spec, cluster: cluster.query_item(
            spec, sql, target.params, fmt, limits.max_bytes, limits.ttl), snapshot, target.source)
        return await self.cache.get_or_load(key, limits.policy, shared, stale_on=(ResourceUnavailable,))


T = TypeVar("T")


def _reads_of(catalog: Catalog, source: str, uris: Iterable[str]) -> dict[str, str | None]:
    wanted: dict[str, str | None] = {}
    for uri, target in catalog.resolve_each(uris):
        if isinstance(target, QueryTarget) and target.source == source:
            wanted[uri] = None
        elif isinstance(target, FileTarget) and target.source == source:
            wanted[uri] = target.path
    return wanted


def _snapshot(manifest: Manifest, catalog: Catalog, sources: Mapping[str, Source],
              epochs: Mapping[str, int]) -> Snapshot:
    limits = {sid: _limits(spec, manifest.defaults) for sid, spec in manifest.sources.items()}
    # Read-only views: a snapshot is shared by every read that leased it.
    return Snapshot(manifest, catalog, MappingProxyType(dict(sources)), MappingProxyType(limits),
                    MappingProxyType(dict(epochs)))


def _limits(spec: SourceSpec, defaults: Defaults) -> SourceLimits:
    ttl = spec.ttl if spec.ttl is not None else defaults.ttl
    return SourceLimits(ttl, spec.max_bytes if spec.max_bytes is not None else defaults.max_bytes,
                        CachePolicy(ttl, spec.stale_if_error))


def _source_span(name: str, snapshot: Snapshot, target: FileTarget | QueryTarget, path: str | None) -> Span:
    """A span for one backend call: source id and kind, the path, the URI (never the source's URL or content)."""
    return span(name, source_id=target.source, source_kind=snapshot.manifest.sources[target.source].kind, path=path,
                uri=target.uri)


async def _backend_call(target: FileTarget | QueryTarget, source: Source, call: Callable[[], Awaitable[T]],
                        errors: Counter[str], last: dict[str, tuple[float, str]]) -> T:
    """Run one backend call; its failures become client-safe errors naming the URI, details go to the log.
    Failures other than not-found are counted per source in `errors`, and the last one kept in `last`."""
    try:
        return await call()
    except (SourceNotFound, SourceUnsupported) as exc:
        logger.info("read %s: not found (%s)", target.uri, exc)
        raise ResourceNotFound(target.uri) from None
    except SourceTooLarge as exc:
        errors[target.source] += 1
        last[target.source] = (time.time(), str(exc))
        logger.warning("read %s: %s", target.uri, exc)
        raise ResourceTooLarge(target.uri, exc.size, exc.limit) from None
    except SourceError as exc:
        errors[target.source] += 1
        last[target.source] = (time.time(), f"{source.describe()}: {exc}")
        logger.error("read %s from %s failed: %s", target.uri, source.describe(), exc)
        raise ResourceUnavailable(target.uri, f"{source.describe()}: {exc}") from None


def _render_reason(exc: Exception) -> str:
    """Why a render failed, for the log and validate: the inner reason of a read it made, when there is one."""
    if isinstance(exc, (ResourceRenderFailed, ResourceUnavailable)) and exc.reason:
        # Nested renders: the innermost failure, named once rather than once per level.
        return exc.reason if exc.reason.startswith("reading ") else f"reading {exc.uri}: {exc.reason}"
    return exc.message if isinstance(exc, (ResourceNotFound, ResourceTooLarge, ResourceUnavailable)) else str(exc)


def _gunzip(target: FileTarget, data: bytes, max_bytes: int) -> bytes:
    """`data` decompressed, at most `max_bytes` of it; a bomb is too large and corrupt data a permanent error."""
    try:
        return gunzip(data, max_bytes)
    except GzipTooLarge:
        logger.warning("read %s: more than %d bytes once decompressed", target.uri, max_bytes)
        raise ResourceTooLarge(target.uri, max_bytes + 1, max_bytes) from None
    except GzipError as exc:
        logger.warning("read %s: cannot decompress: %s", target.uri, exc)
        raise ResourceCorrupt(target.uri, "it is not valid gzip data") from None


def _entry_facts(entry: Entry) -> dict[str, object]:
    """What a render template sees of a listed resource."""
    return {"uri": entry.uri, "name": entry.name, "title": entry.title, "description": entry.display.description,
            "mimeType": entry.mime_type, "size": entry.size, "lastModified": entry.last_modified}
