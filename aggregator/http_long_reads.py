"""What the SDK does for a request its handler is slow to answer when the response may be SSE, so that a proxy's or
client's idle timeout does not close it: the 2026-07-28 entry commits the response to an SSE stream after
`SSE_WINDOW` seconds and pings every `SSE_WINDOW` seconds, and cancels the handler when the client goes away; the
2025-11-25 transport opens its SSE stream at once and pings (sse-starlette's comment) every `SSE_WINDOW` seconds,
and lets the handler finish. The answer is then the stream's last event. The HTTP fast path (http_fast) does the
same for its reads (`LongReads`), paying for it only when a read is still running after `WATCH_AFTER` seconds: a
read is an entry in a dict while it runs, and one timer per app ticks while reads are in flight. With JSON answers
only (`--json-response`: no stream to commit to, to ping or to resume) a long read is watched for its client going
away alone, which cancels it on either wire: its answer can no longer reach anyone (http_gone does the same for what
the SDK serves).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from mcp.server._streamable_http_modern import _SSE_HEADERS, _SSE_PING_INTERVAL

if TYPE_CHECKING:
    from starlette.types import Receive, Send

__all__ = ["SSE_WINDOW", "WATCH_AFTER", "LongRead", "LongReads", "legacy_sse_head"]

SSE_WINDOW = _SSE_PING_INTERVAL
"""Seconds the SDK waits for a handler before committing to SSE, and between pings then (its own constant)."""
WATCH_AFTER = 0.05
"""Seconds a read runs before it is watched: a cached read ends long before, with nothing started for it."""
_PING = b": ping\r\n\r\n"


class LongReads:
    """The reads in flight of one app: each read `start`ed here and still running after WATCH_AFTER seconds (checked
    every WATCH_AFTER seconds, while any is in flight) gets a watcher task that does what the SDK does for it (`sse`:
    answers may be SSE streams; False: JSON only, and a client that goes away cancels the read on either wire)."""

    __slots__ = ("_reads", "_timer", "sse")

    def __init__(self, sse: bool = True) -> None:
        self._reads: dict[LongRead, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.sse = sse

    def start(self, receive: Receive, send: Send, legacy: bool, session_id: str | None = None,
              wanted: Callable[[], bool] | None = None) -> LongRead:
        """Watch the read running in the current task, on the legacy wire or the modern one (`session_id`: the
        legacy session's); `end()` it when it is over. `wanted`, asked once when it would be watched, may decline
        (the read is then left alone): what it costs is paid by long reads only."""
        loop = asyncio.get_running_loop()
        read = LongRead(self, loop.time(), receive, send, legacy, session_id, wanted)
        self._reads[read] = None
        if self._timer is None:
            self._timer = loop.call_later(WATCH_AFTER, self._tick)
        return read

    def _tick(self) -> None:
        self._timer = None
        if not self._reads:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() - WATCH_AFTER
        declined: list[LongRead] = []
        for read in self._reads:
            if read.watcher is None and read.started <= due:
                if read.wanted is None or read.wanted():
                    read.watcher = loop.create_task(read.run())
                else:
                    declined.append(read)
        for read in declined:
            del self._reads[read]
        self._timer = loop.call_later(WATCH_AFTER, self._tick)

    def _ended(self, read: LongRead) -> None:
        self._reads.pop(read, None)


class LongRead:
    """One read in flight (`LongReads.start`). `gone`: the client disconnected and the read's task was cancelled
    (nothing is to be sent); `streaming`: the SSE stream was started (the answer goes as its last event,
    `event(...)`)."""

    __slots__ = ("_legacy", "_over", "_owner", "_receive", "_send", "_session", "_task", "gone", "started",
                 "streaming", "wanted", "watcher")

    def __init__(self, owner: LongReads, started: float, receive: Receive, send: Send, legacy: bool,
                 session_id: str | None, wanted: Callable[[], bool] | None = None) -> None:
        self._owner, self.started, self._task, self.wanted = owner, started, asyncio.current_task(), wanted
        self._receive, self._send, self._legacy, self._session = receive, send, legacy, session_id
        self.watcher: asyncio.Task[None] | None = None
        self.gone = self.streaming = self._over = False

    async def run(self) -> None:
        """The watcher: SSE and pings on the SDK's schedule, and on the modern wire the read cancelled when the
        client goes away; with JSON answers only, the read cancelled when the client goes away."""
        if not self._owner.sse:
            while (await self._receive())["type"] != "http.disconnect":
                pass  # the rest of a body already read: only the disconnect is waited for
            self._cancel()
            return
        deadline = self.started + SSE_WINDOW
        if self._legacy:  # the legacy transport's stream is open from the start
            self.streaming = True
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": legacy_sse_head(self._session)})
        while not self._over:
            try:
                # Not asyncio.wait_for: on Python 3.11 it returns a message that came in the same turn as `end()`'s
                # cancel and drops the cancel, and this loop then pinged on forever with `end()` waiting for it (a
                # read of a cold herd never answered). A timeout scope lets the cancel through.
                async with asyncio.timeout_at(deadline):
                    message = await self._receive()
            except TimeoutError:
                if self._over:
                    return
                if not self.streaming:
                    self.streaming = True
                    await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                ping = _PING if not self._legacy else f": ping - {datetime.now(timezone.utc)}\r\n\r\n".encode()
                await self._send({"type": "http.response.body", "body": ping, "more_body": True})
                deadline += SSE_WINDOW
                continue
            if message["type"] == "http.disconnect":
                if not self._legacy:
                    self._cancel()
                return  # the legacy transport lets its handler finish

    def _cancel(self) -> None:
        """Cancel the read for a client that went away, as the SDK's modern entry cancels its handler: counted and
        logged, outcome error."""
        if self._task is not None:
            self.gone = True
            self._task.cancel()

    async def end(self) -> None:
        """Stop watching; once this returns nothing more is sent for the read but its answer."""
        self._owner._ended(self)
        self._over = True  # the watcher sends nothing more, even if its cancel were lost
        watcher = self.watcher
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.wait({watcher}, timeout=SSE_WINDOW)  # its own cancellation, not raised here

    def settle(self) -> bool:
        """After the read's task caught a CancelledError: True (the cancellation withdrawn) when it was ours, for a
        client that went away; False when it is the server's, to be raised on."""
        if self.gone and self._task is not None:
            self._task.uncancel()
            return True
        return False

    @staticmethod
    def event(message: bytes) -> bytes:
        """The SSE event that carries the encoded JSON-RPC `message`, as the SDK's entry frames it."""
        return b"event: message\r\ndata: " + message + b"\r\n\r\n"


def legacy_sse_head(session_id: str | None) -> list[tuple[bytes, bytes]]:
    """The headers the legacy transport's SSE answer starts with (in its session `session_id`)."""
    head = [(b"cache-control", b"no-cache, no-transform"), (b"connection", b"keep-alive"),
            (b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no")]
    if session_id is not None:
        head.append((b"mcp-session-id", session_id.encode()))
    return head
