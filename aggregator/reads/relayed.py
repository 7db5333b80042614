"""A read relayed in callbacks: the uncached read of a source that can answer without a task (`Source.relay_route`:
an MCP upstream over stdio), served from the pipe callback that brings its answer.

Awaited, such a read crossed the reader's, the cache's and the source call's coroutines, a task and two more turns
of the event loop: more than the upstream spent serving it (benchmarks/upstream_hop.py). Here it is the same read
in the same order (the catalog's resolution and access, the cache's single flight led as any miss, the source's
failures counted and turned into the client's errors, the content typed, its ttl and cache scope), with nothing
awaited. What does not depend on the answer is resolved once per URI and snapshot (`RelayPlan`), so a read costs
little more than its answer. Only what the cache could not keep goes this way (the source's ttl is 0: each read asks
the upstream); anything else, and any read this cannot start at once (no free lane, a load already under way),
is read the usual way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregator.cache import ContentCache
from aggregator.cache_keys import CacheKey
from aggregator.catalog import FileTarget
from aggregator.content import Content, is_text_mime
from aggregator.errors import RequestError
from aggregator.reads.backend import SourceCalls
from aggregator.reads.cached import Caches
from aggregator.reads.file import declared_type, file_key, typed
from aggregator.reads.reader import Reader, Served, served_of
from aggregator.snapshot import Leases, Snapshot, SourceLimits
from aggregator.sources import Blob, SourceError
from aggregator.sources.base import RelayRoute

__all__ = ["MAX_PLANNED_URI", "MAX_PLANS", "RelayPlan", "relay_plan"]

MAX_PLANS = 4096
"""Plans kept per snapshot (a URI read again finds its own): past this many the memo starts over."""
MAX_PLANNED_URI = 4096
"""Characters of a URI past which its plan is not kept (a URI may be megabytes: the memo would hold thousands)."""


@dataclass(slots=True, eq=False)
class RelayPlan:
    """What every relayed read of one listed URI shares while its snapshot serves: its target and limits, where the
    read goes (`route`), the cache key its flight leads, and how an outcome becomes what a read serves (`served`).
    `shapes` is its caller's to keep what it made of answers alike but for their text (`text_as_sent` says when)."""

    uri: str
    snapshot: Snapshot
    target: FileTarget
    route: RelayRoute
    limits: SourceLimits
    key: CacheKey
    caches: Caches
    cache: ContentCache[CacheKey, Content]
    calls: SourceCalls
    leases: Leases
    shapes: dict[Any, Any] = field(default_factory=dict)

    def served(self, outcome: Blob | Exception | None) -> Served | Exception | None:
        """The source's outcome as a read serves it, the failure a read raises (returned), or None (not read: the
        connection was lost under it, read it again the usual way). Counted as the usual read counts it."""
        if outcome is None or isinstance(outcome, Exception):
            if isinstance(outcome, SourceError):
                return self.calls.failure(self.snapshot, self.target, outcome)
            return outcome
        try:
            # Not decompressed (plans refuse those): the blob's own bytes, None while they are its text not
            # encoded yet (`Blob.raw`).
            content = typed(self.target, outcome, outcome.raw)
        except Exception as exc:  # noqa: BLE001 - what a read raises, for the handler to map
            return exc
        self.calls.succeeded(self.target.source)
        return served_of(self.snapshot, self.target, None, content)

    def text_as_sent(self, blob: Blob, served: Served) -> bool:
        """Whether `served` serves `blob`'s text as it came, typed by what was declared (not by a look at the text):
        then a read whose answer differs only in its text serves that text in the same shape."""
        declared = declared_type(self.target, blob)
        return (served.content.text is blob.text and blob.text is not None and declared is not None
                and is_text_mime(declared))


def relay_plan(reader: Reader, leases: Leases, snapshot: Snapshot, uri: str) -> RelayPlan | None:
    """The plan of relayed reads of `uri` for a trusted caller (stdio), or None when they must be read the usual way
    (a URI the catalog lacks, a source that cannot relay or whose copies may be kept, a conversion, a decompression)."""
    if not snapshot.relayed or reader.caches.shared is not None:
        return None  # no source can, or a copy may be kept in the cluster: the cache's own path loads it
    try:
        target = snapshot.allowed(uri, None)
    except RequestError:
        return None  # the usual way says so, in its own words
    if (type(target) is not FileTarget or target.source not in snapshot.relayed or target.convert is not None
            or target.decompress):
        return None
    limits = snapshot.limits[target.source]
    route = snapshot.sources[target.source].relay_route(target.path, limits.max_bytes)
    if route is None:
        return None
    return RelayPlan(uri, snapshot, target, route, limits, file_key(target, snapshot.epochs[target.source]),
                     reader.caches, reader.caches.cache, reader.calls, leases)
