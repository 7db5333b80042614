"""A read relayed in callbacks: the uncached read of a source that can answer without a task (`Source.relay`: an
MCP upstream over stdio), served from the pipe callback that brings its answer.

Awaited, such a read crossed the reader's, the cache's and the source call's coroutines, a task and two more turns
of the event loop: more than the upstream spent serving it (benchmarks/upstream_hop.py). Here it is the same read
in the same order (the catalog's resolution and access, the cache's single flight led as any miss, the source's
failures counted and turned into the client's errors, the content typed, its ttl and cache scope), with nothing
awaited. Only what the cache could not keep goes this way (the source's ttl is 0: each read asks the upstream);
anything else, and any read this cannot start at once (no free lane, a load already under way, a copy to
revalidate), returns None and is read the usual way.
"""

from __future__ import annotations

from collections.abc import Callable

from aggregator.cache import ContentCache, Flight
from aggregator.cache_keys import CacheKey
from aggregator.catalog import FileTarget
from aggregator.content import Content
from aggregator.errors import RequestError
from aggregator.reads.backend import SourceCalls
from aggregator.reads.file import file_key, typed
from aggregator.reads.reader import Reader, Served, served_of
from aggregator.snapshot import Leases, Snapshot, SourceLimits
from aggregator.sources import Blob, SourceError

__all__ = ["Relayed", "relay_read"]

Relayed = Callable[[Served | Exception | None], None]
"""Told how a relayed read ended: what it serves, the failure a read would raise, or None (not read: ask again the
usual way, as a read would have gone to the upstream's next connection)."""


def relay_read(reader: Reader, leases: Leases, snapshot: Snapshot, uri: str, scopes: frozenset[str] | None,
               done: Relayed) -> Callable[[], None] | None:
    """Start the read of `uri` for a caller holding `scopes` in callbacks, `done` told its end; returns how to give
    it up (nothing is told then), or None when it must be read the usual way (nothing started)."""
    if not snapshot.relayed or reader.caches.shared is not None:
        return None  # no source can, or a copy may be kept in the cluster: the cache's own path loads it
    try:
        target = snapshot.allowed(uri, scopes)
    except RequestError:
        return None  # the usual way says so, in its own words
    if (type(target) is not FileTarget or target.source not in snapshot.relayed or target.convert is not None
            or target.decompress):
        return None
    return _Relay().start(reader.caches.cache, reader.calls, leases, snapshot, target, scopes, done)


class _Relay(Flight[Content]):
    """One relayed read: the cache's flight of its key (what reads of the key meanwhile follow) and the read's
    state, with its callbacks as bound methods (one object per read, not two closures over a dozen cells).
    Made bare and filled by `start` (no `__init__`: a Python one is a good part of what a read costs)."""

    _cache: ContentCache[CacheKey, Content]
    _calls: SourceCalls
    _leases: Leases
    _snapshot: Snapshot
    _target: FileTarget
    _scopes: frozenset[str] | None
    _told: Relayed
    _key: CacheKey
    _limits: SourceLimits
    _give_up: Callable[[], None]

    def start(self, cache: ContentCache[CacheKey, Content], calls: SourceCalls, leases: Leases, snapshot: Snapshot,
              target: FileTarget, scopes: frozenset[str] | None, done: Relayed) -> Callable[[], None] | None:
        """`relay_read` of `target` (relayed: no decompression, no conversion) once resolved and allowed."""
        self._key = key = file_key(target, snapshot.epochs[target.source])
        if not cache.lead(key, self):
            return None  # a copy, or a load under way: the usual way serves it from them
        self._limits = limits = snapshot.limits[target.source]
        self._cache, self._calls, self._leases, self._snapshot = cache, calls, leases, snapshot
        self._target, self._scopes, self._told = target, scopes, done
        give_up = snapshot.sources[target.source].relay(target.path, limits.max_bytes, self._answered)
        if give_up is None:
            cache.land(key, self, limits.policy)
            return None
        leases.hold(snapshot)
        self._give_up = give_up
        return self._cancel

    def _answered(self, outcome: Blob | Exception | None) -> None:
        """The source's outcome: landed in the cache for the read's followers, then told."""
        self.ended = True  # landed below whatever happens: a cancel from here on does nothing
        target, cache, policy = self._target, self._cache, self._limits.policy
        self._leases.let_go(self._snapshot)
        if outcome is None:
            cache.land(self._key, self, policy)
            self._told(None)
            return
        if isinstance(outcome, Exception):
            failure = self._calls.failure(self._snapshot, target, outcome) if isinstance(outcome, SourceError) \
                else outcome
        else:
            try:
                # Not decompressed (`relay_read` refuses those): `unpacked` gives the blob's own bytes, None while
                # they are its text not encoded yet (`Blob.raw`).
                content = typed(target, outcome, outcome.raw)
            except Exception as exc:  # noqa: BLE001 - what a read raises, for the handler to map
                failure = exc
            else:
                self._calls.succeeded(target.source)
                cache.land(self._key, self, policy, content)
                self._told(served_of(self._snapshot, target, self._scopes, content))
                return
        cache.land(self._key, self, policy, error=failure)
        self._told(failure)

    def _cancel(self) -> None:
        """Give the read up: the source told, the snapshot let go, its followers sent to load again."""
        if not self.ended:  # once: a second cancel, or one after the answer, does nothing
            self.ended = True  # before the source is told, as the answer sets it first
            self._give_up()
            self._leases.let_go(self._snapshot)
            self._cache.land(self._key, self, self._limits.policy)
