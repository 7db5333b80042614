"""The live catalog: reload the manifest when it is saved, notice changed files, and tell clients.

`Supervisor` runs the side loops of aggregator/live/ beside the server: the manifest reloader (manifest.py),
folder watchers (folders.py), pollers of `poll:` sources (polling.py), listeners of sources that push their own
changes (pushed.py) and, with `server.cluster`, this replica on the change bus (replicas.py). Each says what
changed and hands it to live/updates.py, which applies it to the catalog and tells the Notifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from aggregator.console.history import ReloadHistory
from aggregator.live.folders import watch_sources
from aggregator.live.manifest import ManifestReloader
from aggregator.live.plan import Plan
from aggregator.live.polling import Pollers
from aggregator.live.pushed import PushedChanges
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.watch import Change

if TYPE_CHECKING:  # the cluster's modules are imported only with `server.cluster`
    from aggregator.cluster.bus import ChangeBus
    from aggregator.cluster.told import SourcePath
    from aggregator.live.replicas import ClusterReplica

__all__ = ["Supervisor"]


class Supervisor:
    """Keeps an ResourceService in step with its manifest and its local folders, and notifies through a Notifier."""

    def __init__(self, service: ResourceService, notifier: Notifier, *, reload: bool = True,
                 cluster: ChangeBus | None = None) -> None:
        self.service = service
        self.notifier = notifier
        self.cluster = cluster
        """The change bus shared with the other replicas (`server.cluster`); None: this process is alone."""
        self.reload_enabled = reload
        self.history = ReloadHistory()
        """The last reloads, for the console (which turns on their diffs)."""
        self._stop = anyio.Event()
        self._plan = Plan()
        self._updates = CatalogUpdates(service, notifier)
        self._replica: ClusterReplica | None = None
        if cluster is not None:
            from aggregator.live.replicas import ClusterReplica

            self._replica = ClusterReplica(cluster, service, notifier, self._updates)
        self._reloader = ManifestReloader(service, self._updates, self._plan, self.history)
        self._pushed = PushedChanges(service, notifier, self._updates, self._plan)
        self._pollers = Pollers(service, notifier, self._updates, self._plan, self._replica)

    @property
    def reloads(self) -> int:
        return self._reloader.reloads

    @property
    def reload_errors(self) -> int:
        return self._reloader.reload_errors

    @property
    def suspicious_reloads(self) -> int:
        """Reloads held back one more settle window because they would empty a source or the catalog."""
        return self._reloader.suspicious_reloads

    @property
    def file_changes(self) -> dict[str, int]:
        """File changes applied to the catalog incrementally and by a full relist (for /metrics)."""
        return {"incremental": self._updates.incremental_relists, "relist": self._updates.full_relists}

    @property
    def last_error(self) -> str | None:
        """Why the last reload failed, for /healthz: a count, never the messages (they name files on this host)."""
        return self._reloader.last_error

    async def run(self) -> None:
        """Watch until `stop()`; run it in a task group beside the server."""
        async with anyio.create_task_group() as tg:
            if self.reload_enabled:
                tg.start_soon(self._reloader.run, self._stop)
            tg.start_soon(watch_sources, self.service, self._plan, self._updates.files_changed)
            tg.start_soon(self._pollers.run)
            tg.start_soon(self._pushed.run)
            if self._replica is not None:
                tg.start_soon(self._replica.run)
            await self._stop.wait()
            tg.cancel_scope.cancel()
        if self._replica is not None:  # another replica takes over at once rather than when they expire
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self._replica.leases.release_all()

    def stop(self) -> None:
        self._stop.set()
        if self.cluster is not None:
            self.cluster.stop()
        self.notifier.close()

    async def reload_if_changed(self) -> bool:
        """Reload if the manifest's bytes changed since the last load, once they settled; True if clients were told."""
        return await self._reloader.reload_if_changed()

    async def files_changed(self, source: str, changes: set[tuple[Change, str]]) -> None:
        """Invalidate, send `updated` to subscribers, and relist collections when files came or went."""
        await self._updates.files_changed(source, changes)

    async def source_changed(self, source: str, paths: frozenset[str] | None) -> None:
        """A source's own change event (paths changed, or None: its listing may have): noted, handled later."""
        await self._pushed.source_changed(source, paths)

    async def poll_once(self, source: str, seen: dict[str, str | None]) -> None:
        """Compare versions of the subscribed URIs of `source` with the last poll; relist its collections."""
        await self._pollers.poll_once(source, seen)

    async def poll_for_cluster(self, source: str, interval: float, seen: dict[str | None, str | None]) -> bool:
        """Poll `source` for the cluster if this replica holds its lease (see ClusterReplica.poll_for_cluster)."""
        assert self._replica is not None
        return await self._replica.poll_for_cluster(source, interval, seen)

    async def apply_change(self, source: str, files: set[str], data: bool,
                           news: set[SourcePath] | None = None) -> None:
        """These files (and, with `data`, the query results) of `source` changed: invalidate, notify (of `news`
        only, None: all)."""
        await self._updates.apply_change(source, files, data, news)

    def cluster_health(self) -> dict[str, object] | None:
        """For /healthz: whether the bus is up, this replica's id and the poll leases it holds (no Redis URL)."""
        return None if self._replica is None else self._replica.health()
