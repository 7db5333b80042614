"""A second stop over HTTP: the requests still in flight are given up at once, each ended cleanly.

The first SIGTERM/SIGINT lets uvicorn finish what is in flight (its graceful shutdown, at most 5 s); a second one
calls `abandon()`: each request running here is cancelled from inside, and one whose answer had not started gets
503 with `Connection: close`, one whose answer was streaming (an event stream) gets its last chunk. Requests that
come after it get 503 too. Cancelled from outside instead (uvicorn's `force_exit`, then the event loop's end), every
one would be logged as an exception in the ASGI application, and the lifespan's shutdown skipped.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Abandonable"]

STOPPING = b"the server is stopping\n"


class Abandonable:
    """`app`, with every HTTP request it is running cancelled by `abandon()` and ended as well as it can be."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.abandoned = False
        self._running: set[anyio.CancelScope] = set()

    def abandon(self) -> None:
        """Give up every request in flight, and answer the later ones 503."""
        self.abandoned = True
        for running in list(self._running):
            running.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def tracked(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        with anyio.CancelScope() as running:
            if self.abandoned:
                running.cancel()
            self._running.add(running)
            try:
                await self.app(scope, receive, tracked)
            finally:
                self._running.discard(running)
        if running.cancel_called and not finished:
            await _end(send, started)


async def _end(send: Send, started: bool) -> None:
    """End an abandoned request's answer: 503 if none started, else its last (empty) chunk."""
    try:
        if not started:
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(STOPPING)).encode()),
                (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": STOPPING})
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (OSError, RuntimeError):
        pass  # the client went, or an answer of a set length cannot end early: uvicorn closes the connection
