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

from aggregator.catalog import FileTarget
from aggregator.content import Content
from aggregator.errors import RequestError
from aggregator.reads.file import file_key, typed, unpacked
from aggregator.reads.reader import Reader, Served, served_of
from aggregator.snapshot import Leases, Snapshot
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
    limits = snapshot.limits[target.source]
    cache, calls, source = reader.caches.cache, reader.calls, snapshot.sources[target.source]
    key = file_key(target, snapshot.epochs[target.source])
    flight = cache.lead(key)
    if flight is None:
        return None

    ended = False

    def answered(outcome: Blob | Exception | None) -> None:
        nonlocal ended
        ended = True
        leases.let_go(snapshot)
        try:
            content = _content(target, outcome, limits.max_bytes, source.url_paths)
        except SourceError as exc:
            failure: Exception = calls.failure(snapshot, target, exc)
        except Exception as exc:  # noqa: BLE001 - what a read raises, for the handler to map
            failure = exc
        else:
            if content is None:
                cache.land(key, flight, limits.policy)
                done(None)
            else:
                calls.succeeded(target.source)
                cache.land(key, flight, limits.policy, content)
                done(served_of(snapshot, target, scopes, content))
            return
        cache.land(key, flight, limits.policy, error=failure)
        done(failure)

    give_up = source.relay(target.path, limits.max_bytes, answered)
    if give_up is None:
        cache.land(key, flight, limits.policy)
        return None
    leases.hold(snapshot)

    def cancel() -> None:
        nonlocal ended
        if ended:
            return
        ended = True
        give_up()
        leases.let_go(snapshot)
        cache.land(key, flight, limits.policy)

    return cancel


def _content(target: FileTarget, outcome: Blob | Exception | None, max_bytes: int, url_paths: bool
             ) -> Content | None:
    """What `outcome` serves of `target` (None: not read); the failure it holds, raised."""
    if outcome is None:
        return None
    if isinstance(outcome, Exception):
        raise outcome
    return typed(target, outcome, unpacked(target, outcome, max_bytes, url_paths))
