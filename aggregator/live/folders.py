"""Watch the local folders of the current manifest (sources with a `watch_root()`) and hand on what changed."""

from __future__ import annotations

import anyio

from aggregator.live.plan import Plan
from aggregator.service import ResourceService
from aggregator.watch import FolderCallback, watch_folders

__all__ = ["watch_sources"]


async def watch_sources(service: ResourceService, plan: Plan, on_change: FolderCallback) -> None:
    """Watch the local folders of the current manifest; start again when a reload changes them."""
    watched: dict[str, object] = {}  # by source id, the source a watcher was started for
    while True:
        roots = {sid: root for sid, src in service.sources.items() if (root := src.watch_root()) is not None}
        plain = {folder: mtime for sid in roots for folder, mtime in service.sources[sid].plain_folders().items()}
        # What changed between a listing and the watch is looked for once a source's first watch is up; a watcher
        # made again (a reload) follows one that heard those changes already.
        fresh = [sid for sid in roots if watched.get(sid) is not service.sources[sid]]
        since = {folder: mtime for sid in fresh for folder, mtime in service.sources[sid].folder_times().items()}
        watched = {sid: service.sources[sid] for sid in roots}
        plan.watched = set(roots)
        plan.sources_changed = anyio.Event()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_folders, roots, on_change, stop, plain, since)

            async def restart(stop: anyio.Event) -> None:
                await plan.sources_changed.wait()
                stop.set()

            tg.start_soon(restart, stop)
            if not roots:
                await plan.sources_changed.wait()
                tg.cancel_scope.cancel()
