"""What the side loops cover (local roots, polled and pushing sources) and the signal that a reload changed it."""

from __future__ import annotations

import anyio

from aggregator.service import ResourceService

__all__ = ["Plan", "watch_plan"]


def watch_plan(service: ResourceService) -> tuple[object, ...]:
    """What the watchers and pollers cover: local roots and polled sources (by source object: a source whose
    settings changed is another one, with another poll lease) and poll intervals."""
    sources = service.sources
    return (tuple(sorted((sid, id(src)) for sid, src in sources.items() if src.watch_root() is not None)),
            tuple(sorted((sid, spec.poll, id(sources.get(sid))) for sid, spec in
                         service.manifest.sources.items() if spec.poll)),
            tuple(sorted((sid, id(src)) for sid, src in sources.items() if src.pushes_changes)))


class Plan:
    """The loops' shared state: the local sources being watched, and one event per kind of loop that a reload sets
    when the plan changed (each loop takes a fresh one as it starts over)."""

    def __init__(self) -> None:
        self.watched: set[str] = set()
        """Local sources whose watcher is running: a reload reuses their unchanged collections (the watcher keeps
        them current)."""
        self.sources_changed = anyio.Event()
        """Local roots or polled sources changed: folder watchers and pollers start again."""
        self.pushers_changed = anyio.Event()
        """Sources that push their own changes changed: listen to them again."""

    def changed(self) -> None:
        self.sources_changed.set()
        self.pushers_changed.set()
