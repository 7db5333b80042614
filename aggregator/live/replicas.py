"""The cluster (`server.cluster`): one replica polls each remote source, every replica hears of changes.

This replica's side of the change bus: polling a source for the cluster under its poll lease and publishing what
changed, applying other replicas' events as its own changes, and starting over after events may have been lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import anyio

from aggregator.cache_keys import Forget
from aggregator.cluster.bus import ChangeBus, ChangeEvent, Kind
from aggregator.cluster.leases import DATA, PollLeases, pollable
from aggregator.cluster.link import source_fingerprint
from aggregator.cluster.told import SourcePath, ToldVersions
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService

__all__ = ["ClusterReplica"]

logger = logging.getLogger("aggregator.supervisor")  # one logger for every side loop

INBOUND_EVENTS = 1000
"""Other replicas' change events waiting to be handled; past it they are dropped (and logged)."""


class ClusterReplica:
    """This replica on the change bus: its poll leases, the versions its listeners were told, the inbound events."""

    def __init__(self, cluster: ChangeBus, service: ResourceService, notifier: Notifier,
                 updates: CatalogUpdates) -> None:
        self.cluster = cluster
        self.service = service
        self.notifier = notifier
        self.updates = updates
        self.leases = PollLeases(cluster.link)
        self.told = ToldVersions()
        """Versions this replica's listeners were told of: each change is told once."""
        self._inbound_send, self._inbound = anyio.create_memory_object_stream[ChangeEvent](INBOUND_EVENTS)
        self._overflowed = False
        cluster.listeners.append(self._event_arrived)
        cluster.on_reconnect.append(self._rejoined)

    async def run(self) -> None:
        """Run the bus and handle the other replicas' events until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.cluster.run)
            tg.start_soon(self._cluster_events)

    async def poll_for_cluster(self, source: str, interval: float, seen: dict[str | None, str | None]) -> bool:
        """Record what this replica's subscribers want of `source`; if this replica holds its poll lease, poll
        what every replica wants, apply and publish what changed, and keep the versions sent in Redis. False if
        Redis failed (poll alone then)."""
        spec = self.service.manifest.sources[source]
        fingerprint = source_fingerprint(spec)
        losses = self.cluster.losses
        mine = self._wanted(source)
        try:
            await self.leases.want(fingerprint, {DATA if p is None else p for p in mine}, interval)
            if not await self.leases.hold(fingerprint, interval):
                seen.clear()  # another replica polls; taking over, this one starts from the versions that one kept
                return True
            union = await self.leases.wanted(fingerprint)
            if not seen:  # just took the lease: compare with what the last holder saw
                seen.update(await self.leases.seen(fingerprint))
            paths = pollable(union)
            if missing := paths - seen.keys():  # wanted since: compare with the version the subscription took
                seen.update(await self.leases.seen_of(fingerprint, missing))
        except Exception as exc:  # Redis down or slow: the bus logs it once and marks the cluster down
            logger.debug("cluster call for source %r failed: %r", source, exc)
            return False
        async with self.service.lease() as snapshot:
            backend = snapshot.sources.get(source)
            versions = dict(await backend.poll(paths)) if backend is not None and paths else {}
        changed, news = self.told.polled(fingerprint, versions, seen)
        sent = True
        if changed:
            files = {path for path in changed if path is not None}
            data = None in changed
            await self.service.forget_shared(source, files, data)
            await self.updates.apply_change(source, files, data, news)
            sent = await self.cluster.publish(self._event(fingerprint, files, data, "updated",
                                                          {path: versions[path] for path in changed}))
        # Redis keeps (and `seen` mirrors) the versions every replica was sent. A change whose event failed, or went
        # out across a loss of the bus (Redis was away, and the other replicas may not have been back to hear it),
        # is not kept: the next poll for the cluster, this replica's or a new holder's, sends it again, and each
        # replica tells its listeners a version once. (Kept before the event, a write that timed out on a hung
        # Redis still ran once it was back, and the replicas that missed the event never heard of the change.)
        if versions != seen and sent and self.cluster.uninterrupted(losses):
            try:
                await self.leases.record(fingerprint, versions)
            except Exception as exc:  # not kept: sent again next time
                logger.debug("cluster: keeping the versions of source %r failed: %r", source, exc)
            else:
                seen.clear()
                seen.update(versions)
        if self.updates.has_collection(source):
            # Subscribers hear of changed objects from the versions polled above, on every replica; the listing
            # event makes the others list this source again.
            delta = await self.updates.source_polled(source)
            if delta is not None:
                await self.service.forget_shared(source, delta.paths_of(delta.updated))
                await self.cluster.publish(self._event(fingerprint, (), False, "listing"))
        return True

    async def subscribed(self, source: str, interval: float) -> None:
        """Subscriptions changed: record this replica's interests in `source` now, not at its next poll, and keep
        the version of each path no poll has kept one of, so the holder's next poll tells a change made before it.
        Redis failing is logged; the next poll for the cluster records the interests again."""
        fingerprint = source_fingerprint(self.service.manifest.sources[source])
        mine = self._wanted(source)
        try:
            await self.leases.want(fingerprint, {DATA if p is None else p for p in mine}, interval)
            new = mine - (await self.leases.seen_of(fingerprint, mine)).keys()
            if not new:
                return
            async with self.service.lease() as snapshot:
                backend = snapshot.sources.get(source)
                versions = dict(await backend.poll(new)) if backend is not None else {}
            await self.leases.baseline(fingerprint, versions)
        except Exception as exc:
            logger.debug("cluster: recording new interests in source %r failed: %r", source, exc)

    def _wanted(self, source: str) -> set[str | None]:
        """The paths of `source` (None: its query data) this replica's subscribers and their renders read."""
        subscribed = self.notifier.subscribed_uris()
        return set(self.service.reads_of(source, subscribed | self.service.render_inputs(subscribed)).values())

    def _event(self, fingerprint: str, paths: Iterable[str], data: bool, kind: Kind,
               versions: dict[SourcePath, str | None] | None = None) -> ChangeEvent:
        return ChangeEvent(self.cluster.link.replica, self.service.manifest.digest, fingerprint,
                           tuple(sorted(paths)), data, kind, versions or {})

    def _event_arrived(self, event: ChangeEvent) -> None:
        try:
            self._inbound_send.send_nowait(event)
        except anyio.WouldBlock:  # events are lost: recover as after a reconnect, once the backlog is handled
            if not self._overflowed:
                logger.warning("cluster: %d change events wait to be handled; dropping further ones, then "
                               "starting over as after a reconnect", INBOUND_EVENTS)
            self._overflowed = True

    async def _cluster_events(self) -> None:
        """Handle other replicas' events: for each of this manifest's sources with that fingerprint (never a local
        folder or a source that pushes its own changes), invalidate and notify this replica's subscribers."""
        async for event in self._inbound:
            if self._overflowed and not self._inbound.statistics().current_buffer_used:
                self._overflowed = False
                await self._rejoined()
            try:
                sids = self._sources_of(event.source)  # none: not ours, so nothing to remember of it either
                news = None if event.kind == "listing" or not sids else self.told.received(
                    event.source, {*event.paths, *([None] if event.data else [])}, event.versions)
                for sid in sids:
                    if event.kind == "listing":
                        if self.updates.has_collection(sid):
                            await self.updates.source_polled(sid)
                    else:
                        await self.updates.apply_change(sid, set(event.paths), event.data, news)
            except Exception:
                logger.exception("handling a cluster change event of source %s failed", event.source)

    def _sources_of(self, fingerprint: str) -> list[str]:
        return [sid for sid, src in self._remote_sources().items()
                if source_fingerprint(self.service.manifest.sources[sid]) == fingerprint]

    def _remote_sources(self) -> dict[str, object]:
        """Sources whose changes travel on the bus: neither local folders nor sources that push their own."""
        return {sid: src for sid, src in self.service.sources.items()
                if src.watch_root() is None and not src.pushes_changes and sid in self.service.manifest.sources}

    async def _rejoined(self) -> None:
        """Back on the bus after events may have been lost: drop remote sources' cached content (and in Redis what
        this replica told changed meanwhile), tell legacy sessions list_changed, and end listen streams (clients
        listen again: the SDK's handler takes new streams after close; what is told after the end opens their new
        streams, but not this list_changed, which is no news to them)."""
        remote = set(self._remote_sources())
        self.service.cache.invalidate_where(Forget.of(sources=remote))
        if self.service.shared is not None:  # what changed while Redis was out, told by this replica's polls alone
            await self.service.shared.settle()
        await self.notifier.list_changed()  # everyone: what the lost events changed, and for whom, is unknown
        self.notifier.end_streams()

    def health(self) -> dict[str, object]:
        """For /healthz: whether the bus is up, this replica's id and the poll leases it holds (no Redis URL)."""
        connected = self.cluster.connected
        return {"connected": connected, "replica": self.cluster.link.replica,
                "leases": self.leases.count() if connected else 0}
