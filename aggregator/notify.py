"""Change fan-out to both wires: legacy sessions (`resources/subscribe`) and modern listen streams (the bus).

The SDK builds a session object per message, so a legacy connection is remembered by its `Connection` with
the session of its `notifications/initialized` (not tied to any request), and forgotten through the
connection's exit stack when it closes: nothing piles up. Listen streams the server ends (`end_streams()`) are
listened to again by their clients; what is told in between is replayed to the new streams (`_Replay`).

Each connection and stream is told as its caller's scopes say: `list_changed` only when that caller's listing
changed (a `ListingChange`, asked per distinct set of scopes), `updated` only for URIs it may read then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourcesListChanged, ResourceUpdated
from mcp.server.subscriptions import ServerEvent, SubscriptionBus

from aggregator.listing_change import EVERYONE, ListingChange

if TYPE_CHECKING:
    import mcp.types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.session import ServerSession

    from aggregator.sdk_compat import Connection

__all__ = ["ListChanged", "Notifier", "TooManySubscriptions", "listing_of"]

logger = logging.getLogger("aggregator.notify")

DEFAULT_MAX_SUBSCRIPTIONS = 1000
REPLAY_SECONDS = 10.0
"""After `end_streams()`, how long what is told is kept for the listen streams that open next (clients listening
again): longer than a client takes to listen again, short enough that a new client hears little of the past."""
REPLAY_EVENTS = 256
"""Events kept for them at most (fewer than a stream buffers); past it none are kept, and a client listening again
after that learns of the gap only from its stream's end (it reads again, as after any dropped stream)."""


@dataclass(frozen=True)
class ListChanged(ResourcesListChanged):
    """`list_changed` on the bus, with whose listings changed: each listen stream passes it only if its caller's
    did (the SDK sends it as any `ResourcesListChanged`)."""

    listing: ListingChange = EVERYONE


def listing_of(event: ResourcesListChanged) -> ListingChange:
    """Whose listings the `list_changed` event `event` is about (everyone's, unless it says)."""
    return event.listing if isinstance(event, ListChanged) else EVERYONE


class TooManySubscriptions(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"subscription limit reached ({limit} per connection)")
        self.limit = limit


class Notifier:
    """Who listens for what, and sending `list_changed` / `updated` to exactly them."""

    def __init__(self, bus: SubscriptionBus | None = None, max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS) -> None:
        self.bus: SubscriptionBus = bus or InMemorySubscriptionBus()
        self._replay = _Replay(self.bus)
        """The bus as listen streams see it: what is told after `end_streams()` reaches the next streams too."""
        self.max_subscriptions = max_subscriptions
        self._sessions: dict[Connection, ServerSession] = {}
        self._scopes: dict[Connection, frozenset[str] | None] = {}  # each legacy connection's caller's (None: all)
        self._subscriptions: dict[Connection, set[str]] = {}
        self._visible: dict[Connection, Callable[[str], bool]] = {}
        self._listens: dict[object, frozenset[str]] = {}
        self.sent_list_changed = 0
        self.sent_updated = 0
        self._listen = ListenHandler(_CallerEvents(self._replay, None, None), max_subscriptions=max_subscriptions)
        self._scoped: set[ListenHandler] = set()  # one per open stream of a caller who sees only part of the catalog
        self.subscription_listeners: list[Callable[[], None]] = []
        self.interest: list[Callable[[], Iterable[str]]] = []
        """Other URIs to watch as if subscribed (the console's open previews); call `interest_changed` after."""
        """Told when the set of subscribed URIs may have changed (sources that push changes ask for exactly those)."""
        self.close_listeners: list[Callable[[], None]] = []
        """Told when serving stops, so streams of their own (the console's events) end with the listen streams."""

    def interest_changed(self) -> None:
        """What `interest` gives changed: pushed and polled sources look at the new set."""
        self._subscriptions_changed()

    def _subscriptions_changed(self) -> None:
        for listener in self.subscription_listeners:
            listener()

    # --- legacy wire ---------------------------------------------------------------------------------

    def register(self, connection: Connection, session: ServerSession, scopes: frozenset[str] | None) -> None:
        """A legacy connection that should hear list_changed when the listing of a caller holding `scopes` (None:
        one who sees everything) changes, and the session to send through."""
        if connection in self._sessions:
            return
        self._sessions[connection] = session
        self._scopes[connection] = scopes
        connection.exit_stack.callback(self._forget, connection)

    def _forget(self, connection: Connection) -> None:
        self._sessions.pop(connection, None)
        self._scopes.pop(connection, None)
        had = self._subscriptions.pop(connection, None)
        self._visible.pop(connection, None)
        if had:
            self._subscriptions_changed()

    def subscribe(self, connection: Connection, session: ServerSession, uri: str,
                  visible: Callable[[str], bool] | None = None, *, scopes: frozenset[str] | None) -> None:
        """With `visible`, the connection hears `updated` only for URIs it admits when the event is sent; `scopes`
        as `register` takes them."""
        self.register(connection, session, scopes)
        if visible is not None:
            self._visible[connection] = visible
        uris = self._subscriptions.setdefault(connection, set())
        if uri not in uris and len(uris) >= self.max_subscriptions:
            raise TooManySubscriptions(self.max_subscriptions)
        if uri not in uris:
            uris.add(uri)
            self._subscriptions_changed()

    def unsubscribe(self, connection: Connection, uri: str) -> None:
        uris = self._subscriptions.get(connection, set())
        if uri in uris:
            uris.discard(uri)
            self._subscriptions_changed()

    # --- modern wire ---------------------------------------------------------------------------------

    async def listen(self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams,
                     scopes: frozenset[str] | None, visible: Callable[[str], bool] | None = None) -> Any:
        """`subscriptions/listen`: the SDK's handler, with the stream's URIs recorded while it is open.

        The stream hears list_changed when the listing of a caller holding `scopes` changed (None: one who sees
        everything, whose streams share a handler). With `visible`, it hears `updated` only for URIs it says the
        caller may see when the event is sent (a URI may appear, or gain or lose `access`, after the stream opened).
        """
        uris = params.notifications.resource_subscriptions or ()
        if len(uris) > self.max_subscriptions:
            raise TooManySubscriptions(self.max_subscriptions)
        handler = self._listen
        if scopes is not None or visible is not None:
            if len(self._scoped) >= self.max_subscriptions:
                raise TooManySubscriptions(self.max_subscriptions)
            handler = ListenHandler(_CallerEvents(self._replay, scopes, visible),
                                    max_subscriptions=self.max_subscriptions)
            self._scoped.add(handler)
        token = object()
        self._listens[token] = frozenset(uris)
        if uris:
            self._subscriptions_changed()
        try:
            return await handler(ctx, params)
        finally:
            del self._listens[token]
            self._scoped.discard(handler)
            if uris:
                self._subscriptions_changed()

    def end_streams(self) -> None:
        """End every open listen stream gracefully (each sends its final result). Not final: the SDK's handler
        takes new streams afterwards, which is how clients re-listen after a cluster reconnect; what is told until
        they do is replayed to their new streams (for REPLAY_SECONDS)."""
        self._listen.close()
        for handler in list(self._scoped):
            handler.close()
        self._replay.ended()

    def close(self) -> None:
        """Serving stops: end the listen streams, and tell `close_listeners` (their own streams end too)."""
        self.end_streams()
        for listener in self.close_listeners:
            listener()

    # --- sending -------------------------------------------------------------------------------------

    def subscribed_uris(self) -> set[str]:
        """Every URI some connection, on either wire, is subscribed to now."""
        uris: set[str] = set()
        for subscribed in list(self._subscriptions.values()):
            uris |= subscribed
        for listened in self._listens.values():
            uris |= listened
        for more in self.interest:
            uris |= set(more())
        return uris

    @property
    def legacy_sessions(self) -> int:
        return len(self._sessions)

    @property
    def listen_streams(self) -> int:
        """Modern `subscriptions/listen` streams open now."""
        return len(self._listens)

    async def list_changed(self, listing: ListingChange = EVERYONE) -> None:
        """Tell the legacy sessions and listen streams whose caller's listing `listing` changed (each distinct set
        of scopes asked once)."""
        self.sent_list_changed += 1
        seen: dict[frozenset[str] | None, bool] = {}
        for connection, session in list(self._sessions.items()):
            scopes = self._scopes.get(connection, frozenset())
            if scopes not in seen:
                seen[scopes] = listing.seen_by(scopes)
            if seen[scopes]:
                await _send(session.send_resource_list_changed())
        await self._replay.publish(ListChanged(listing))

    async def updated(self, uris: Iterable[str]) -> None:
        for uri in uris:
            self.sent_updated += 1
            for connection, subscribed in list(self._subscriptions.items()):
                session = self._sessions.get(connection)
                visible = self._visible.get(connection)
                if session is not None and uri in subscribed and (visible is None or visible(uri)):
                    await _send(session.send_resource_updated(uri))
            await self._replay.publish(ResourceUpdated(uri=uri))


class _Replay:
    """A bus that keeps what is published for a while after the listen streams were ended, and gives it to each
    stream that subscribes meanwhile before the live events: a client that listens again hears every event of
    the gap once (the SDK replays nothing, and the ended stream took none of them: its buffer was closed)."""

    def __init__(self, bus: SubscriptionBus) -> None:
        self._bus = bus
        self._until = 0.0  # monotonic time until which events are kept
        self._kept: list[ServerEvent] = []

    def ended(self) -> None:
        """The listen streams were ended now: keep what is published from now on."""
        self._until = time.monotonic() + REPLAY_SECONDS
        self._kept = []

    def _keeping(self) -> bool:
        if time.monotonic() < self._until:
            return True
        self._kept = []
        return False

    async def publish(self, event: ServerEvent) -> None:
        if self._keeping():
            if len(self._kept) < REPLAY_EVENTS:
                self._kept.append(event)
            else:  # a partial replay would pass for a whole one: keep none
                self._until, self._kept = 0.0, []
                logger.info("more than %d events since the listen streams were ended: clients listening again "
                            "hear none of them (their streams' end tells them to read again)", REPLAY_EVENTS)
        await self._bus.publish(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        # The SDK subscribes a stream before its ack and sends what it buffered after it, in order.
        if self._keeping():
            for event in list(self._kept):
                listener(event)
        return self._bus.subscribe(listener)


class _CallerEvents:
    """A view of a bus for the listen streams of callers holding `scopes` (None: who see everything): list_changed
    passes only when their listing changed, `updated` only for URIs `visible` admits (None: every URI)."""

    def __init__(self, bus: SubscriptionBus, scopes: frozenset[str] | None,
                 visible: Callable[[str], bool] | None) -> None:
        self._bus, self._scopes, self._visible = bus, scopes, visible

    async def publish(self, event: ServerEvent) -> None:
        await self._bus.publish(event)

    def _passes(self, event: ServerEvent) -> bool:
        if isinstance(event, ResourceUpdated):
            return self._visible is None or self._visible(event.uri)
        return not isinstance(event, ResourcesListChanged) or listing_of(event).seen_by(self._scopes)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        def deliver(event: ServerEvent) -> None:
            if self._passes(event):
                listener(event)

        return self._bus.subscribe(deliver)


async def _send(sending: Awaitable[None]) -> None:
    try:
        await sending
    except Exception:  # a peer that went away must not stop the fan-out to the others
        logger.debug("dropping a notification for a closed session", exc_info=True)
