"""The running aggregator: a manifest's sources, its current catalog and the content cache.

This is what protocol handlers call; it knows nothing of MCP. Reads go catalog -> cache -> source.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
from cachetools import LRUCache

from aggregator.cache import CachePolicy, ContentCache
from aggregator.catalog import Catalog, Entry, Page, Target, TemplateEntry, compile_catalog
from aggregator.content import Content, GzipError, GzipTooLarge, decode_body, gunzip
from aggregator.errors import (ResourceCorrupt, ResourceNotFound, ResourceOverBudget, ResourceRenderFailed,
                               ResourceTooLarge,
                               ResourceUnavailable)
from aggregator.manifest import load_manifest
from aggregator.manifest.model import Defaults, Manifest, ManifestError, ManifestIssue, SourceSpec
from aggregator.sources import Source, SourceError, SourceNotFound, SourceTooLarge, open_source

__all__ = ["Aggregator", "SuspiciousReload", "open_sources"]

logger = logging.getLogger("aggregator")
RENDER_INPUTS_KEPT = 4096
"""Rendered URIs whose inputs are remembered (template URIs are chosen by clients: the map must be bounded)."""


@dataclass(frozen=True, slots=True)
class SourceLimits:
    ttl: float
    max_bytes: int
    policy: CachePolicy


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
    """Open every declared source but those in `skip`; ManifestError locating each one that cannot be opened."""
    sources: dict[str, Source] = {}
    issues: list[ManifestIssue] = []
    for spec in manifest.sources.values():
        if spec.id in skip:
            continue
        try:
            sources[spec.id] = open_source(spec)
        except SourceError as exc:
            issues.append(ManifestIssue(spec.where.file, spec.where.line, spec.where.col, f"{spec.key}.url", str(exc)))
    if issues:
        raise ManifestError(issues)
    return sources


async def close_sources(sources: Iterable[Source]) -> None:
    for source in sources:
        close = getattr(source, "aclose", None)
        if close is not None:
            await close()


class Aggregator:
    """Serves one manifest: listing pages, template pages and reads."""

    def __init__(self, manifest: Manifest, sources: Mapping[str, Source], catalog: Catalog,
                 cache: ContentCache[Content] | None = None) -> None:
        self.manifest = manifest
        self.sources = dict(sources)
        self.catalog = catalog
        defaults = manifest.defaults
        self.cache: ContentCache[Content] = cache if cache is not None else ContentCache(defaults.cache_bytes)
        self._limits = {sid: _limits(spec, defaults) for sid, spec in manifest.sources.items()}
        self.source_errors: Counter[str] = Counter()
        """Failed backend calls per source id, since start (for /metrics)."""
        self._render_inputs: LRUCache[str, tuple[frozenset[str], bool]] = LRUCache(maxsize=RENDER_INPUTS_KEPT)
        """Rendered URI -> (URIs its last render read, whether it listed resources): who to tell when those change."""

    @classmethod
    async def open(cls, manifest_path: str | Path) -> Aggregator:
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
        """Release what sources hold open (HTTP connection pools)."""
        await close_sources(self.sources.values())

    async def reload(self, watched: Iterable[str] = (), *, guard: bool = False) -> tuple[bool, set[str]]:
        """Load the manifest again and swap in its catalog; returns (listing changed, URIs whose content changed).

        ManifestError (located) if the new manifest is bad, and with `guard` SuspiciousReload if it would leave a
        source it still declares without resources (or the catalog empty): the current catalog keeps serving.
        Unchanged sources are kept (their connections and cached content with them); collections over `watched`
        sources that did not change are reused rather than listed again (a watcher keeps them current), and so are
        collections over other kept sources listed less than the source's `ttl` ago (source listings are cached with
        the source's ttl).
        """
        # Off the event loop: includes may be URLs, and a big manifest takes seconds to check. Read with the running
        # manifest's cap: the new file's own setting is not known before it is read.
        manifest = await anyio.to_thread.run_sync(functools.partial(
            load_manifest, self.manifest.path, max_bytes=self.manifest.server.max_manifest_bytes),
            abandon_on_cancel=True)  # a shutdown does not wait for a slow include
        kept = {sid: src for sid, src in self.sources.items()
                if sid in manifest.sources and _same_source(self.manifest.sources[sid], manifest.sources[sid])}
        fresh = open_sources(manifest, skip=kept)
        sources = {**kept, **fresh}
        still, now, old = set(watched) & set(kept), time.monotonic(), self.catalog
        reuse = {key: entries for key, entries in old.collections.items() if key.source in kept and (
            key.source in still or now - old.listed_at.get(key, 0.0) < self._limits[key.source].ttl)}
        try:
            catalog = await compile_catalog(manifest, sources, old.generation + 1, reuse, old.listed_at)
        except BaseException:
            await close_sources(fresh.values())
            raise
        emptied = _emptied_sources(old, catalog, manifest) if guard else None
        if emptied is not None:
            await close_sources(fresh.values())
            raise SuspiciousReload(emptied)
        dropped = [src for sid, src in self.sources.items() if sid not in kept]
        replaced = set(self.sources) - set(kept)
        old = self.catalog
        changed = self._swap(manifest, sources, catalog, replaced=replaced)
        await close_sources(dropped)
        return changed, _content_changed(old, catalog, replaced)

    async def refresh_listing(self) -> bool:
        """List collections again (files appeared or vanished) and swap in the result; True if the listing changed."""
        catalog = await compile_catalog(self.manifest, self.sources, self.catalog.generation + 1)
        return self._swap(self.manifest, self.sources, catalog, replaced=set())

    def _swap(self, manifest: Manifest, sources: dict[str, Source], catalog: Catalog, replaced: set[str]) -> bool:
        old = self.catalog
        self.manifest, self.sources = manifest, sources
        self._limits = {sid: _limits(spec, manifest.defaults) for sid, spec in manifest.sources.items()}
        self.catalog = catalog  # one reference: a read in flight keeps the snapshot it took
        gone = old.targets() - catalog.targets()
        # Content of a replaced source, or of a resource no longer listed, must not outlive the swap.
        self.cache.invalidate_where(lambda key: key[0] in replaced or (key[0], key[1]) in gone)
        return old.listing_signature != catalog.listing_signature

    def invalidate_uris(self, uris: Iterable[str]) -> None:
        """Forget cached content of these URIs (files they read, or query results of their source)."""
        catalog, files, query_sources = self.catalog, set(), set()
        for uri in uris:
            try:
                target = catalog.resolve(uri)
            except ResourceNotFound:
                continue
            if target.query is not None:
                query_sources.add(target.source)
            else:
                files.add((target.source, target.path))
        self.cache.invalidate_where(lambda key: (key[0], key[1]) in files or (key[0] in query_sources
                                                                              and key[1] == "?query"))

    def invalidate(self, source: str, paths: Iterable[str]) -> None:
        """Forget cached content of these files (they changed)."""
        wanted = {(source, p) for p in paths}
        self.cache.invalidate_where(lambda key: (key[0], key[1]) in wanted)

    async def versions(self, source: str, uris: Iterable[str]) -> dict[str, str | None]:
        """The backend's current version of each of `uris` that reads from `source` (None when it is gone)."""
        catalog, backend = self.catalog, self.sources[source]
        found: dict[str, str | None] = {}
        for uri in uris:
            try:
                target = catalog.resolve(uri)
            except ResourceNotFound:
                continue
            if target.source != source:
                continue
            if target.query is not None:
                version_of = getattr(backend, "data_version", None)
                if version_of is not None:
                    found[uri] = await version_of()
                continue
            if target.path is None:
                continue
            try:
                info = await backend.stat(target.path)
                found[uri] = info.version or f"{info.mtime}:{info.size}"
            except SourceNotFound:
                found[uri] = None
        return found

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

    def uris_for(self, source: str, paths: set[str], candidates: Iterable[str]) -> set[str]:
        """Listed URIs backed by these files, plus those of `candidates` (e.g. subscribed URIs) that resolve to them."""
        catalog = self.catalog
        uris = {e.uri for e in catalog.entries_for(source, paths)}
        for uri in candidates:
            try:
                target = catalog.resolve(uri)
            except ResourceNotFound:
                continue
            if target.source == source and target.path in paths:
                uris.add(uri)
        return uris

    @property
    def page_size(self) -> int:
        return self.manifest.server.page_size

    @property
    def default_ttl(self) -> float:
        return self.manifest.defaults.ttl

    def ttl_for(self, uri: str) -> float:
        """Seconds a client may keep this URI's content (the source's TTL, else the default)."""
        try:
            target = self.catalog.resolve(uri)
        except ResourceNotFound:
            return self.default_ttl
        return self._limits[target.source].ttl if target.source else self.default_ttl

    def list_page(self, cursor: str | None, scopes: frozenset[str] | None = None) -> Page:
        """A listing page of what a caller holding `scopes` may see (None: a trusted caller who sees everything)."""
        return self.catalog.page(cursor, self.page_size, scopes)

    def template_page(self, cursor: str | None, scopes: frozenset[str] | None = None) -> Page:
        return self.catalog.template_page(cursor, self.page_size, scopes)

    def allowed(self, uri: str, scopes: frozenset[str] | None = None) -> Target:
        """What `uri` names if a caller holding `scopes` may read it; ResourceNotFound otherwise, so a caller
        cannot tell a hidden resource from a missing one."""
        target = self.catalog.resolve(uri)
        if scopes is not None and not target.access <= scopes:
            raise ResourceNotFound(uri)
        return target

    def template_for(self, uri_template: str, scopes: frozenset[str] | None = None) -> TemplateEntry | None:
        """The catalog's template spelled `uri_template`, if a caller holding `scopes` may see it."""
        for template in self.catalog.templates:
            if template.uri_template == uri_template:
                return template if scopes is None or template.spec.access <= scopes else None
        return None

    def is_restricted(self, uri: str) -> bool:
        """Whether what reading `uri` gives depends on who asks: it needs scopes, or it is rendered from a
        catalog where some entries do (a render reads and lists only what its caller may see)."""
        if not self.catalog.restricted:
            return False
        try:
            target = self.catalog.resolve(uri)
        except ResourceNotFound:
            return False
        return bool(target.access) or target.render is not None

    async def read(self, uri: str, scopes: frozenset[str] | None = None) -> Content:
        """The content of `uri` for a caller holding `scopes` (None: trusted); ResourceNotFound, ResourceTooLarge
        or ResourceUnavailable otherwise."""
        catalog = self.catalog  # a read finishes on the snapshot it started with
        target = catalog.resolve(uri)
        if scopes is not None and not target.access <= scopes:
            raise ResourceNotFound(uri)
        if target.text is not None:
            return Content(target.mime_type or "text/plain", text=target.text)
        if target.render is not None:
            return await self._render(catalog, target, scopes)
        if target.query is not None:
            return await self._query(target)
        assert target.source is not None and target.path is not None
        source, limits, path = self.sources[target.source], self._limits[target.source], target.path

        async def load() -> tuple[Content, str | None]:
            blob = await _backend_call(target, source, lambda: source.read(path, limits.max_bytes), self.source_errors)
            # An HTTP server may send a .gz with Content-Encoding: gzip, which the client already undid.
            undone = source.url_paths and not blob.data.startswith(b"\x1f\x8b")
            data = _gunzip(target, blob.data, limits.max_bytes) if target.decompress and not undone else blob.data
            # An upstream Content-Type beats a guess from the name, except for the bytes we decompressed.
            upstream = None if target.decompress else blob.mime_type
            declared = target.mime_type if target.mime_declared or not upstream else upstream
            return decode_body(data, declared), blob.version

        async def revalidate(version: str) -> bool:
            info = await _backend_call(target, source, lambda: source.stat(path), self.source_errors)
            return info.version == version

        key = (target.source, path, target.mime_type, target.decompress)
        return await self.cache.get_or_load(key, limits.policy, load, revalidate, stale_on=(ResourceUnavailable,))

    async def _render(self, catalog: Catalog, target: Target, scopes: frozenset[str] | None) -> Content:
        """Run a `render:` template; it reads other resources as the caller would (hidden ones stay hidden).
        It runs in a worker thread within the manifest's `render:` budget (its reads come back to this loop)."""
        from aggregator.render import RenderError, RenderOverBudget, RenderTooLarge, render

        template = target.render
        assert template is not None

        read_uris: set[str] = set()
        listed = False

        async def read_text(written: str) -> str:
            uri = template.uri(written)
            read_uris.add(uri)
            content = await self.read(uri, scopes)
            if content.text is None:
                raise RenderError(f"{uri} is binary ({content.mime_type}): only text resources can be rendered")
            return content.text

        def list_resources(prefix: str) -> list[dict[str, object]]:
            nonlocal listed
            listed = True
            return [_entry_facts(e) for e in catalog.under(template.uri(prefix), scopes)]

        limit = self.manifest.defaults.max_bytes
        try:
            text = await render(template.text, dict(target.params), read_text, list_resources, limit,
                                self.manifest.render)
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

    async def _query(self, target: Target) -> Content:
        assert target.source is not None and target.query is not None
        source, limits = self.sources[target.source], self._limits[target.source]
        run = getattr(source, "query", None)
        if run is None:
            raise ResourceNotFound(target.uri)
        sql, params, fmt = target.query, dict(target.params), target.format

        async def load() -> tuple[Content, str | None]:
            blob = await _backend_call(target, source, lambda: run(sql, params, fmt, limits.max_bytes),
                                       self.source_errors)
            return decode_body(blob.data, target.mime_type), None

        key = (target.source, "?query", sql, target.params, fmt)
        return await self.cache.get_or_load(key, limits.policy, load, stale_on=(ResourceUnavailable,))


T = TypeVar("T")


def _limits(spec: SourceSpec, defaults: Defaults) -> SourceLimits:
    ttl = spec.ttl if spec.ttl is not None else defaults.ttl
    return SourceLimits(ttl, spec.max_bytes if spec.max_bytes is not None else defaults.max_bytes,
                        CachePolicy(ttl, spec.stale_if_error))


async def _backend_call(target: Target, source: Source, call: Callable[[], Awaitable[T]],
                        errors: Counter[str]) -> T:
    """Run one backend call; its failures become client-safe errors naming the URI, details go to the log.
    Failures other than not-found are counted per source in `errors`."""
    try:
        return await call()
    except SourceNotFound as exc:
        logger.info("read %s: not found (%s)", target.uri, exc)
        raise ResourceNotFound(target.uri) from None
    except SourceTooLarge as exc:
        errors[target.source or ""] += 1
        logger.warning("read %s: %s", target.uri, exc)
        raise ResourceTooLarge(target.uri, exc.size, exc.limit) from None
    except SourceError as exc:
        errors[target.source or ""] += 1
        logger.error("read %s from %s failed: %s", target.uri, source.describe(), exc)
        raise ResourceUnavailable(target.uri, f"{source.describe()}: {exc}") from None


def _render_reason(exc: Exception) -> str:
    """Why a render failed, for the log and validate: the inner reason of a read it made, when there is one."""
    if isinstance(exc, (ResourceRenderFailed, ResourceUnavailable)) and exc.reason:
        # Nested renders: the innermost failure, named once rather than once per level.
        return exc.reason if exc.reason.startswith("reading ") else f"reading {exc.uri}: {exc.reason}"
    return exc.message if isinstance(exc, (ResourceNotFound, ResourceTooLarge, ResourceUnavailable)) else str(exc)


def _gunzip(target: Target, data: bytes, max_bytes: int) -> bytes:
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
