"""A fast path for well-formed `resources/read` requests on stdio: the same handler and the same answer on the wire,
without the SDK's per-message machinery (pydantic models of the request, the dispatcher's task group, the runner's
per-request context and session objects, the middleware chain), which cost several times the read itself.

It takes only what it can answer exactly as the SDK would, and hands everything else to the SDK untouched: a
request with an integer or string id whose params are `{"uri": str}` (legacy wire, once `initialize` was accepted)
or `{"uri": str, "_meta": envelope}` (modern wire, the envelope checked by the SDK's own classifier and validator),
while the server's middleware is the SDK's default alone and tracing is off (with tracing on, every request keeps
its span).
The result goes through the SDK's own per-version result sieve and `serverInfo` stamp; errors are mapped by the
SDK's own function. `AGGREGATOR_STDIO_FAST=0` turns the path off (to compare answers with the SDK's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.runner import _has_modern_envelope
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator import tracing

__all__ = ["FastReads", "fast_reads_for"]

logger = logging.getLogger("aggregator.stdio")

METHOD = "resources/read"
_MARK = b'"resources/read"'
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"

Answer = Callable[[types.RequestId, bytes | None, types.ErrorData | None], Awaitable[None]]
"""Writes one answer: the encoded response line, or an error to encode."""


@dataclass(frozen=True, slots=True)
class _Context:
    """What the read handler uses of the SDK's request context: the method, the wire's version, no HTTP request."""

    method: str
    protocol_version: str
    request: None = None
    request_id: types.RequestId | None = None


@dataclass(frozen=True, slots=True)
class _Params:
    uri: str


class FastReads:
    """The fast path over one stdio connection: knows the connection's era (from its first request, as the SDK
    decides it) and whether the legacy handshake opened the gate."""

    def __init__(self, server: Any, handler: Callable[[Any, Any], Awaitable[dict[str, Any]]]) -> None:
        self._server, self._handler = server, handler
        self.era: str | None = None
        """None until the first request: "legacy" or "modern", decided as the SDK decides it."""
        self.gate_open = False
        self._initialize_id: types.RequestId | None = None
        self.legacy_version: str | None = None
        """The version the legacy handshake negotiated (None: no handshake answered, the SDK serves reads)."""
        self.tasks: dict[types.RequestId, asyncio.Task[None]] = {}
        self._envelopes = Envelopes()

    def saw(self, message: types.JSONRPCMessage) -> None:
        """Note a message the SDK will handle: the first request decides the era; `initialize` is remembered."""
        if isinstance(message, types.JSONRPCRequest):
            if self.era is None:
                modern = message.method != "initialize" and _has_modern_envelope(message.params)
                self.era = "modern" if modern else "legacy"
            if message.method == "initialize":
                self._initialize_id = message.id
        elif isinstance(message, types.JSONRPCNotification):
            if message.method == "notifications/initialized":
                self.gate_open = True  # the SDK opens its gate on a bare notifications/initialized too
            elif message.method == "notifications/cancelled":
                task = self.tasks.get((message.params or {}).get("requestId"))  # type: ignore[arg-type]
                if task is not None:
                    task.cancel()  # a cancelled request is never answered

    def answered(self, message: types.JSONRPCMessage) -> None:
        """Note a message the SDK sent: a successful answer to `initialize` opens the legacy gate."""
        if (self._initialize_id is not None and isinstance(message, types.JSONRPCResponse)
                and message.id == self._initialize_id):
            version = message.result.get("protocolVersion")
            if isinstance(version, str):
                self.legacy_version, self.gate_open = version, True

    def _usable(self) -> bool:
        return (not tracing.enabled() and len(self._server.middleware) == 1
                and type(self._server.middleware[0]) is OpenTelemetryMiddleware)

    def take(self, line: bytes, answer: Answer) -> types.RequestId | None:
        """Start answering `line` if it is a request this path serves exactly as the SDK would, and return its id;
        None (nothing done) otherwise."""
        if _MARK not in line or self.era is None or (self.era == "legacy" and not self.gate_open):
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if type(message) is not dict or message.keys() != {"jsonrpc", "id", "method", "params"}:
            return None
        request_id, params = message["id"], message["params"]
        if (message["jsonrpc"] != "2.0" or message["method"] != METHOD or type(params) is not dict
                or type(params.get("uri")) is not str or type(request_id) not in (int, str)
                or request_id in self.tasks):
            return None
        version = self._version(params)
        if version is None or not self._usable():
            return None
        task = asyncio.get_running_loop().create_task(self._serve(request_id, version, params["uri"], answer))
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(request_id, None))
        return request_id

    def _version(self, params: dict[str, Any]) -> str | None:
        """The protocol version the request is served at, None when the SDK must see it."""
        if self.era == "legacy":
            return self.legacy_version if params.keys() == {"uri"} else None
        if params.keys() != {"uri", "_meta"} or not _has_modern_envelope(params):
            return None
        route = classify_inbound_request({"method": METHOD, "params": params})
        if isinstance(route, InboundLadderRejection) or not self._envelopes.valid(route.protocol_version, params):
            return None
        return route.protocol_version

    async def _serve(self, request_id: types.RequestId, version: str, uri: str, answer: Answer) -> None:
        try:
            result = await self._handler(_Context(METHOD, version, None, request_id), _Params(uri))
            data = encode_response(request_id, shaped(self._server, version, result))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped exactly as the SDK's dispatcher maps it
            error = handler_exception_to_error_data(exc)
            if error is None:
                logger.exception("handler for %r raised", METHOD)
                error = types.ErrorData(code=0, message=str(exc))
            await answer(request_id, None, error)
            return
        await answer(request_id, data, None)


class Envelopes:
    """Which modern `_meta` envelopes the SDK's own request validator accepts on a read, each checked once (a client
    sends the same one every time; the classifier checks only the version, not the other keys' shapes)."""

    KEPT = 256

    def __init__(self) -> None:
        self._valid: set[str] = set()

    def valid(self, version: str, params: dict[str, Any]) -> bool:
        """Whether read `params` (`{"uri": str, "_meta": ...}`) pass the SDK's validation at `version`."""
        # Any key works that equal envelopes share and different ones do not: repr tells 1, 1.0 and True apart.
        key = version + repr(params["_meta"])
        if key in self._valid:
            return True
        try:  # the envelope's validity does not depend on the URI: any string is a valid one
            sdk_methods.validate_client_request(METHOD, version, {"uri": "", "_meta": params["_meta"]})
        except (ValidationError, KeyError):
            return False
        if len(self._valid) >= self.KEPT:
            self._valid.clear()
        self._valid.add(key)
        return True


def shaped(server: Any, version: str, result: Mapping[str, Any], stamp: Any = None) -> dict[str, Any]:
    """The handler's result as the SDK's runner puts it on the wire: cache hints under the handler's keys, the
    version's result sieve, and the `serverInfo` stamp on the modern wire (`stamp`: the server's, taken before)."""
    hint = server.cache_hints.get(METHOD)
    dumped = {"ttlMs": hint.ttl_ms, "cacheScope": hint.scope, **result} if hint is not None else dict(result)
    try:
        dumped = sdk_methods.serialize_server_result(METHOD, version, dumped)
    except Exception:
        logger.exception("handler for %r returned an invalid result", METHOD)
        raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None
    if version in MODERN_PROTOCOL_VERSIONS:
        if dumped.get("resultType") is None:
            dumped["resultType"] = "complete"
        meta = dumped.get("_meta")
        if meta is None or (isinstance(meta, dict) and meta.get(SERVER_INFO_META_KEY) is None):
            dumped["_meta"] = {**(meta or {}), SERVER_INFO_META_KEY: stamp or server.server_info_stamp}
    return dumped


def encode_response(request_id: types.RequestId, result: dict[str, Any]) -> bytes:
    """One JSON-RPC response line, as compact as the SDK's (UTF-8, no spaces)."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8") + b"\n"


def fast_reads_for(server: Any) -> FastReads | None:
    """The fast path for `server`'s `resources/read` handler; None when it has none or the path is turned off."""
    if os.environ.get("AGGREGATOR_STDIO_FAST", "1") == "0":
        return None
    entry = server.get_request_handler(METHOD)
    return None if entry is None else FastReads(server, entry.handler)
