"""Limits for slow, idle and too many HTTP clients: uvicorn's httptools protocol with a header-read timeout, a
body-read timeout and a cap on open connections (uvicorn itself has the keep-alive timeout only).

Deadlines are totals, not gaps between bytes: a client trickling one byte a second is cut off as surely as a
silent one. They cover reading a request only; a response in progress (an SSE listen stream, a legacy GET
stream) is never timed, and the keep-alive timeout starts only once a response is complete.

It subclasses uvicorn's HttpToolsProtocol and reads its internals (`connections`, `transport`, `parser`, `flow`,
`cycle` and its `transport`, `_should_upgrade`): uvicorn is pinned below 1, and tests/test_sdk_compat.py names any
that go missing. Each cycle writes through aggregator.http_writes (a response's head and body in one write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aggregator.http_writes import CoalescedWrites
from aggregator.manifest.model import HttpSettings

__all__ = ["limited_protocol", "quiet_client_disconnects"]

logger = logging.getLogger("aggregator.http_app")

_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 15\r\n"
              b"connection: close\r\n\r\nRequest Timeout")
_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 20\r\n"
             b"retry-after: 1\r\nconnection: close\r\n\r\nToo many connections")
_WARN_EVERY = 60.0  # seconds between two warnings of one kind: a flood must not flood the log too


class _LimitedProtocol(HttpToolsProtocol):
    """One connection: at most `header_timeout` s to send a request's line and headers, `body_timeout` s for its
    body, and refused with 503 when `max_connections` are already open."""

    header_timeout = HttpSettings().header_timeout
    body_timeout = HttpSettings().body_timeout
    max_connections = HttpSettings().max_connections
    _warned: dict[str, float] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._pending: tuple[float, Any] | None = None
        """A deadline to arm once the bytes at hand are parsed, if what it times is still unfinished then."""
        self._reading_headers = False

    # The ignore: uvicorn's own signature narrows asyncio.BaseProtocol's (BaseTransport) to Transport; ours follows it.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # this one is counted already
            # Refused before reading anything, so a flood costs no parsing; open connections go on untouched.
            _warn("connections", "%d connections open (server.http.maxConnections): refusing new ones with 503",
                  self.max_connections)
            self.transport.write(_TOO_MANY)
            self.transport.close()
            return
        self._read_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Most requests arrive whole in one read: their deadlines are never armed (no timer made and cancelled).
        if self._pending is not None:
            seconds, then = self._pending
            self._pending = None
            self._deadline = self.loop.call_later(seconds, then)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._reading_headers:  # a new request on a kept-alive connection: its own header deadline
            self._read_headers(later=True)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            return  # a WebSocket: another protocol owns the transport from here
        if self.cycle is not None:  # its response's head and first body part in one write (http_writes)
            self.cycle.transport = CoalescedWrites(self.transport, self.loop)  # type: ignore[assignment]
        # Armed after this read only if the body is not complete by then (on_message_complete disarms it).
        self._arm(self.body_timeout, self._body_timed_out, later=True)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _read_headers(self, later: bool = False) -> None:
        self._arm(self.header_timeout, self._headers_timed_out, later)
        self._reading_headers = True  # after _arm, which clears it

    def _arm(self, seconds: float, then: Any, later: bool = False) -> None:
        """Time what follows: now, or (`later`, while bytes are being parsed) once the bytes at hand are parsed."""
        self._disarm()
        if later:
            self._pending = (seconds, then)
        else:
            self._deadline = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        self._reading_headers = False
        self._pending = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_timed_out(self) -> None:
        self._deadline = None
        _warn("headers", "a client took over %g s (server.http.headerTimeout) to send a request's headers: "
              "closed", self.header_timeout)
        self._give_up(answer=not self._responding())

    def _body_timed_out(self) -> None:
        self._deadline = None
        if self.flow is not None and self.flow.read_paused:
            # We stopped reading (a pipelined request, or the app behind on the body): not the client's delay.
            self._arm(self.body_timeout, self._body_timed_out)
            return
        _warn("body", "a client took over %g s (server.http.bodyTimeout) to send a request body: closed",
              self.body_timeout)
        answer = not self._responding()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app is waiting for the rest of the body: it hears a disconnect and writes nothing more.
            cycle.disconnected = True
            cycle.message_event.set()
        self._give_up(answer)

    def _responding(self) -> bool:
        """Whether a response is being written on this connection (a 408 written now would land inside it)."""
        cycle = self.cycle
        return cycle is not None and cycle.response_started and not cycle.response_complete

    def _give_up(self, answer: bool) -> None:
        if self.transport.is_closing():
            return
        if answer:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def _warn(kind: str, message: str, *args: Any) -> None:
    now = time.monotonic()
    if now - _LimitedProtocol._warned.get(kind, -_WARN_EVERY) >= _WARN_EVERY:
        _LimitedProtocol._warned[kind] = now
        logger.warning(message, *args)


class _ClientDisconnects(logging.Filter):
    """Drops the SDK's ERROR-with-traceback for a client gone while its body was read (a body timeout ends so):
    the client's doing, already logged once as a warning, and a slow-client flood would flood the log too."""

    def filter(self, record: logging.LogRecord) -> bool:
        from starlette.requests import ClientDisconnect

        return not (record.exc_info and isinstance(record.exc_info[1], ClientDisconnect))


def quiet_client_disconnects() -> None:
    logger = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, _ClientDisconnects) for f in logger.filters):
        logger.addFilter(_ClientDisconnects())


def limited_protocol(settings: HttpSettings) -> type[HttpToolsProtocol]:
    """The protocol class to give uvicorn (`Config(http=...)`) for `server.http`'s limits."""
    return type("LimitedHttpProtocol", (_LimitedProtocol,), {
        "header_timeout": settings.header_timeout, "body_timeout": settings.body_timeout,
        "max_connections": settings.max_connections})
