"""One connection made to an upstream: its client, its HTTP session's traffic, whether (and why) it was lost, and
the URIs it subscribed to on the legacy wire."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
from mcp import Client

from aggregator.upstream.http_session import SessionWatch
from aggregator.upstream.lane import Lane

__all__ = ["Link"]


@dataclass(eq=False)
class Link:
    client: Client
    session: SessionWatch | None = None
    """A 2025-11-25 HTTP session's traffic as our transport saw it (None for stdio)."""
    lost: anyio.Event = field(default_factory=anyio.Event)
    reason: str | None = None
    subscribed: set[str] = field(default_factory=set)
    lane: Lane | None = None
    """Reads past the SDK's client (stdio only), once the handshake is known."""

    def mark_lost(self, reason: str) -> None:
        """The connection is unusable: the runner closes it and connects again (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason
        self.lost.set()
