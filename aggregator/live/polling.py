"""Poll the remote sources that set `poll:`: alone, compare the versions of what subscribers read with the last
poll; in a cluster whose Redis is up, leave it to the poll lease holder (replicas.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from aggregator.catalog_delta import Delta
from aggregator.live.plan import Plan
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService

if TYPE_CHECKING:  # the cluster's modules are imported only with `server.cluster`
    from aggregator.live.replicas import ClusterReplica

__all__ = ["Pollers"]

logger = logging.getLogger("aggregator.supervisor")  # one logger for every side loop

SUBSCRIBED_SETTLE = 0.05
"""Seconds a poller lets subscriptions gather before it takes their versions."""


class Pollers:
    """One poller per `poll:` source of the current manifest; `replica` when this process is one of a cluster."""

    def __init__(self, service: ResourceService, notifier: Notifier, updates: CatalogUpdates, plan: Plan,
                 replica: ClusterReplica | None) -> None:
        self.service = service
        self.notifier = notifier
        self.updates = updates
        self.plan = plan
        self.replica = replica
        self.seen: dict[str, dict[str, str | None]] = {}
        """The versions the last poll of each source (polling alone) took, by URI."""
        self._subscribed = anyio.Event()
        """Set (and replaced) when the subscribed URIs may have changed: pollers take a version of the new ones."""
        notifier.subscription_listeners.append(self._subscriptions_changed)

    def _subscriptions_changed(self) -> None:
        subscribed, self._subscribed = self._subscribed, anyio.Event()
        subscribed.set()

    async def run(self) -> None:
        """Poll every remote source that sets `poll:`; start again when a reload changes them."""
        while True:
            polled = {sid: spec.poll for sid, spec in self.service.manifest.sources.items()
                      if spec.poll and sid in self.service.sources
                      and self.service.sources[sid].watch_root() is None}
            changed = self.plan.sources_changed
            async with anyio.create_task_group() as tg:
                for sid, interval in polled.items():
                    tg.start_soon(self._poll_source, sid, interval)
                await changed.wait()
                tg.cancel_scope.cancel()
            if self.replica is not None:  # the pollers start again: a source no longer polled is not kept held
                with anyio.move_on_after(2):
                    await self.replica.leases.release_all()
            await anyio.sleep(0)

    async def _poll_source(self, source: str, interval: float) -> None:
        seen = self.seen[source] = {}  # by URI, when polling alone
        seen_paths: dict[str | None, str | None] = {}  # by path, when polling for the cluster
        wait = interval
        while True:
            await self._until_poll(source, wait, interval, seen)
            wait = interval
            try:
                if self.replica is not None and self.replica.cluster.connected and \
                        await self.replica.poll_for_cluster(source, interval, seen_paths):
                    from aggregator.cluster.leases import RETRY_FRACTION
                    from aggregator.cluster.link import source_fingerprint

                    if not self.replica.leases.holds(source_fingerprint(self.service.manifest.sources[source])):
                        wait = interval * RETRY_FRACTION  # another replica polls: be ready to take over soon
                    seen.clear()
                else:  # alone, or the cluster's Redis is unavailable: poll for this replica's subscribers
                    seen_paths.clear()
                    await self.poll_once(source, seen)
            except Exception:
                logger.exception("polling source %r failed; trying again in %gs", source, interval)

    async def _until_poll(self, source: str, wait: float, interval: float, seen: dict[str, str | None]) -> None:
        """Wait `wait` seconds; meanwhile take the version of each URI newly subscribed (alone; in a cluster, kept
        in Redis for the lease holder), so that a change made after the subscription and before the next poll is
        told by that poll."""
        deadline = anyio.current_time() + wait
        while (left := deadline - anyio.current_time()) > 0:
            subscribed = self._subscribed
            with anyio.move_on_after(left):
                await subscribed.wait()
                await anyio.sleep(min(SUBSCRIBED_SETTLE, left))  # a client subscribing to many: one call for all
                if self.replica is None or not self.replica.cluster.connected:
                    await self.baseline(source, seen)
                else:
                    await self.replica.subscribed(source, interval)

    async def baseline(self, source: str, seen: dict[str, str | None]) -> None:
        """Take the current version of the subscribed URIs of `source` that `seen` has none of yet (in a cluster,
        nor the versions this replica's listeners were told of: those are compared with, as ever)."""
        subscribed = self.notifier.subscribed_uris()
        new = (subscribed | self.service.render_inputs(subscribed)) - seen.keys()
        if new and self.replica is not None:  # what its listeners were told of is their baseline already
            from aggregator.cluster.link import source_fingerprint

            known = self.replica.told.knows(source_fingerprint(self.service.manifest.sources[source]))
            reads = self.service.reads_of(source, new)
            new = {uri for uri in new if uri not in reads or reads[uri] not in known}
        if not new:
            return
        try:
            versions = await self.service.versions(source, new)
        except Exception as exc:  # the next poll takes them
            logger.debug("polling source %r: versions of new subscriptions failed: %r", source, exc)
            return
        for uri, version in versions.items():
            seen.setdefault(uri, version)

    async def poll_once(self, source: str, seen: dict[str, str | None]) -> None:
        """Compare versions of the subscribed URIs of `source` with the last poll; list its collections again."""
        subscribed = self.notifier.subscribed_uris()
        # What subscribed renders read is polled too: their `updated` follows from it.
        versions = await self.service.versions(source, subscribed | self.service.render_inputs(subscribed))
        changed = [uri for uri, version in versions.items() if uri in seen and seen[uri] != version]
        if self.replica is not None:  # Redis is out: what the lease holder publishes when it is back is not news
            from aggregator.cluster.link import source_fingerprint

            reads = self.service.reads_of(source, versions)
            news = self.replica.told.alone(source_fingerprint(self.service.manifest.sources[source]),
                                           {reads[uri]: v for uri, v in versions.items() if uri in reads},
                                           {reads[uri]: v for uri, v in seen.items() if uri in reads})
            changed = [uri for uri in versions if uri in reads and reads[uri] in news]
            # The shared cache holds their old bodies: once Redis is back this replica must not read them there.
            await self.service.forget_shared(source, {path for path in news if path is not None}, None in news)
        seen.clear()
        seen.update(versions)
        if changed:
            await self.updates.uris_changed(changed, subscribed)
        if self.updates.has_collection(source):  # this source's listing only, applied in proportion to the change
            delta = await self.updates.source_polled(source)
            if delta is not None and delta.updated:
                await self._listed_changes(source, delta, set(changed), seen)

    async def _listed_changes(self, source: str, delta: Delta, told: set[str], seen: dict[str, str | None]) -> None:
        """Tell what the listing found changed that the versions did not: a URI subscribed since the last poll has
        no version of its own yet (the catalog's entry is its baseline), and an object may change between the two.
        Those told so take their next version as a baseline, so no change is told twice."""
        listed = delta.updated - told
        if not listed:
            return
        if self.replica is not None:  # polling alone: the shared cache must not serve their old bodies either
            await self.service.forget_shared(source, delta.paths_of(listed), False)
        for uri in listed:
            seen.pop(uri, None)
        await self.updates.uris_changed(sorted(listed), self.notifier.subscribed_uris())
