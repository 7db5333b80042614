"""Serving over stdio so that every line gets its answer: the SDK's stdio transport with two gaps closed.

A line that is not JSON gets a JSON-RPC -32700 error (id null) and one that is JSON but not a JSON-RPC message
-32600, where the SDK drops both silently. When stdin closes (a script piping requests in), the requests already
read are finished and their responses written before the server stops, for at most `DRAIN_TIMEOUT` seconds;
the SDK would cancel them on end of input, and the last answers were lost.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

__all__ = ["DRAIN_TIMEOUT", "serve_stdio"]

logger = logging.getLogger("aggregator.stdio")

DRAIN_TIMEOUT = 30.0
"""Seconds requests read before stdin closed may take to finish: the default source timeout, so a read that
would succeed is not cut short."""

# Requests whose response is a stream that lasts until the connection ends: waiting for them would only wait.
_OPEN_ENDED = frozenset({"subscriptions/listen"})


class _Unanswered:
    """Ids of requests read but not answered yet, and an event set whenever there are none."""

    def __init__(self) -> None:
        self.ids: set[types.RequestId] = set()
        self.none = anyio.Event()
        self.none.set()

    def add(self, request_id: types.RequestId) -> None:
        self.ids.add(request_id)
        if self.none.is_set():
            self.none = anyio.Event()

    def discard(self, request_id: Any) -> None:
        self.ids.discard(request_id)
        if not self.ids:
            self.none.set()


async def serve_stdio(server: Any, options: InitializationOptions, *, drain_timeout: float = DRAIN_TIMEOUT) -> None:
    """Run `server` on stdin/stdout until stdin closes and the requests read by then are answered (or
    `drain_timeout` passes); stdout is flushed after every message."""
    async with stdio_server() as (wire_in, wire_out):
        to_server, server_in = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        server_out, from_server = anyio.create_memory_object_stream[SessionMessage](0)
        unanswered = _Unanswered()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_relay_requests, wire_in, to_server, wire_out, unanswered, drain_timeout)
            tg.start_soon(_relay_responses, from_server, wire_out, unanswered)
            await server.run(server_in, server_out, options)


async def _relay_requests(wire_in: ObjectReceiveStream[SessionMessage | Exception],
                          to_server: ObjectSendStream[SessionMessage | Exception], wire_out: Any,
                          unanswered: _Unanswered, drain_timeout: float) -> None:
    """stdin to the server, answering unreadable lines itself; at end of input, hold the server's input open
    until what was asked is answered."""
    async with to_server:
        try:
            async for item in wire_in:
                if isinstance(item, Exception):
                    error = unreadable_line_error(item)
                    if error is not None:
                        await wire_out.send(SessionMessage(error))
                    continue
                message = item.message
                if isinstance(message, types.JSONRPCRequest) and message.method not in _OPEN_ENDED:
                    unanswered.add(message.id)
                elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                    # A cancelled request is never answered.
                    unanswered.discard((message.params or {}).get("requestId"))
                await to_server.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # the server stopped first: nothing left to hand it
        with anyio.move_on_after(drain_timeout) as waited:
            await unanswered.none.wait()
        if waited.cancelled_caught:
            logger.warning("stdin closed; %d requests still unanswered after %.0f s are cancelled",
                           len(unanswered.ids), drain_timeout)


async def _relay_responses(from_server: ObjectReceiveStream[SessionMessage], wire_out: Any,
                           unanswered: _Unanswered) -> None:
    async with wire_out, from_server:
        async for item in from_server:
            await wire_out.send(item)
            if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
                unanswered.discard(item.message.id)


def unreadable_line_error(exc: Exception) -> types.JSONRPCError | None:
    """The JSON-RPC error answering a line the SDK could not decode: -32700 for text that is not JSON, -32600
    (with the line's id when it has one) for JSON that is not a JSON-RPC message; None for a blank line."""
    if not isinstance(exc, ValidationError):
        logger.warning("unreadable input on stdin: %s", exc)
        return None
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        raw = errors[0].get("input")
        if isinstance(raw, str) and not raw.strip():
            return None
        return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
            code=types.PARSE_ERROR, message="Parse error: the line is not JSON"))
    request_id = next((_id_of(e.get("input")) for e in errors if isinstance(e.get("input"), dict)), None)
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
        code=types.INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 request, notification or response"))


def _id_of(data: dict[str, Any]) -> types.RequestId | None:
    request_id = data.get("id")
    return request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
