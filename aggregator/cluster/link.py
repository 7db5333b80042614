"""One replica's connection to the cluster's Redis: the client (every call bounded by `timeout`), this replica's id,
key names under the deployment's prefix, and the fingerprint that lets replicas on different manifests share nothing."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

from aggregator.cluster.seal import Seal
from aggregator.manifest.model import ClusterSettings, SourceSpec

if TYPE_CHECKING:
    import redis.asyncio

__all__ = ["RedisLink", "source_fingerprint"]


def source_fingerprint(spec: SourceSpec) -> str:
    """Equal for two replicas exactly when they read the same backend the same way (kind, URL, the kind's own
    settings): keys and events of a source are named by it, never by its id in one manifest."""
    facts = {"kind": spec.kind, "url": spec.url, "settings": spec.settings, "maxBytes": spec.max_bytes}
    text = json.dumps(facts, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class RedisLink:
    """The Redis client of one replica. `redis` is imported only here, so a manifest without `server.cluster`
    never needs it."""

    def __init__(self, settings: ClusterSettings, replica: str | None = None) -> None:
        try:
            from redis.asyncio import Redis
        except ImportError:  # checked at start-up by the CLI, which names the extra
            raise RuntimeError("server.cluster needs redis: pip install 'mcp-aggregator[cluster]'") from None
        self.settings = settings
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        """Unique per process: events it published carry it as their origin."""
        self.client: redis.asyncio.Redis = Redis.from_url(
            settings.redis, socket_timeout=settings.timeout, socket_connect_timeout=settings.timeout,
            health_check_interval=5, retry_on_timeout=False)
        self.seal = Seal(settings.secret)
        """Seals what this replica writes and opens what it reads (`server.cluster.secret`)."""

    def key(self, *parts: str) -> str:
        """A key (or channel) name under the deployment's prefix."""
        return ":".join((self.settings.prefix, *parts))

    async def aclose(self) -> None:
        await self.client.aclose()

    def describe(self) -> str:
        """Where Redis is, for logs: host and port or socket path, never a password."""
        kwargs: dict[str, Any] = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
