"""A fast path for well-formed `resources/read`, `resources/list` and `resources/templates/list` requests on stdio:
the same handler and the same answer on the wire, without the SDK's per-message machinery (pydantic models of the
request, the dispatcher's task group, the runner's per-request context and session objects, the middleware chain),
which cost several times the read itself, and for a listing page the sieve's validation and re-dump of every item.

It takes only what it can answer exactly as the SDK would, and hands everything else to the SDK untouched: a
request with an integer or string id whose params are the method's own (`{"uri": str}` for a read; none, `{}` or
`{"cursor": str}` for a listing) on the legacy wire once `initialize` was accepted, or those and `_meta` (an
envelope the SDK's own classifier and request validator accept) on the modern wire, while the server's middleware is the SDK's default
alone and tracing is off (with tracing on, every request keeps its span). The result goes through the SDK's own
per-version result sieve and `serverInfo` stamp (`wire_results`); errors are mapped by the SDK's own function.
`AGGREGATOR_STDIO_FAST=0` turns the path off (to compare answers with the SDK's).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.runner import _has_modern_envelope
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data

from aggregator import tracing
from aggregator.codec import loads_strict
from aggregator.direct_pipe import feed_directly
from aggregator.stdio_seen import SeenRead, SeenReads
from aggregator.wire_results import LIST_ITEMS, Envelopes, encode_response, page_line, shaped

if TYPE_CHECKING:
    from aggregator.reads.reader import Served
    from aggregator.reads.relayed import RelayPlan
    from aggregator.stdio_relay import RelayedRead

__all__ = ["FastReads", "fast_reads_for"]

logger = logging.getLogger("aggregator.stdio")

METHOD = "resources/read"
_MARK = b'"resources/'
_OWN_PARAMS: dict[str, tuple[frozenset[str], ...]] = {
    METHOD: (frozenset({"uri"}),), **{method: (frozenset(), frozenset({"cursor"})) for method in LIST_ITEMS}}
"""Per method, the params (besides the modern wire's `_meta`) the path takes: anything else is the SDK's."""
Handler = Callable[[Any, Any], Awaitable[dict[str, Any]]]

Answer = Callable[[types.RequestId, bytes | None, types.ErrorData | None], Awaitable[None]]
"""Writes one answer: the encoded response line, or an error to encode."""


@dataclass(slots=True)
class _Context:
    """What the read handler uses of the SDK's request context: the method, the wire's version, no HTTP request;
    and that a listing's items may come as `ItemsText` (`page_line` writes them as they are)."""

    method: str
    protocol_version: str
    request: None = None
    request_id: types.RequestId | None = None
    items_text: bool = True


@dataclass(slots=True)
class _Params:
    uri: str


@dataclass(slots=True)
class _ListParams:
    cursor: str | None


class FastReads:
    """The fast path over one stdio connection: knows the connection's era (from its first request, as the SDK
    decides it) and whether the legacy handshake opened the gate."""

    def __init__(self, server: Any, handler: Handler | None, lists: dict[str, Handler] | None = None) -> None:
        """`handler` answers reads, `lists` the listing methods of LIST_ITEMS (by method); a method without one is
        left to the SDK."""
        self._server = server
        self._handlers = {**({METHOD: handler} if handler is not None else {}), **(lists or {})}
        self.era: str | None = None
        """None until the first request: "legacy" or "modern", decided as the SDK decides it."""
        self.gate_open = False
        self._initialize_id: types.RequestId | None = None
        self.legacy_version: str | None = None
        """The version the legacy handshake negotiated (None: no handshake answered, the SDK serves reads)."""
        self.tasks: dict[types.RequestId, asyncio.Task[None] | RelayedRead] = {}
        self._envelopes = Envelopes()
        self._seen = SeenReads()
        """Read lines taken before, their ids cut out: the same read again skips the parse and the checks."""
        owner = getattr(handler, "__self__", None)
        self.relays: Relays | None = owner if isinstance(owner, Relays) else None
        """The read handler's owner (ResourceHandlers), when it relays reads: their plans and outcomes."""
        self._out: Immediate | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop `tap` runs on: on Python 3.11 asking for the running loop costs a getpid() system call."""

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
                # Out of `tasks`: a cancelled request is never answered (`_serve` sees it left), even when it ends
                # before the cancellation lands.
                task = self.tasks.pop((message.params or {}).get("requestId"), None)  # type: ignore[arg-type]
                if task is not None:
                    # Next turn, as the SDK cancels: the handler has begun (a read cancelled in the write that
                    # asked for it is counted and access-logged, outcome error) and stops at its first wait.
                    asyncio.get_running_loop().call_soon(task.cancel)

    def answered(self, message: types.JSONRPCMessage) -> None:
        """Note a message the SDK sent: a successful answer to `initialize` opens the legacy gate."""
        if (self._initialize_id is not None and isinstance(message, types.JSONRPCResponse)
                and message.id == self._initialize_id):
            version = message.result.get("protocolVersion")
            if isinstance(version, str):
                if version != self.legacy_version:
                    self._seen.clear()  # reads seen were checked at the version the last handshake gave
                self.legacy_version, self.gate_open = version, True

    @cached_property
    def _stamp(self) -> dict[str, Any]:
        """The server's `serverInfo` stamp, taken once: the SDK's property deep-copies its fixed dump on every access,
        and an answer only encodes it."""
        return self._server.server_info_stamp

    def _usable(self) -> bool:
        middleware = self._server.middleware
        return not tracing.enabled() and len(middleware) == 1 and type(middleware[0]) is OpenTelemetryMiddleware

    def take(self, line: bytes, answer: Answer) -> types.RequestId | None:
        """Start answering `line` if it is a request this path serves exactly as the SDK would, and return its id;
        None (nothing done) otherwise."""
        seen = self._seen.find(line)
        if seen is not None and seen[0] not in self.tasks and self._usable():
            return self._read(seen[0], seen[1], answer)
        if line.find(_MARK) < 0 or self.era is None or (self.era == "legacy" and not self.gate_open):
            return None
        try:
            message: dict[str, Any] = loads_strict(line)
        except ValueError:  # a lone surrogate, NaN, past 1,024 levels or not JSON: the SDK's parser answers it
            return None
        if type(message) is not dict or not _ENVELOPES.issuperset(message.keys()) or len(message) < 3:
            return None
        request_id: types.RequestId = message.get("id", None)  # type: ignore[assignment]  # checked below
        method: str = message.get("method", "")  # checked on the next line
        handler = self._handlers.get(method) if type(method) is str else None
        params = message.get("params", _ABSENT)
        if (handler is None or message.get("jsonrpc") != "2.0" or type(request_id) not in (int, str)
                or request_id in self.tasks):
            return None
        if params is _ABSENT:
            params = {}  # a listing's params are optional (the modern wire's `_meta` is not: its check fails)
        elif type(params) is not dict:
            return None
        args: str | _Params | _ListParams | None = _arguments(method, params)
        if args is None:
            return None
        version = self._version(method, params)
        if version is None or not self._usable():
            return None
        if type(args) is str:
            read = SeenRead(version, args)
            self._seen.keep(line, request_id, read)
            return self._read(request_id, read, answer)
        # The task leaves `tasks` itself before it answers (`_serve`), or when its cancellation is seen (`saw`): no
        # done callback, which would cost every read one more turn of the loop.
        self.tasks[request_id] = (self._loop or asyncio.get_running_loop()).create_task(
            self._serve(request_id, method, version, args, handler, answer))
        return request_id

    def _read(self, request_id: types.RequestId, read: SeenRead, answer: Answer) -> types.RequestId:
        """Start a read that passed the checks: relayed in callbacks where it can be, else served by a task."""
        handler = self._handlers[METHOD]
        if self.relays is not None and self._relayed(request_id, read.version, read.uri, handler, answer):
            return request_id
        self.tasks[request_id] = (self._loop or asyncio.get_running_loop()).create_task(
            self._serve(request_id, METHOD, read.version, _Params(read.uri), handler, answer))
        return request_id

    def _relayed(self, request_id: types.RequestId, version: str, uri: str, handler: Handler, answer: Answer) -> bool:
        """Whether the read was started in callbacks (`stdio_relay`) to be answered in the one that brings its
        outcome, with no task; False (nothing started) when it must be served by `_serve`."""
        owner, out = self.relays, self._out
        if owner is None or out is None or not out.ready():
            return False
        plan = owner.relay_plan(uri)
        if plan is None:
            return False
        return (_relayed_read or _relayed_read_type())().start(self, out, plan, request_id, version, uri, handler,
                                                               answer)

    def serve_read(self, request_id: types.RequestId, version: str, uri: str, handler: Handler, answer: Answer
                   ) -> Awaitable[None]:
        """A read served by a task: `_serve`'s coroutine (a relayed read whose connection was lost under it)."""
        return self._serve(request_id, METHOD, version, _Params(uri), handler, answer)

    def shaped_read(self, version: str, result: dict[str, Any]) -> dict[str, Any]:
        """A read's result as it goes on the wire at `version` (`wire_results.shaped`)."""
        return shaped(self._server, METHOD, version, result, self._stamp)

    @staticmethod
    def error_data(exc: Exception) -> types.ErrorData:
        """What the SDK's dispatcher answers for a read handler's exception."""
        return _error_data(METHOD, exc)

    def tap(self, reader: asyncio.StreamReader, answer: Answer, taken: Callable[[types.RequestId], None],
            out: Immediate | None = None) -> None:
        """Take reads where `reader`'s pipe delivers its bytes (`take`; `taken(id)` for each), before the reader task
        wakes: a read served from stdin's callback costs no turn of the task that reads lines (and with `out`, a
        read relayed in callbacks is answered in the callback that brings its outcome). Only whole lines that
        nothing waits before are taken: the rest of a chunk from the first line `take` refuses (or is incomplete),
        and every chunk while the reader's buffer holds anything, go to the reader in order as they would have."""
        feed = reader.feed_data
        self._out = out
        self._loop = asyncio.get_running_loop()

        def data_received(data: bytes) -> None:
            start = 0
            if not reader._buffer:  # type: ignore[attr-defined]  # asyncio's own, read by its readline
                while end := data.find(b"\n", start) + 1:
                    request_id = self.take(data[start:end], answer)
                    if request_id is None:
                        break
                    taken(request_id)
                    start = end
            if start < len(data):
                feed(data[start:] if start else data)

        reader.feed_data = data_received  # type: ignore[method-assign, assignment]
        feed_directly(reader, data_received)  # the reader's protocol passes chunks on through two calls more

    def _version(self, method: str, params: dict[str, Any]) -> str | None:
        """The protocol version the request is served at, None when the SDK must see it."""
        if self.era == "legacy":
            return self.legacy_version if "_meta" not in params and params.keys() in _OWN_PARAMS[method] else None
        if params.keys() - {"_meta"} not in _OWN_PARAMS[method]:
            return None
        known = self._envelopes.known(method, params.get("_meta"))
        if known is not None:  # the envelope the classifier and validator accepted last time (no headers on stdio)
            return known
        if "_meta" not in params or not _has_modern_envelope(params):
            return None
        route = classify_inbound_request({"method": method, "params": params})
        if isinstance(route, InboundLadderRejection) or not self._envelopes.valid(method, route.protocol_version,
                                                                                   params):
            return None
        return route.protocol_version

    async def _serve(self, request_id: types.RequestId, method: str, version: str, args: object, handler: Handler,
                     answer: Answer) -> None:
        try:
            result = await handler(_Context(method, version, None, request_id), args)
            if method == METHOD:
                data = encode_response(request_id, shaped(self._server, method, version, result, self._stamp))
            else:
                data = page_line(self._server, method, version, request_id, result, self._stamp)
        except asyncio.CancelledError:
            self._done(request_id)
            raise
        except Exception as exc:  # noqa: BLE001 - mapped exactly as the SDK's dispatcher maps it
            error = _error_data(method, exc)
            if self._done(request_id):
                await answer(request_id, None, error)
            return
        if self._done(request_id):
            await answer(request_id, data, None)

    def _done(self, request_id: types.RequestId) -> bool:
        """The running read leaves `tasks`; False when its cancellation took it out already (it is not answered;
        its id may have gone to a new read)."""
        if self.tasks.get(request_id) is asyncio.current_task(self._loop):
            del self.tasks[request_id]
            return True
        return False


class Immediate(Protocol):
    """Where answers can be written at once, outside any task: stdout's pipe."""

    def ready(self) -> bool:
        """Whether an answer written now goes out without waiting (the pipe is open and not full)."""

    def answer_now(self, request_id: types.RequestId, data: bytes | None, error: types.ErrorData | None) -> None:
        """Write the answer now (dropped, as `Answer` drops it, when the client no longer reads)."""


@runtime_checkable
class Relays(Protocol):
    """What relays reads in callbacks (ResourceHandlers): a URI's plan, and what a relayed read answers."""

    metrics: Any
    """Where reads are counted (None: nowhere, and `relay_counted` need not be called)."""

    def relay_plan(self, uri: str) -> RelayPlan | None: ...

    def relayed(self, uri: str, modern: bool, outcome: Served | Exception, started: float
                ) -> dict[str, Any] | MCPError: ...

    def relay_counted(self, uri: str, said: str, started: float) -> None: ...


_relayed_read: type[RelayedRead] | None = None


def _relayed_read_type() -> type[RelayedRead]:
    """`stdio_relay.RelayedRead`, imported once a plan exists (an upstream is served): a manifest of folders never
    loads the upstream side."""
    global _relayed_read
    from aggregator.stdio_relay import RelayedRead

    _relayed_read = RelayedRead
    return RelayedRead


def _error_data(method: str, exc: Exception) -> types.ErrorData:
    """What the SDK's dispatcher answers for a handler's exception (anything but an MCPError is logged)."""
    error = handler_exception_to_error_data(exc)
    if error is None:
        logger.error("handler for %r raised", method, exc_info=exc)
        error = types.ErrorData(code=0, message=str(exc))
    return error


_ENVELOPES = frozenset({"jsonrpc", "id", "method", "params"})
_ABSENT = object()


def _arguments(method: str, params: dict[str, Any]) -> str | _ListParams | None:
    """A read's URI, or a listing's params object, from `params` (already known to be a dict); None when their values
    are not the types the path takes (a `null` cursor, a number for a URI ...)."""
    if method == METHOD:
        uri = params.get("uri")
        return uri if type(uri) is str else None
    cursor = params.get("cursor")
    return _ListParams(cursor) if (cursor is None and "cursor" not in params) or type(cursor) is str else None


def fast_reads_for(server: Any) -> FastReads | None:
    """The fast path for `server`'s `resources/read` and listing handlers; None when it has none of them or the
    path is turned off."""
    if os.environ.get("AGGREGATOR_STDIO_FAST", "1") == "0":
        return None
    handlers = {m: e.handler for m in (METHOD, *LIST_ITEMS) if (e := server.get_request_handler(m)) is not None}
    if not handlers:
        return None
    return FastReads(server, handlers.pop(METHOD, None), handlers)
