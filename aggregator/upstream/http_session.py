"""What a 2025-11-25 Streamable HTTP session's own traffic says about it, seen from our HTTP transport, and how the
connection owner keeps such a session honest.

- The upstream forgot our session (it restarted): it answers a request naming the session 404 (the spec), or 400 with
  a body naming the session (@modelcontextprotocol/server-everything, Express servers on the TypeScript SDK). Either
  ends the connection at once, so the call that met it is sent again on a new one.
- The standalone GET stream carries the session's notifications. The SDK opens it after the handshake, reopens it
  once a second after it drops, then gives up without telling; what the upstream sends while no stream is open is
  lost (nothing is replayed without an event store). So calls wait until the stream first opens (or is refused, or
  `grace` passes), and each time it opens after that, changes may have been missed (the owner lists again); a
  stream that dropped and is not back within `grace` ends the connection: a new session brings a new stream. A
  request that fails while the stream is down ends it too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx2
from anyio.abc import TaskStatus

__all__ = ["SessionWatch", "keep_session"]

logger = logging.getLogger("aggregator.upstream")

SESSION_HEADER = "mcp-session-id"
MAX_ERROR_BODY = 64 * 1024
"""A refusal's body is read (to find the session named in it) only up to this size."""


class SessionWatch:
    """Fed by the HTTP transport with every response of one connection; read by the connection owner."""

    def __init__(self, on_gone: Callable[[str], None]) -> None:
        self._on_gone = on_gone
        self.opened = 0
        """How many times the standalone GET stream opened."""
        self.refused = 0
        """How many times a GET for the stream was answered otherwise (a server without one answers 405)."""
        self.down_since: float | None = None
        """When the open stream dropped; None while it is open (or before it first opened)."""
        self.changed = anyio.Event()
        """Set (then replaced) whenever the stream opens or drops."""

    @property
    def stream_down(self) -> bool:
        return self.down_since is not None

    async def observe(self, request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
        """The response to hand on (a refusal's body already read); tells `on_gone` when it says the session is
        gone, and notes the GET stream opening (its end is noted when its body ends)."""
        if SESSION_HEADER not in request.headers:
            return response
        status = response.status_code
        if status == 404:
            self._on_gone("the upstream answered 404 for our session (it restarted?)")
        elif status == 400:
            body = await _read_capped(response)
            if body is not None and b"session" in body.lower():
                self._on_gone("the upstream answered 400 naming our session (it restarted?)")
            return httpx2.Response(status, headers=response.headers, content=body or b"",
                                   extensions=response.extensions)
        elif request.method == "GET" and status == 200 and response.headers.get(
                "content-type", "").lower().startswith("text/event-stream"):
            self._opened()
            return httpx2.Response(status, headers=response.headers, stream=_Watched(response.stream, self._dropped),
                                   extensions=response.extensions)
        elif request.method == "GET":
            self.refused += 1
            self._tell()
        return response

    def _opened(self) -> None:
        self.opened += 1
        self.down_since = None
        self._tell()

    def _dropped(self) -> None:
        if self.down_since is None:
            self.down_since = anyio.current_time()
            self._tell()

    def _tell(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


async def keep_session(watch: SessionWatch, *, ping: Callable[[], Awaitable[object]], lost: Callable[[str], None],
                       missed: Callable[[], Awaitable[None]], listening: Callable[[], bool], interval: float,
                       timeout: float, grace: float,
                       task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """For the life of one session: started once the GET stream first opened, was refused, or did neither within
    `grace` (calls wait for that, so a listing made then misses none of its notifications); `missed()` each time it
    opens after that; `lost(reason)` (and return) when it dropped and is not back within `grace`, or when a ping
    fails (sent every `interval` while `listening()`: a session whose server went away has no stream whose end would
    say so if it never had one)."""
    with anyio.move_on_after(grace):
        while not (watch.opened or watch.refused):
            await watch.changed.wait()
    seen = watch.opened  # its first opening, if it came in time, is no gap: no call was sent before it
    task_status.started()
    next_ping = anyio.current_time() + interval
    while True:
        if watch.opened > seen:
            seen = watch.opened
            await missed()
            continue
        now = anyio.current_time()
        if watch.down_since is not None and now >= watch.down_since + grace:
            lost(f"its event stream dropped and was not back within {grace:g}s")
            return
        if now >= next_ping:
            next_ping = now + interval
            if listening():
                try:
                    with anyio.fail_after(timeout):
                        await ping()
                except Exception as exc:  # noqa: BLE001 - any failure: the session is gone
                    lost(f"ping: {type(exc).__name__}: {str(exc)[:200]}")
                    return
            continue
        due = next_ping if watch.down_since is None else min(next_ping, watch.down_since + grace)
        with anyio.move_on_after(due - now):
            await watch.changed.wait()


async def _read_capped(response: httpx2.Response) -> bytes | None:
    """The body, or None past MAX_ERROR_BODY (then the rest is dropped: the connection is not reused)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.stream:  # type: ignore[union-attr]
            size += len(chunk)
            if size > MAX_ERROR_BODY:
                return None
            chunks.append(chunk)
    finally:
        await response.stream.aclose()  # type: ignore[union-attr]
    return b"".join(chunks)


class _Watched(httpx2.AsyncByteStream):
    """A streamed body that calls `on_end` once when it ends (the server closed it, it broke, or it was closed)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        finally:
            self._on_end()

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()
