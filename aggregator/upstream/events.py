"""An upstream's change events, relayed from whichever wire the official client negotiated: legacy notifications
(with resources/subscribe for the wanted URIs, and the HTTP session's event stream kept), or the modern wire's
listen stream with the wanted filter. Whenever changes may have gone unheard, the listener is told to look again:
an event that came with nobody listening, a gap in the event stream (none open yet, or one dropped) after a listing
began or while URIs are wanted, a lost connection. Nothing else: a listener that starts after a listing with nothing
told meanwhile is told nothing (the gateway lists its upstream once at start, not twice), and one told to list
again that has not sent its listing yet is not told again (a loss and its reconnect cost one listing, not two)."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskStatus
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
        self.listed = False
        """A listing began since the listener was last told to look (`listing`): a gap in the events may leave it
        behind."""
        self.asked = False
        """The listener was told ListChanged and no listing was sent since: the one it makes is sent after now, on a
        connection whose events are heard, so it sees any change made before it (telling it again costs a listing)."""
        self.deferred = False
        """A ListChanged not told because the listener was `asked`: told after all if a listing fails before one
        sent after it was answered (the listener may have given up)."""
        self.unread = False
        """The wanted URIs may have changed unheard: Updated for each is still to be told (once subscribed)."""

    def on_change(self, callback: EventCallback | None) -> None:
        """See `Upstream.on_change`."""
        if callback is None and self.callback is not None:
            self.missed = True  # its subscriptions go (modern: its stream too): the next listener looks again
        self.missed |= self.deferred  # what was asked of one listener is not asked of the next
        self.asked = self.deferred = False
        self.callback = callback
        self.wanted_changed.set()

    def subscribe(self, uris: Iterable[str]) -> None:
        """Ask for Updated events of exactly `uris` (legacy: resources/subscribe; modern: subscriptions/listen)."""
        wanted = frozenset(uris)
        if wanted != self.wanted:
            self.wanted = wanted
            self.wanted_changed.set()

    def listing(self) -> bool:
        """A listing of the upstream begins: a change it may miss is told unless the events carry it. Whether it is
        sent after a ListChanged `deferred` (its answer settles that)."""
        self.listed = True
        self.asked = False
        return self.deferred

    def listed_all(self, answered: bool, settles: bool) -> None:
        """A listing ended, `answered` with its pages (`settles`: sent after the deferral) or failed: a deferred
        ListChanged is settled by the first, and told after the second once events are heard; after a failure the
        listener is no longer taken to be `asked` (it may have given up on the listing it owed)."""
        if answered:
            self.deferred &= not settles
            return
        self.asked = False
        if self.deferred:
            self.deferred = False
            self.missed = True
            self.wanted_changed.set()  # the watch tells it (the next connection's, if none is up)

    async def emit(self, event: UpstreamEvent) -> None:
        """`event` to the listener, if any (with none, it is told to look again once there is one); its failure is
        logged and never ends the connection."""
        callback = self.callback
        if callback is None:
            self.missed = True
            return
        self.asked |= isinstance(event, ListChanged)
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

    async def tell_missed(self, updates: bool = True) -> None:
        """Changes may have gone unheard (`missed`): the listener looks again (ListChanged, Updated for what it
        wants; without `updates` those are left `unread`, for once the subscriptions are in place); with no listener
        yet, it is told once there is one."""
        if self.callback is None:
            return
        if self.missed:
            self.missed, self.unread = False, True
            self.listed = False  # what it lists from here on is what counts
            if self.asked:  # its listing is still to be sent: it sees what changed
                self.deferred = True
            else:
                await self.emit(ListChanged())
        if updates and self.unread:
            self.unread = False
            for uri in sorted(self.wanted):
                await self.emit(Updated(uri))

    async def heard(self) -> None:
        """Events flow after a gap (an event stream opened): what was listed, or is wanted, may have changed unheard
        meanwhile."""
        self.missed |= self.listed or bool(self.wanted)
        if self.missed:
            await self.tell_missed()

    async def watch(self, conn: Link, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the upstream's subscriptions equal to what is wanted, for as long as the connection lives; started
        once its events are heard (modern: the first listen stream acknowledged, or refused; legacy HTTP: the
        session's stream open) and what the connection before missed is told, so that a listing made after that
        misses none of them and is not asked for twice."""
        if conn.client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await self._listen(conn, task_status)
            return
        async with anyio.create_task_group() as tg:
            if conn.session is not None:  # HTTP: notifications come on the session's stream, once it is open
                await tg.start(functools.partial(
                    keep_session, conn.session, ping=functools.partial(_ping, conn.client), lost=conn.mark_lost,
                    missed=self.heard, listening=lambda: self.callback is not None,
                    interval=self.health_interval, timeout=self.timeout, grace=STREAM_GRACE))
            # What the connection before missed: ListChanged before any call is sent (the listing it asks for sees
            # all of it), Updated once the subscriptions are in place (`_sync_legacy`, which calls need not wait for).
            await self.tell_missed(updates=False)
            task_status.started()  # stdio: notifications come with the connection
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
            if self.missed or self.unread:
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

    async def _listen(self, conn: Link, task_status: TaskStatus[None]) -> None:
        """Modern wire: one listen stream, open whether anyone listens or not (what comes with nobody listening is
        told to the next listener), with the wanted filter while someone does, opened again whenever the filter
        changes. The stream it replaces closes LISTEN_OVERLAP after the new one is acknowledged, so no event falls
        between the two; changes made while none was open are told once one is (the upstream replays nothing)."""
        ready = _Once(task_status)
        async with anyio.create_task_group() as tg:
            current: anyio.CancelScope | None = None
            shown: list[str] | None = None
            """The open stream's filter."""
            while True:
                # Reset before reading what is wanted: a change from here on wakes the wait below.
                changed = self.wanted_changed = anyio.Event()
                uris = sorted(self.wanted) if self.callback is not None else []
                if current is not None and uris == shown:  # a listener came or went: the stream stays as it is
                    if self.missed:
                        await self.tell_missed()
                    await changed.wait()
                    continue
                try:
                    # The acknowledgment within one call's timeout (the SDK's own bound is the handshake's).
                    with anyio.fail_after(self.timeout):
                        opened = await tg.start(self._stream, conn, uris)
                except SubscriptionLost:
                    conn.mark_lost("the listen stream was lost")
                    ready()
                    return
                except (MCPError, TimeoutError) as exc:
                    if isinstance(exc, MCPError) and exc.code in LOST:
                        conn.mark_lost(f"listen: {quote(exc)}")
                        ready()
                        return
                    logger.warning("%s: subscriptions/listen refused: %s", self.label,
                                   quote(exc) if isinstance(exc, MCPError) else "no acknowledgment in time")
                    ready()
                    await changed.wait()
                    continue
                if current is not None:
                    tg.start_soon(_close_later, current, LISTEN_OVERLAP)
                # None was open while calls went out (the first listen was refused): a gap. The first stream of a
                # connection opens before any call is sent on it (what the connection before missed is `missed`).
                gap = current is None and ready.done
                current, shown = opened, uris
                if gap:
                    await self.heard()
                elif self.missed:
                    await self.tell_missed()
                ready()
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


class _Once:
    """Tells a task's starter it started, once however often it is called."""

    def __init__(self, task_status: TaskStatus[None]) -> None:
        self.task_status: TaskStatus[None] | None = task_status

    @property
    def done(self) -> bool:
        return self.task_status is None

    def __call__(self) -> None:
        if self.task_status is not None:
            self.task_status.started()
            self.task_status = None


async def _close_later(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()


async def _ping(client: Client) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ping is the legacy wire's, which is the only one pinged
        await client.send_ping()
