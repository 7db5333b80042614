"""The cluster's shared content cache: remote sources' bodies in Redis, under each replica's own cache.

SCAFFOLD: the interface the service and the supervisor use; the implementation lands with its tests.
"""

from __future__ import annotations

from collections.abc import Collection

from aggregator.cluster.link import RedisLink

__all__ = ["SharedContent"]


class SharedContent:
    """Bodies of remote sources kept in Redis, keyed by the source's fingerprint (never its id in one manifest)."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link

    async def forget(self, fingerprint: str, paths: Collection[str], data: bool) -> None:
        """Drop what is kept of these files of the source `fingerprint` (and, with `data`, its query results)."""
        raise NotImplementedError
