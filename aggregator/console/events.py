"""Server-sent events for open console pages: the catalog changed, a resource was updated, a reload finished.

Each stream has a bounded queue: a page that stops reading loses events and gets one `resync` instead (it then
reloads what it shows), so a stalled tab never holds memory. Streams are capped, in all and per caller, and the
last few are kept for holders of the admin scope, so one token cannot lock operators out; a closed tab ends its
stream at once (`EventStreamResponse` waits for the client's disconnect beside the stream, and the stream then
unsubscribes and gives its slot back). What a stream passes is decided as each event is sent, by what its caller may
see then: a reload that hides a source from it (or shows one) applies to the streams already open.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent, SubscriptionBus
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from aggregator.console.history import ReloadHistory, ReloadRecord
from aggregator.listing_change import NO_CHANGE, ListingChange
from aggregator.notify import listing_of

__all__ = ["EventHub", "EventStreamResponse", "TooManyStreams"]

logger = logging.getLogger("aggregator.console")

QUEUE = 64
"""Events a stream holds for a page that is not reading; past it they are dropped for one `resync`."""
HEARTBEAT_S = 15.0
"""A comment line this often, so proxies keep the stream open and a vanished peer is noticed."""


class TooManyStreams(Exception):
    """No stream for this caller now; the message says which cap it met (no names, no counts of others)."""


class EventHub:
    """Fans the notifier's bus and the reload history out to at most `max_streams` event streams, at most
    `per_caller` of them for one caller; the last `admin_reserve` only for admin callers. Each stream adds up what
    the catalogs swapped in meanwhile changed (`swaps`) until it next asks `changed`."""

    def __init__(self, bus: SubscriptionBus, history: ReloadHistory, max_streams: int = 32, per_caller: int = 4,
                 admin_reserve: int = 0, swaps: list[Callable[[ListingChange], None]] | None = None) -> None:
        self.bus, self.history, self.max_streams = bus, history, max_streams
        self.swaps = swaps
        """Where to hear of each catalog swapped in and what it changed (`ResourceService.swap_listeners`)."""
        self.per_caller, self.admin_reserve = per_caller, admin_reserve
        self._queues: set[MemoryObjectSendStream[dict[str, Any]]] = set()
        self._held: dict[str, int] = {}
        self._previews: dict[str, tuple[str, str]] = {}  # stream id -> (its caller, the URI its page previews)
        self.previews_changed: Callable[[], None] = lambda: None
        self._admin_streams = 0
        self._closed = False

    def _admit(self, caller: str, admin: bool) -> None:
        """Count a new stream of `caller`, or TooManyStreams when a cap says no."""
        if self._closed:
            raise TooManyStreams("the server is stopping")
        if self._held.get(caller, 0) >= self.per_caller:
            raise TooManyStreams(f"this caller already holds {self.per_caller} console event streams")
        # Admin streams may take any slot; the others only those past the reserve that other ones do not hold.
        others = len(self._queues) - self._admin_streams
        if len(self._queues) >= self.max_streams or (not admin and others >= self.max_streams - self.admin_reserve):
            raise TooManyStreams("too many console event streams are open")
        self._held[caller] = self._held.get(caller, 0) + 1
        self._admin_streams += admin

    def preview(self, stream: str, caller: str, uri: str) -> None:
        """The page of `stream` (an id its `hello` gave) previews `uri`: its changes are watched while the stream
        lasts. Ignored for an unknown stream or one of another caller (a page names only its own)."""
        held = self._previews.get(stream)
        if held is not None and held[0] == caller and held[1] != uri:
            self._previews[stream] = (caller, uri)
            self.previews_changed()

    def previewed(self) -> set[str]:
        """The URIs open pages preview now (with a caller's `visible` still checked when `updated` is sent)."""
        return {uri for _, uri in self._previews.values() if uri}

    def _release(self, caller: str, admin: bool) -> None:
        self._admin_streams -= admin
        left = self._held.get(caller, 0) - 1
        if left > 0:
            self._held[caller] = left
        else:
            self._held.pop(caller, None)

    @property
    def streams(self) -> int:
        return len(self._queues)

    def close(self) -> None:
        """End every stream (serving stops): their queues close, and each stream ends once it has sent the rest."""
        self._closed = True
        for queue in list(self._queues):
            queue.close()

    async def stream(self, visible: Callable[[str], bool], generation: Callable[[], int | None], caller: str = "",
                     admin: bool = False, changed: Callable[[ListingChange, ListingChange], bool] | None = None,
                     until: float | None = None,
                     told: Callable[[ReloadRecord], bool] | None = None) -> AsyncIterator[str]:
        """The text of one event stream of `caller`; TooManyStreams when a cap is met. Each is asked as its event
        is sent, so the stream follows reloads that change what the caller may see: `visible(uri)` for an `updated`
        event; `generation()` names the catalog generation in `hello`, `catalog`, `resync` and `reload` events, or
        is None when this caller is not told it (views.catalog_facts); `changed(told, swapped)`, on each list
        change (`told`: whose listings it says changed) and each reload (NO_CHANGE), with what the catalogs
        swapped in since it was last asked changed (`swapped`, added up from `swaps`: those a list change was sent
        for, and those it was not), whether what the caller sees of the catalog changed (a `catalog` event is sent
        only then; None: on each list change), and `told(record)` whether it may learn of a reload
        (`ReloadRecord.seen_by`; None: of every one).
        At `until` (time.time(): the token's expiry) the stream says `expired` and ends."""
        self._admit(caller, admin)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](QUEUE)
        self._queues.add(send)
        overflowed = False
        swapped = NO_CHANGE  # what the catalogs swapped in since `changed` was last asked changed

        def add(listing: ListingChange) -> None:
            nonlocal swapped
            swapped |= listing

        def since() -> ListingChange:
            nonlocal swapped
            out, swapped = swapped, NO_CHANGE
            return out

        def put(event: dict[str, Any]) -> None:
            nonlocal overflowed
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                overflowed = True
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass

        def on_bus(event: ServerEvent) -> None:
            if isinstance(event, ResourcesListChanged):
                if changed is not None and not changed(listing_of(event), since()):
                    return  # only what this caller may not see changed: it must not learn that, nor when
                put(_told({"event": "catalog"}, generation()))
            elif isinstance(event, ResourceUpdated) and visible(event.uri):
                put({"event": "updated", "uri": event.uri})

        def on_reload(record: ReloadRecord) -> None:
            # A reload that sent no list_changed may still have changed who sees what, or what the console alone
            # shows (`ListingChange.detail`): its swap is in `since()` until a list change asks.
            if record.ok and changed is not None and changed(NO_CHANGE, since()):
                put(_told({"event": "catalog"}, generation()))
            if told is not None and not told(record):
                return
            shown = generation() is not None
            put(_told({"event": "reload", "ok": record.ok}, record.generation if shown else None))

        unsubscribe = self.bus.subscribe(on_bus)
        self.history.listeners.append(on_reload)
        if self.swaps is not None:
            self.swaps.append(add)
        stream_id = secrets.token_urlsafe(12)
        self._previews[stream_id] = (caller, "")
        try:
            yield _frame("hello", _told({"stream": stream_id}, generation()))
            async with receive:
                while True:
                    event: dict[str, Any] | None = None
                    wait = HEARTBEAT_S
                    if until is not None:
                        wait = until - time.time()
                        if wait <= 0:
                            yield _frame("expired", {})
                            return
                    with anyio.move_on_after(min(wait, HEARTBEAT_S)):
                        try:
                            event = await receive.receive()
                        except anyio.EndOfStream:
                            return
                    if overflowed:
                        overflowed = False
                        _drain(receive)
                        yield _frame("resync", _told({}, generation()))
                    elif event is None:
                        yield ": ping\n\n"
                    else:
                        name = event.pop("event")
                        yield _frame(name, event)
        finally:
            unsubscribe()
            if on_reload in self.history.listeners:
                self.history.listeners.remove(on_reload)
            if self.swaps is not None and add in self.swaps:
                self.swaps.remove(add)
            send.close()
            self._queues.discard(send)
            self._release(caller, admin)
            if self._previews.pop(stream_id, ("", ""))[1]:
                self.previews_changed()


class EventStreamResponse(StreamingResponse):
    """An event stream's response that ends as soon as the client goes away.

    Starlette's StreamingResponse listens for `http.disconnect` only under ASGI spec versions before 2.4; under
    uvicorn (2.4) it notices a closed client only when a write fails, i.e. at the next heartbeat, and until then the
    stream holds its slot under the caps. Here `receive()` is always watched beside the stream: on a disconnect the
    stream is cancelled, which runs its clean-up (unsubscribe, release) right away."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await self.stream_response(send)
            except OSError:
                pass  # the client went while a frame was written: the same as its disconnect
            tg.cancel_scope.cancel()


def _drain(receive: Any) -> None:
    while True:
        try:
            receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return


def _told(data: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """`data` with the catalog generation, unless the caller is not told it (None: the key is left out)."""
    return data if generation is None else {**data, "generation": generation}


def _frame(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
