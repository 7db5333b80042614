"""One reload's serving state as one frozen value: manifest, catalog, sources with their limits and cache epochs.

A reload swaps the service's snapshot in one assignment, so nothing reads a new catalog with old sources or
limits. A read leases the snapshot it starts on and finishes on it: the bytes, their ttl and their cache scope
all come from it. Sources a reload dropped are closed once no lease of a snapshot holding them is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType

import anyio

from aggregator.cache import CachePolicy
from aggregator.catalog import Catalog, FileTarget, QueryTarget, RenderTarget, Target, TemplateEntry
from aggregator.errors import ResourceNotFound
from aggregator.manifest.model import Defaults, Manifest, SourceSpec
from aggregator.sources import Source

__all__ = ["Lease", "Leases", "Snapshot", "SourceLimits", "build_snapshot", "close_sources"]

logger = logging.getLogger("aggregator")


@dataclass(frozen=True, slots=True)
class SourceLimits:
    ttl: float
    max_bytes: int
    policy: CachePolicy


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed by identity: leases count per snapshot
class Snapshot:
    """What one generation serves. Never changed: a reload or relisting builds the next one."""

    manifest: Manifest
    catalog: Catalog
    sources: Mapping[str, Source]
    limits: Mapping[str, SourceLimits]
    epochs: Mapping[str, int]
    """The catalog generation each source was opened in; cache keys carry it."""
    relayed: frozenset[str] = frozenset()
    """The sources whose reads may be relayed in callbacks (`reads/relayed.py`): those that can
    (`Source.relay_route`) and whose reads are never kept (ttl 0)."""

    @property
    def generation(self) -> int:
        return self.catalog.generation

    def allowed(self, uri: str, scopes: frozenset[str] | None = None) -> Target:
        """What `uri` names if a caller holding `scopes` may read it (None: trusted); ResourceNotFound otherwise,
        so a caller cannot tell a hidden resource from a missing one."""
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

    def ttl(self, target: Target) -> float:
        """Seconds a client may keep what `target` reads: its source's ttl, else the manifest's default."""
        if isinstance(target, (FileTarget, QueryTarget)):
            return self.limits[target.source].ttl
        return self.manifest.defaults.ttl

    def private(self, target: Target, scopes: frozenset[str] | None) -> bool:
        """Whether what a caller holding `scopes` reads of `target` depends on who asks: it needs scopes, or it
        is rendered from a catalog where some entries do (a render reads and lists only what its caller may see)."""
        return (scopes is not None and self.catalog.restricted
                and (bool(target.access) or isinstance(target, RenderTarget)))

    def listing_private(self, scopes: frozenset[str] | None) -> bool:
        """Whether a listing depends on who asks (some entry or template needs scopes)."""
        return scopes is not None and self.catalog.restricted


def build_snapshot(manifest: Manifest, catalog: Catalog, sources: Mapping[str, Source],
                   epochs: Mapping[str, int]) -> Snapshot:
    """The snapshot serving `catalog` from `sources` (opened in `epochs`), each source's limits from `manifest`."""
    limits = {sid: _limits(spec, manifest.defaults) for sid, spec in manifest.sources.items()}
    relayed = frozenset(sid for sid, source in sources.items()
                        if type(source).relay_route is not Source.relay_route and sid in limits and limits[sid].ttl <= 0)
    # Read-only views: a snapshot is shared by every read that leased it.
    return Snapshot(manifest, catalog, MappingProxyType(dict(sources)), MappingProxyType(limits),
                    MappingProxyType(dict(epochs)), relayed)


def _limits(spec: SourceSpec, defaults: Defaults) -> SourceLimits:
    ttl = spec.ttl if spec.ttl is not None else defaults.ttl
    return SourceLimits(ttl, spec.max_bytes if spec.max_bytes is not None else defaults.max_bytes,
                        CachePolicy(ttl, spec.stale_if_error))


class Lease:
    """Holds a snapshot for one read (`async with`); its end may close sources a reload dropped meanwhile."""

    __slots__ = ("_leases", "snapshot")

    def __init__(self, leases: Leases, snapshot: Snapshot) -> None:
        self._leases, self.snapshot = leases, snapshot

    async def __aenter__(self) -> Snapshot:
        self._leases.hold(self.snapshot)
        return self.snapshot

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._leases.release(self.snapshot)


class Leases:
    """Which snapshots reads hold, and the dropped sources waiting for the last of them to end."""

    def __init__(self) -> None:
        self._held: dict[Snapshot, int] = {}
        self._retired: list[Source] = []
        self._closing: set[asyncio.Task[None]] = set()

    def lease(self, snapshot: Snapshot) -> Lease:
        return Lease(self, snapshot)

    def in_use(self, source: Source) -> bool:
        return any(source in held.sources.values() for held in self._held)

    async def retire(self, sources: Iterable[Source]) -> None:
        """Close `sources` (no longer in the current snapshot) now if no read holds them, else when the last does."""
        self._retired.extend(sources)
        await self._close_idle()

    async def close_all(self) -> None:
        """Close every retired source, held or not (the service is shutting down)."""
        retired, self._retired = self._retired, []
        await close_sources(retired)

    def hold(self, snapshot: Snapshot) -> None:
        """`lease` for a read that ends in a callback (`let_go`), not in an `async with`."""
        self._held[snapshot] = self._held.get(snapshot, 0) + 1

    def let_go(self, snapshot: Snapshot) -> None:
        """End a `hold`: sources a reload dropped meanwhile close in a task of their own once no read holds them."""
        # `_dropped` inline: every relayed read ends here.
        if (held := self._held[snapshot] - 1) > 0:
            self._held[snapshot] = held
            return
        del self._held[snapshot]
        if self._retired:
            task = asyncio.get_running_loop().create_task(self._close_idle())
            self._closing.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._closing.discard)

    async def release(self, snapshot: Snapshot) -> None:
        """End a `hold` as a `Lease` ends: sources a reload dropped meanwhile closed here once no read holds them."""
        if self._dropped(snapshot):
            await self._close_idle()

    def _dropped(self, snapshot: Snapshot) -> bool:
        """One hold of `snapshot` ended; whether dropped sources may close now (none held it, some wait)."""
        if (held := self._held[snapshot] - 1) > 0:
            self._held[snapshot] = held
            return False
        del self._held[snapshot]
        return bool(self._retired)

    async def _close_idle(self) -> None:
        idle = [source for source in self._retired if not self.in_use(source)]
        if idle:
            self._retired = [source for source in self._retired if source not in idle]
            await close_sources(idle)


async def close_sources(sources: Iterable[Source]) -> None:
    """Close each source; shielded, since the read (or reload) whose end triggers this may be being cancelled, and
    one failing to close is logged and does not keep the others open."""
    with anyio.CancelScope(shield=True):
        for source in sources:
            try:
                await source.aclose()
            except Exception:
                logger.exception("closing %s failed", source.describe())
