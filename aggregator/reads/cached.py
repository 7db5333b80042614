"""The caches every source read goes through, in one place: this replica's ContentCache, then (for a remote source
with the cluster's shared cache on) Redis, then the source. Errors are never cached; an expired copy is served
stale only while the source is unavailable."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aggregator.cache import ContentCache, Revalidate
from aggregator.cache_keys import CacheKey
from aggregator.content import Content
from aggregator.errors import ResourceUnavailable
from aggregator.manifest.model import SourceSpec
from aggregator.snapshot import Snapshot

if TYPE_CHECKING:  # the cluster's modules are imported only with `server.cluster`
    from aggregator.cluster.shared_cache import Load, SharedContent, SharedItem

__all__ = ["Caches", "SharedName"]

SharedName = Callable[["SourceSpec", "SharedContent"], "SharedItem"]
"""Where the cluster keeps this read's body, from the source's spec (its fingerprint names the Redis keys)."""


class Caches:
    """This replica's content cache, with the cluster's shared one under it once `shared` is set."""

    def __init__(self, cache: ContentCache[CacheKey, Content]) -> None:
        self.cache = cache
        self.shared: SharedContent | None = None
        """The cluster's shared content cache (server.cluster), under this replica's own cache; None: off."""

    async def get_or_load(self, snapshot: Snapshot, key: CacheKey, load: Load, shared_name: SharedName,
                          revalidate: Revalidate | None = None) -> Content:
        """The content under `key` (of `key.source` in `snapshot`), cached or fresh; on a local miss of a remote
        source the cluster's copy first (single flight across replicas), `load` only when it has none."""
        source_id = key.source
        return await self.cache.get_or_load(key, snapshot.limits[source_id].policy,
                                            self._through_shared(snapshot, source_id, load, shared_name),
                                            revalidate, stale_on=(ResourceUnavailable,))

    def _through_shared(self, snapshot: Snapshot, source_id: str, load: Load, shared_name: SharedName) -> Load:
        cluster = self.shared
        if cluster is None:
            return load
        from aggregator.cluster.shared_cache import shareable

        if not shareable(snapshot.sources[source_id]):
            return load
        return lambda: cluster.load(shared_name(snapshot.manifest.sources[source_id], cluster), load)
