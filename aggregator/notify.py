"""Change fan-out to both wires: legacy sessions (`resources/subscribe`) and modern listen streams (the bus).

Sessions are held weakly, so a connection that closes takes its subscriptions with it and nothing piles up.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Any

from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourcesListChanged, ResourceUpdated
from mcp.server.subscriptions import SubscriptionBus

__all__ = ["Notifier", "TooManySubscriptions"]

logger = logging.getLogger("aggregator.notify")

DEFAULT_MAX_SUBSCRIPTIONS = 1000


class TooManySubscriptions(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"subscription limit reached ({limit} per connection)")
        self.limit = limit


class Notifier:
    """Who listens for what, and sending `list_changed` / `updated` to exactly them."""

    def __init__(self, bus: SubscriptionBus | None = None, max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS) -> None:
        self.bus: SubscriptionBus = bus or InMemorySubscriptionBus()
        self.max_subscriptions = max_subscriptions
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._subscriptions: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._listens: dict[object, frozenset[str]] = {}
        self.sent_list_changed = 0
        self.sent_updated = 0
        self._listen = ListenHandler(self.bus, max_subscriptions=max_subscriptions)

    # --- legacy wire ---------------------------------------------------------------------------------

    def register(self, session: Any) -> None:
        """A legacy session that should hear list_changed."""
        self._sessions.add(session)

    def subscribe(self, session: Any, uri: str) -> None:
        self.register(session)
        uris = self._subscriptions.setdefault(session, set())
        if uri not in uris and len(uris) >= self.max_subscriptions:
            raise TooManySubscriptions(self.max_subscriptions)
        uris.add(uri)

    def unsubscribe(self, session: Any, uri: str) -> None:
        self._subscriptions.get(session, set()).discard(uri)

    # --- modern wire ---------------------------------------------------------------------------------

    async def listen(self, ctx: Any, params: Any) -> Any:
        """`subscriptions/listen`: the SDK's handler, with the stream's URIs recorded while it is open."""
        uris = params.notifications.resource_subscriptions or ()
        if len(uris) > self.max_subscriptions:
            raise TooManySubscriptions(self.max_subscriptions)
        token = object()
        self._listens[token] = frozenset(uris)
        try:
            return await self._listen(ctx, params)
        finally:
            del self._listens[token]

    def close(self) -> None:
        self._listen.close()

    # --- sending -------------------------------------------------------------------------------------

    def subscribed_uris(self) -> set[str]:
        """Every URI some connection, on either wire, is subscribed to now."""
        uris: set[str] = set()
        for subscribed in list(self._subscriptions.values()):
            uris |= subscribed
        for listened in self._listens.values():
            uris |= listened
        return uris

    @property
    def legacy_sessions(self) -> int:
        return len(self._sessions)

    async def list_changed(self) -> None:
        self.sent_list_changed += 1
        for session in list(self._sessions):
            await _send(session.send_resource_list_changed())
        await self.bus.publish(ResourcesListChanged())

    async def updated(self, uris: Iterable[str]) -> None:
        for uri in uris:
            self.sent_updated += 1
            for session, subscribed in list(self._subscriptions.items()):
                if uri in subscribed:
                    await _send(session.send_resource_updated(uri))
            await self.bus.publish(ResourceUpdated(uri=uri))


async def _send(sending: Any) -> None:
    try:
        await sending
    except Exception:  # a peer that went away must not stop the fan-out to the others
        logger.debug("dropping a notification for a closed session", exc_info=True)
