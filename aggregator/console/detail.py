"""A resource's detail for the console's pane: what resources/list says of it, what the content cache held of it
before the read and after, and the raw resources/read result (its content cut to what a preview shows).

Built only after the read passed the caller's scopes (a hidden URI is refused as not found before anything here
runs), so it tells nothing the caller's own resources/read and resources/list would not.
"""

from __future__ import annotations

from typing import Any

from aggregator.cache import ContentCache
from aggregator.cache_keys import CacheKey
from aggregator.catalog import FileTarget, QueryTarget, RenderTarget, Target
from aggregator.console.views import entry_view
from aggregator.content import Content
from aggregator.mcp_shapes import COMPLETE, cache_scope, contents_dict, ttl_ms
from aggregator.reads.file import file_key
from aggregator.reads.query import query_key
from aggregator.reads.reader import Served
from aggregator.snapshot import Snapshot

__all__ = ["CacheLook", "cache_look", "detail_view"]

CacheLook = dict[str, Any]
"""`state`: hit (fresh), expired (held, to revalidate), miss, or uncached (never goes through the cache, `why`);
with `freshFor` (seconds, negative once expired) and `bytes` when held."""


def _key_of(snapshot: Snapshot, target: Target) -> CacheKey | None:
    """What `target`'s read is cached under in `snapshot`; None when its reads never go through the content cache."""
    if isinstance(target, FileTarget):
        return file_key(target, snapshot.epochs[target.source])
    if isinstance(target, QueryTarget):
        return query_key(target, snapshot.epochs[target.source])
    return None


def cache_look(cache: ContentCache[CacheKey, Content], snapshot: Snapshot, target: Target) -> CacheLook:
    """What the content cache holds of `target` now, without counting a lookup (O(1))."""
    key = _key_of(snapshot, target)
    if key is None:
        why = "rendered on each read" if isinstance(target, RenderTarget) else "text from the manifest"
        return {"state": "uncached", "why": why}
    held = cache.peek(key)
    if held is None:
        return {"state": "miss"}
    fresh_for, size = held
    return {"state": "hit" if fresh_for > 0 else "expired", "freshFor": round(fresh_for, 1), "bytes": size}


def detail_view(snapshot: Snapshot, uri: str, served: Served, before: CacheLook, after: CacheLook,
                limit: int) -> dict[str, Any]:
    """The pane's body: the listed entry (None for a URI only a template answers), the cache state before the read
    (with `after`), and the resources/read result as the wire carries it, its text or base64 cut at `limit`."""
    entry = snapshot.catalog.get(uri)
    contents = contents_dict(uri, served.content)
    field = "text" if "text" in contents else "blob"
    truncated = len(contents[field]) > limit
    if truncated:
        contents[field] = contents[field][:limit]
    cache = dict(before)
    if before["state"] != "uncached":
        cache["after"] = after
    return {"listed": entry_view(entry) if entry is not None else None, "cache": cache,
            "result": {"contents": [contents], "ttlMs": ttl_ms(served.ttl), "cacheScope": cache_scope(served.private),
                       **COMPLETE},
            "truncated": truncated}
