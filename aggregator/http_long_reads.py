"""What the SDK does for a request its handler is slow to answer when the response may be SSE, so that a proxy's or
client's idle timeout does not close it: the 2026-07-28 entry commits the response to an SSE stream after
`SSE_WINDOW` seconds and pings every `SSE_WINDOW` seconds, and cancels the handler when the client goes away; the
2025-11-25 transport opens its SSE stream at once and pings (sse-starlette's comment) every `SSE_WINDOW` seconds,
and lets the handler finish. The answer is then the stream's last event. The HTTP fast path (http_fast) does the
same for its reads, paying for it only when a read is still running after `WATCH_AFTER` seconds: a timer,
cancelled when the read ends first.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from mcp.server._streamable_http_modern import _SSE_HEADERS, _SSE_PING_INTERVAL

if TYPE_CHECKING:
    from starlette.types import Receive, Send

__all__ = ["SSE_WINDOW", "WATCH_AFTER", "LongRead"]

SSE_WINDOW = _SSE_PING_INTERVAL
"""Seconds the SDK waits for a handler before committing to SSE, and between pings then (its own constant)."""
WATCH_AFTER = 0.05
"""Seconds a read runs before it is watched: a cached read ends long before, with nothing started for it."""
_PING = b": ping\r\n\r\n"


class LongRead:
    """Watches the read running in the current task (made at its start, `end()` awaited when it is over): on the
    modern wire, or on the legacy one with `legacy_head` (the headers its SSE answer starts with).

    `gone`: the client disconnected and the read's task was cancelled (nothing is to be sent); `streaming`: the
    SSE stream was started (the answer goes as its last event, `event(...)`)."""

    __slots__ = ("_handle", "_legacy", "_receive", "_send", "_started", "_task", "_watcher", "gone", "streaming")

    def __init__(self, receive: Receive, send: Send, legacy_head: list[tuple[bytes, bytes]] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._receive, self._send, self._legacy = receive, send, legacy_head
        self._started = loop.time()
        self._watcher: asyncio.Task[None] | None = None
        self._handle = loop.call_later(WATCH_AFTER, self._watch)
        self.gone = self.streaming = False

    def _watch(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = self._started + SSE_WINDOW
        if self._legacy is not None:  # the legacy transport's stream is open from the start
            self.streaming = True
            await self._send({"type": "http.response.start", "status": 200, "headers": self._legacy})
        while True:
            try:
                message = await asyncio.wait_for(self._receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                if not self.streaming:
                    self.streaming = True
                    await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                ping = _PING if self._legacy is None else f": ping - {datetime.now(timezone.utc)}\r\n\r\n".encode()
                await self._send({"type": "http.response.body", "body": ping, "more_body": True})
                deadline += SSE_WINDOW
                continue
            if message["type"] == "http.disconnect":
                if self._legacy is None and self._task is not None:
                    self.gone = True
                    self._task.cancel()  # as the SDK's entry cancels its handler: counted and logged, outcome error
                return  # the legacy transport lets its handler finish

    async def end(self) -> None:
        """Stop watching; once this returns nothing more is sent for the read but its answer."""
        self._handle.cancel()
        watcher = self._watcher
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.wait({watcher})  # its own cancellation, not raised here

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
