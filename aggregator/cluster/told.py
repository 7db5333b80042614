"""What this replica's listeners were told: per remote source (by fingerprint) and path, the version last announced
here, so that a change reaches each listener once, across Redis outages too.

While Redis is out each replica polls alone and tells its own listeners; when Redis is back the lease holder
compares with the versions kept in Redis before the outage and publishes the change again. Both sides ask this
ledger: the holder tells its own listeners only versions they were not told, and a replica receiving an event
tells only paths whose version differs from the one it told. The holder's versions are recorded here too, so a
holder that loses Redis compares its first poll alone with what it polled last, not with nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

__all__ = ["SourcePath", "ToldVersions"]

SourcePath = str | None
"""A file of the source, or None for its query results."""
Versions = Mapping[SourcePath, str | None]

MAX_PATHS = 20_000
"""Paths remembered per source (past it the oldest are forgotten: a forgotten path is told as news, never lost)."""
MAX_SOURCES = 256
"""Sources remembered (a reload that changes a source's settings gives it another fingerprint)."""


class ToldVersions:
    """Per source fingerprint, the version of each path this replica's listeners were last told of."""

    def __init__(self, max_paths: int = MAX_PATHS, max_sources: int = MAX_SOURCES) -> None:
        self._told: dict[str, dict[SourcePath, str | None]] = {}
        self._max_paths = max_paths
        self._max_sources = max_sources

    def _compare(self, fingerprint: str, versions: Versions, baseline: Versions) -> tuple[set[SourcePath],
                                                                                           set[SourcePath]]:
        """(changed, news): a path changed if its version differs from `baseline`'s or, absent there, from the one
        told here (absent from both: not changed, the first poll only takes a baseline); it is news unless this
        version is the one told here."""
        told = self._told.get(fingerprint, {})
        changed = {path for path, version in versions.items()
                   if (baseline[path] != version if path in baseline else path in told and told[path] != version)}
        return changed, {path for path in changed if path not in told or told[path] != versions[path]}

    def polled(self, fingerprint: str, versions: Versions, baseline: Versions) -> tuple[set[SourcePath],
                                                                                         set[SourcePath]]:
        """A lease holder's poll: (the paths to publish as changed, those of them to tell here). `baseline` is what
        the cluster was last told (the versions kept in Redis). Every polled version is remembered as told: the
        holder's baseline should it poll alone next."""
        changed, news = self._compare(fingerprint, versions, baseline)
        self.remember(fingerprint, versions)
        return changed, news

    def alone(self, fingerprint: str, versions: Versions, baseline: Versions) -> set[SourcePath]:
        """A poll by this replica alone (Redis out), `baseline` its previous one: the paths to tell, remembered as
        told. A first version that is not news is not remembered: it may be a change nobody here was told of, which
        the lease holder then publishes when Redis is back."""
        _, news = self._compare(fingerprint, versions, baseline)
        self.remember(fingerprint, {path: versions[path] for path in news})
        return news

    def received(self, fingerprint: str, paths: Collection[SourcePath], versions: Versions) -> set[SourcePath]:
        """Another replica's event for `paths`, with the `versions` it saw (an event may carry none): the paths to
        tell here, remembered as told."""
        told = self._told.get(fingerprint, {})
        news = {path for path in paths if path not in versions or path not in told or told[path] != versions[path]}
        self.remember(fingerprint, {path: versions[path] for path in paths if path in versions})
        return news

    def knows(self, fingerprint: str) -> Collection[SourcePath]:
        """The paths of the source whose told version is kept here."""
        return self._told.get(fingerprint, {}).keys()

    def remember(self, fingerprint: str, versions: Versions) -> None:
        if not versions:
            return
        told = self._told.pop(fingerprint, None)
        if told is None:
            told = {}
            while len(self._told) >= self._max_sources:
                del self._told[next(iter(self._told))]
        self._told[fingerprint] = told  # most recently used last
        for path, version in versions.items():
            told.pop(path, None)
            told[path] = version
        while len(told) > self._max_paths:
            del told[next(iter(told))]
