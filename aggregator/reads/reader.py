"""A read, start to end: resolve the URI on the snapshot the read leased (access checked there), run the reader for
its target type, and return the content with its ttl and cache scope from that same snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from aggregator.cache import ContentCache
from aggregator.cache_keys import CacheKey
from aggregator.catalog import FileTarget, QueryTarget, RenderTarget, Target, TextTarget
from aggregator.content import Content
from aggregator.documents.pool import DocumentPool
from aggregator.reads.backend import SourceCalls
from aggregator.reads.cached import Caches
from aggregator.reads.file import read_file
from aggregator.reads.query import read_query
from aggregator.reads.rendered import RenderInputs, read_rendered
from aggregator.snapshot import Snapshot
from aggregator.tracing import span

__all__ = ["Reader", "Served", "served_of"]


@dataclass(slots=True)
class Served:
    """A read's content with how long a client may keep it and whether it depends on who asked, all from the
    snapshot the content came from."""

    content: Content
    ttl: float
    """Seconds."""
    private: bool


class Reader:
    """Reads URIs from a snapshot, with what reads share: the caches, the source calls' error counts, and what
    each render read."""

    def __init__(self, cache: ContentCache[CacheKey, Content]) -> None:
        self.caches = Caches(cache)
        self.calls = SourceCalls()
        self.render_inputs = RenderInputs()
        self.documents = DocumentPool()
        """The worker processes of `convert:` reads (none start before the first conversion)."""

    async def read(self, snapshot: Snapshot, uri: str, scopes: frozenset[str] | None) -> Served:
        """The content of `uri` for a caller holding `scopes` (None: trusted), all from `snapshot`; ResourceNotFound,
        ResourceTooLarge, ResourceUnavailable (or another RequestError) otherwise."""
        target = snapshot.allowed(uri, scopes)
        match target:  # most reads are of files: that case first
            case FileTarget():
                content = await read_file(snapshot, target, self.caches, self.calls, self.documents)
            case TextTarget():
                content = Content(target.mime_type or "text/plain", text=target.text)
            case RenderTarget():
                async def read_nested(nested: str) -> Content:
                    return (await self.read(snapshot, nested, scopes)).content

                with span("aggregator.render", uri=target.uri):
                    content = await read_rendered(snapshot, target, scopes, read_nested, self.render_inputs)
            case QueryTarget():
                content = await read_query(snapshot, target, self.caches, self.calls)
        return served_of(snapshot, target, scopes, content)

    async def indexed(self, snapshot: Snapshot, target: FileTarget) -> Content:
        """The content of a `convert:` file for the search index: the read's own, through the content cache (one
        conversion serves both), converted as background work."""
        return await read_file(snapshot, target, self.caches, self.calls, self.documents, background=True)


def served_of(snapshot: Snapshot, target: Target, scopes: frozenset[str] | None, content: Content) -> Served:
    """`content` read of `target` for a caller holding `scopes`, with the ttl and cache scope `snapshot` gives it."""
    ttl = snapshot.ttl(target) if content.max_age is None else min(snapshot.ttl(target), content.max_age)
    # A trusted caller's read (no scopes) is never private: not asked.
    return Served(content, ttl, content.private or (scopes is not None and snapshot.private(target, scopes)))
