"""An upstream's change events, relayed from whichever wire the official client negotiated: legacy notifications
(with resources/subscribe for the wanted URIs, and the HTTP session's event stream kept), or the modern wire's
listen stream with the wanted filter. Whenever changes may have gone unheard, the listener is told to look again."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.upstream.failures import LOST, quote
from aggregator.upstream.http_session import keep_session
from aggregator.upstream.link import Link

__all__ = ["ChangeRelay", "EventCallback", "ListChanged", "Updated", "UpstreamEvent"]

logger = logging.getLogger("aggregator.upstream")

STREAM_GRACE = 3.0
"""Seconds a legacy HTTP session's dropped event stream may take to come back (the SDK retries once, after 1 s)."""
LISTEN_OVERLAP = 1.0
"""Seconds a replaced listen stream stays open after its successor's acknowledgment: an event published before the
successor subscribed may still be on its way on the old stream (the server writes the new ack first)."""


@dataclass(frozen=True, slots=True)
class ListChanged:
    """The upstream's resource listing may have changed: list again."""


@dataclass(frozen=True, slots=True)
class Updated:
    """The upstream resource `uri` may have changed: read it again."""

    uri: str


UpstreamEvent = ListChanged | Updated
EventCallback = Callable[[UpstreamEvent], Awaitable[None]]


class ChangeRelay:
    """The listener of one upstream, the URIs it wants Updated events of, and the subscriptions that keep each
    connection's wire in step with them (`watch`, for as long as the connection lives)."""

    def __init__(self, label: str, timeout: float, health_interval: float) -> None:
        self.label = label
        """Who the log names (the upstream, described without secrets)."""
        self.timeout = timeout
        self.health_interval = health_interval
        self.callback: EventCallback | None = None
        self.wanted: frozenset[str] = frozenset()
        self.wanted_changed = anyio.Event()
        self.ever_connected = False
        self.missed = False
        """Changes may have gone unheard (no listener, no stream, no connection): tell the listener once it hears."""

    def on_change(self, callback: EventCallback | None) -> None:
        """See `Upstream.on_change`."""
        if callback is not None and self.callback is None and self.ever_connected:
            self.missed = True  # nothing listened (modern: no stream was open) since whoever set it last listed
        self.callback = callback
        self.wanted_changed.set()

    def subscribe(self, uris: Iterable[str]) -> None:
        """Ask for Updated events of exactly `uris` (legacy: resources/subscribe; modern: subscriptions/listen)."""
        wanted = frozenset(uris)
        if wanted != self.wanted:
            self.wanted = wanted
            self.wanted_changed.set()

    async def emit(self, event: UpstreamEvent) -> None:
        """`event` to the listener, if any; its failure is logged and never ends the connection."""
        callback = self.callback
        if callback is None:
            return
        try:
            await callback(event)
        except Exception:  # noqa: BLE001 - a failing listener must not end the connection
            logger.exception("%s: change callback failed", self.label)

    async def on_message(self, message: Any) -> None:
        """Legacy wire notifications (the modern wire's come through the listen stream)."""
        if isinstance(message, types.ResourceListChangedNotification):
            await self.emit(ListChanged())
        elif isinstance(message, types.ResourceUpdatedNotification):
            await self.emit(Updated(str(message.params.uri)))

    async def tell_missed(self) -> None:
        """Changes may have gone unheard: the listener looks again (ListChanged, Updated for what it wants); with no
        listener yet, it is told once there is one."""
        self.missed = self.callback is None
        if not self.missed:
            await self.emit(ListChanged())
            for uri in sorted(self.wanted):
                await self.emit(Updated(uri))

    async def watch(self, conn: Link) -> None:
        """Keep the upstream's subscriptions equal to what is wanted, for as long as the connection lives."""
        if conn.client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await self._listen(conn)
        else:
            async with anyio.create_task_group() as tg:
                if conn.session is not None:
                    tg.start_soon(functools.partial(
                        keep_session, conn.session, ping=functools.partial(_ping, conn.client), lost=conn.mark_lost,
                        missed=self.tell_missed, listening=lambda: self.callback is not None,
                        interval=self.health_interval, timeout=self.timeout, grace=STREAM_GRACE))
                await self._sync_legacy(conn)

    async def _sync_legacy(self, conn: Link) -> None:
        caps = conn.client.server_capabilities.resources
        while True:
            changed = self.wanted_changed = anyio.Event()
            if caps is not None and caps.subscribe:
                wanted = set(self.wanted) if self.callback is not None else set()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # resources/subscribe is the legacy wire's way
                    for uri in sorted(wanted - conn.subscribed):
                        await self._quietly(conn, "resources/subscribe", conn.client.subscribe_resource, uri)
                        conn.subscribed.add(uri)
                    for uri in sorted(conn.subscribed - wanted):
                        await self._quietly(conn, "resources/unsubscribe", conn.client.unsubscribe_resource, uri)
                        conn.subscribed.discard(uri)
            if self.missed:
                await self.tell_missed()
            await changed.wait()

    async def _quietly(self, conn: Link, what: str, fn: Callable[[str], Awaitable[Any]], uri: str) -> None:
        try:
            with anyio.fail_after(self.timeout):
                await fn(uri)
        except MCPError as exc:
            if exc.code in LOST:
                conn.mark_lost(f"{what}: {quote(exc)}")
            logger.warning("%s: %s %s failed: %s", self.label, what, uri, quote(exc))
        except TimeoutError:
            logger.warning("%s: %s %s: no answer within %gs", self.label, what, uri, self.timeout)

    async def _listen(self, conn: Link) -> None:
        """Modern wire: one listen stream with the wanted filter, opened again whenever the filter changes. The
        stream it replaces closes LISTEN_OVERLAP after the new one is acknowledged, so no event falls between the two;
        changes made while none was open are told once one is (the upstream replays nothing)."""
        async with anyio.create_task_group() as tg:
            current: anyio.CancelScope | None = None
            while True:
                # Reset before reading what is wanted: a change from here on wakes the wait below.
                changed = self.wanted_changed = anyio.Event()
                if self.callback is None:
                    if current is not None:
                        current.cancel()
                        current = None
                    await changed.wait()
                    continue
                try:
                    # The acknowledgment within one call's timeout (the SDK's own bound is the handshake's).
                    with anyio.fail_after(self.timeout):
                        opened = await tg.start(self._stream, conn, sorted(self.wanted))
                except SubscriptionLost:
                    conn.mark_lost("the listen stream was lost")
                    return
                except (MCPError, TimeoutError) as exc:
                    if isinstance(exc, MCPError) and exc.code in LOST:
                        conn.mark_lost(f"listen: {quote(exc)}")
                        return
                    logger.warning("%s: subscriptions/listen refused: %s", self.label,
                                   quote(exc) if isinstance(exc, MCPError) else "no acknowledgment in time")
                    await changed.wait()
                    continue
                if current is not None:
                    tg.start_soon(_close_later, current, LISTEN_OVERLAP)
                current = opened
                if self.missed:
                    await self.tell_missed()
                await changed.wait()

    async def _stream(self, conn: Link, uris: list[str], *, task_status: Any) -> None:
        """One listen stream: started (its cancel scope given) once acknowledged, then relayed until cancelled."""
        with anyio.CancelScope() as scope:
            async with conn.client.listen(resources_list_changed=True, resource_subscriptions=uris) as sub:
                task_status.started(scope)
                await self._relay(conn, sub)

    async def _relay(self, conn: Link, sub: Any) -> None:
        """Events of one listen stream to the callback; its end (graceful or not) means the upstream is going."""
        try:
            async for event in sub:
                if isinstance(event, ResourcesListChanged):
                    await self.emit(ListChanged())
                elif isinstance(event, ResourceUpdated):
                    await self.emit(Updated(str(event.uri)))
            conn.mark_lost("the upstream ended the listen stream")
        except SubscriptionLost:
            conn.mark_lost("the listen stream was lost")


async def _close_later(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()


async def _ping(client: Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ping is the legacy wire's, which is the only one pinged
        await client.send_ping()
