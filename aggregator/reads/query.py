"""A `QueryTarget` read: the template's SQL run by its source with the matched values as bound parameters (never
formatted into the statement), the result in the template's format, through the caches."""

from __future__ import annotations

from aggregator.cache_keys import QueryKey
from aggregator.catalog import QueryTarget
from aggregator.content import Content, decode_body
from aggregator.reads.backend import SourceCalls
from aggregator.reads.cached import Caches
from aggregator.snapshot import Snapshot

__all__ = ["query_key", "read_query"]


def query_key(target: QueryTarget, epoch: int) -> QueryKey:
    """What the result of the query `target` names is cached under, its source opened in `epoch`."""
    return QueryKey(target.source, epoch, target.query, target.params, target.format)


async def read_query(snapshot: Snapshot, target: QueryTarget, caches: Caches, calls: SourceCalls) -> Content:
    """The result of the query `target` names, from `snapshot`'s source and limits."""
    source, limits = snapshot.sources[target.source], snapshot.limits[target.source]
    # A query's values are strings or None: the catalog comma-joins lists (SQL binds scalars).
    params = {name: value for name, value in target.params if not isinstance(value, tuple)}
    sql, fmt = target.query, target.format

    async def load() -> tuple[Content, str | None]:
        blob = await calls.call("aggregator.source.read", snapshot, target, None,
                                lambda: source.query(sql, params, fmt, limits.max_bytes))
        return decode_body(blob.data, target.mime_type), None

    key = query_key(target, snapshot.epochs[target.source])
    return await caches.get_or_load(snapshot, key, load, lambda spec, cluster: cluster.query_item(
        spec, sql, target.params, fmt, limits.max_bytes, limits.ttl))
