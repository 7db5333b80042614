"""Sources that tell of their own changes (MCP upstreams): listen to them, tell them what subscribers want, and
hand on what they tell, off their connection's task."""

from __future__ import annotations

import functools
import logging

import anyio

from aggregator.live.pacing import RelistPace
from aggregator.live.plan import Plan
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.watch import Change

__all__ = ["PushedChanges"]

logger = logging.getLogger("aggregator.supervisor")  # one logger for every side loop


class PushedChanges:
    """What pushing sources told, noted on their task and applied by `run`'s own; their wants kept current."""

    def __init__(self, service: ResourceService, notifier: Notifier, updates: CatalogUpdates, plan: Plan) -> None:
        self.service = service
        self.notifier = notifier
        self.updates = updates
        self.plan = plan
        self._pushed = anyio.Event()
        self._pushed_paths: dict[str, set[str]] = {}
        self._pushed_listings: set[str] = set()
        self.pace = RelistPace()
        self._wants_dirty = anyio.Event()
        notifier.subscription_listeners.append(self._wants_changed)
        service.change_listeners.append(lambda files: self._wants_changed() if files is None else None)

    async def run(self) -> None:
        """Listen to every source that pushes changes, ask it for the paths subscribers want, and handle what it
        tells; listen again when a reload changes those sources."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._handle_pushed)
            tg.start_soon(self._keep_wants)
            while True:
                self.plan.pushers_changed = anyio.Event()
                for sid, src in self.service.sources.items():
                    if src.pushes_changes:
                        src.changes(functools.partial(self.source_changed, sid))
                self.pace.forget(self.service.sources)
                self._wants_changed()
                await self.plan.pushers_changed.wait()

    async def source_changed(self, source: str, paths: frozenset[str] | None) -> None:
        """A source's own change event (paths changed, or None: its listing may have): noted, handled later."""
        if paths is None:
            self._pushed_listings.add(source)
        else:
            self._pushed_paths.setdefault(source, set()).update(paths)
        self._pushed.set()

    async def _handle_pushed(self) -> None:
        while True:
            # A source's listing events wait for their turn (`RelistPace`), gathered in one set meanwhile: a flood
            # costs one relist in flight and one queued per source.
            with anyio.move_on_at(self.pace.next_due(self._pushed_listings)):
                await self._pushed.wait()
            self._pushed = anyio.Event()
            paths, self._pushed_paths = self._pushed_paths, {}
            listings = self.pace.ready(self._pushed_listings, anyio.current_time())
            self._pushed_listings -= listings
            try:
                for sid, changed in paths.items():
                    if sid in self.service.sources:
                        await self.updates.files_changed(sid, {(Change.modified, path) for path in changed})
                # Each source listed again alone, spliced into the catalog in place; our own list_changed only when
                # our listing changed (an upstream's may not touch what we list).
                for sid in sorted(listings):
                    if sid in self.service.sources and self.updates.has_collection(sid):
                        started = anyio.current_time()
                        try:
                            await self.updates.upstream_listed(sid)
                        finally:
                            self.pace.relisted({sid}, started, anyio.current_time())
            except Exception:
                logger.exception("handling the change events of source(s) %s failed",
                                 ", ".join(map(repr, sorted({*paths, *listings}))))

    def _wants_changed(self) -> None:
        self._wants_dirty.set()

    async def _keep_wants(self) -> None:
        """Tell each pushing source the paths our subscribers (and the renders they subscribed to) read."""
        while True:
            await self._wants_dirty.wait()
            self._wants_dirty = anyio.Event()
            subscribed = self.notifier.subscribed_uris()
            wanted = self.service.paths_by_source(subscribed | self.service.render_inputs(subscribed))
            for sid, src in self.service.sources.items():
                if src.pushes_changes:
                    src.want(wanted.get(sid, set()))
