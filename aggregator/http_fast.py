"""A fast path for well-formed `resources/read` POSTs on Streamable HTTP: the same handler and the same answer on the
wire as the SDK's, without its per-request machinery (the `Request` and pydantic models of the message, the
session's memory streams and tasks, the runner's context and session objects, the middleware chain), which cost
several times the read itself.

It sits inside the auth guard (a caller it sees has passed the bearer check and the required scopes; its scopes are
on the ASGI scope as today) and in front of the SDK's app, and takes only what it can answer exactly as the SDK would:

- a POST to /mcp with a Content-Length within `server.http.maxBodyBytes`, no repeated header, the Content-Type,
  Host and Origin the SDK's transport security accepts, and the Accept its response mode needs;
- a body that is one JSON-RPC request `{"jsonrpc": "2.0", "id": int|str, "method": "resources/read", "params"}`, the
  method spelled without escapes (only a body holding those bytes is parsed here: any other is parsed once, by the
  SDK);
- modern wire (`MCP-Protocol-Version` 2026-07-28): params `{"uri": str, "_meta": envelope}` that the SDK's own
  classifier routes (headers matching the body) and whose envelope the SDK's own validator accepts (checked once per
  distinct envelope); the answer is JSON, as the SDK's modern entry sends for a handler that emits nothing (a read
  still running after the entry's 15 s window: an SSE stream that pings, and a client that goes away cancels it,
  as there: http_long_reads);
- legacy wire: params `{"uri": str}`; with sessions, an open session (same credential, not terminated or expired)
  where the SDK has already served a read (so the handshake is done; its negotiated version is remembered), its idle
  countdown kept as the SDK keeps it, and `notifications/cancelled` there stopping it; stateless, the version the SDK
  would seed. The answer is one SSE event or JSON, as the session's transport sends it, with the same headers (a
  long read's SSE stream opens at once and pings, as the transport's does: http_long_reads);
- with JSON answers only (`json_response`), a long read whose client goes away is cancelled on either wire, as
  http_gone cancels what the SDK serves there;
- the server's middleware is the SDK's default alone and tracing is off (with tracing on, every read keeps its span).

Everything else goes to the SDK untouched (the body read here is replayed to it). Results go through the SDK's own
result sieve and `serverInfo` stamp (wire_results.shaped), errors through the SDK's own mapping and models.
`AGGREGATOR_HTTP_FAST=0` turns the path off (to compare answers with the SDK's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.runner import modern_error_data
from mcp.server.streamable_http import REQUEST_CANCELLED
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types import DEFAULT_NEGOTIATED_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from aggregator import tracing
from aggregator.codec import dumps, loads, loads_strict
from aggregator.http_gone import read_body
from aggregator.http_long_reads import LongRead, LongReads, legacy_sse_head
from aggregator.stdio_fast import METHOD
from aggregator.wire_results import Envelopes, shaped

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HttpFastReads", "fast_http_reads"]

logger = logging.getLogger("aggregator.http")

_KEPT = 256
"""Distinct (Host, Origin) pairs remembered (a client sends the same ones every time)."""
_ENCODED_BYTES = 8 * 1024 * 1024
"""Bytes of encoded results remembered at most (the same result of a read encodes to the same bytes; each also holds
the handler's result, whose text is mostly the content cache's own object)."""
_ENCODED_MAX = 64 * 1024
"""Text or blob characters at most in a remembered result."""
_JSON_TYPE = b"application/json"
_MARK = b'"resources/read"'
"""The method as a read's body spells it unless escaped: a body without it is not parsed here (an escaped one, say
`"resources\\/read"`, is a read the SDK's parser serves, as it serves any read this path does not take)."""


class _Context:
    """What the read handler uses of the SDK's request context (handlers/running.py): the method, the wire's
    version and the HTTP request (whose scope carries the authenticated user)."""

    __slots__ = ("protocol_version", "request", "request_id")
    method = METHOD

    def __init__(self, protocol_version: str, request: Request, request_id: types.RequestId) -> None:
        self.protocol_version, self.request, self.request_id = protocol_version, request, request_id


class _Params:
    __slots__ = ("uri",)

    def __init__(self, uri: str) -> None:
        self.uri = uri


class _Plan:
    """A request the path answers: its id, URI, the version it is served at and, on the legacy wire with sessions,
    the session's transport (None otherwise)."""

    __slots__ = ("modern", "request_id", "session", "uri", "version")

    def __init__(self, request_id: types.RequestId, uri: str, version: str, modern: bool, session: Any) -> None:
        self.request_id, self.uri, self.version, self.modern, self.session = request_id, uri, version, modern, session


def _allowed(value: str, allowed: list[str]) -> bool:
    """The SDK's transport-security match: exact, or `base:*` matching any port of base."""
    return value in allowed or any(a.endswith(":*") and value.startswith(a[:-1]) for a in allowed)


def _accepts(accept: str) -> tuple[bool, bool]:
    """(JSON, SSE) acceptable, as the SDK's `check_accept_headers` reads the Accept header."""
    kinds = [media.strip().split(";")[0].strip().lower() for media in accept.split(",")]
    wildcard = "*/*" in kinds
    return (wildcard or "application/json" in kinds or "application/*" in kinds,
            wildcard or "text/event-stream" in kinds or "text/*" in kinds)


class HttpFastReads:
    """The ASGI app in front of the SDK's: answers the reads described in the module docstring, hands the rest on."""

    def __init__(self, app: ASGIApp, server: Server[Any], security: TransportSecuritySettings, *, max_body: int,
                 json_response: bool, stateless: bool) -> None:
        entry = server.get_request_handler(METHOD)
        assert entry is not None
        self.app, self._server = app, server
        self._handler: Callable[[Any, Any], Awaitable[Any]] = entry.handler
        self._security, self._max_body = security, max_body
        self._json_response, self._stateless = json_response, stateless
        self._envelopes = Envelopes()
        self._long = LongReads(sse=not json_response)
        self._origins: dict[tuple[str | None, str | None], bool] = {}
        self._encoded: dict[tuple[bool, str, str], tuple[Any, bytes]] = {}
        """(modern, version, URI) -> the handler's last result there and its wire form (sieved, stamped, encoded)."""
        self._encoded_bytes = 0
        self._stamp = server.server_info_stamp  # a fresh copy per access: taken once, never handed out
        self._sessions: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """Legacy sessions' transports -> the version their handshake negotiated, once the SDK served a read there."""
        self._running: dict[tuple[Any, types.RequestId], asyncio.Task[Any] | None] = {}
        """(session transport, request id) -> the task of a legacy read in flight there, for `notifications/cancelled`
        (None once cancelled by one)."""
        server.add_request_handler(METHOD, entry.params_type, self._learning(entry.handler))

    def _learning(self, handler: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        """`handler` noting, for each legacy session the SDK serves a read on, the version it negotiated."""
        async def read(ctx: Any, params: Any) -> Any:
            request = ctx.request
            if request is not None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and not self._stateless:
                session_id = request.headers.get("mcp-session-id")
                transport = self._server.session_manager._server_instances.get(session_id)
                if transport is not None:
                    self._sessions[transport] = ctx.protocol_version
            return await handler(ctx, params)

        return read

    def _usable(self) -> bool:
        middleware = self._server.middleware
        return (not tracing.enabled() and len(middleware) == 1
                and type(middleware[0]) is OpenTelemetryMiddleware)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/mcp" or not self._usable():
            await self.app(scope, receive, send)
            return
        raw = scope["headers"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
        length = headers.get("content-length", "")
        body, replay = None, receive
        if len(headers) == len(raw) and length.isascii() and length.isdigit() and int(length) <= self._max_body:
            body, replay = await read_body(receive, self._max_body)
        plan = self._plan(scope, headers, body) if body is not None else None
        if plan is None:
            if self._sessions and (body is None or b'"initialize"' in body):
                self._forget(raw)  # it may be a second handshake in a session, negotiating another version
            if self._running and body is not None and b'"notifications/cancelled"' in body:
                self._cancel(scope, headers, body)
            await self.app(scope, replay, send)
            return
        logger.debug("fast path: %s read of %s", "modern" if plan.modern else "legacy", plan.uri)
        await self._serve(plan, scope, replay, send)

    def _cancel(self, scope: Scope, headers: dict[str, str], body: bytes) -> None:
        """Stop the read a `notifications/cancelled` names, when it is this path's and in the session (of the same
        credential) the notification is posted to, as the SDK's session stops its own; the SDK still gets the
        notification (and ignores the id it does not know)."""
        session = self._session(scope, headers) if self._secure(headers) else None
        try:
            message = loads(body)
        except (ValueError, RecursionError):
            return
        params = message.get("params") if type(message) is dict else None
        if session is None or message.get("method") != "notifications/cancelled" or type(params) is not dict:
            return
        request_id = params.get("requestId")
        if not isinstance(request_id, int | str):
            return
        key = (session, request_id)
        running = self._running.get(key)
        if running is not None:
            self._running[key] = None  # ours: `_cancellable` answers it
            running.cancel()  # while registered, the read is waiting inside `_answer`: it is raised there

    def _forget(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Forget the version of the sessions named in `headers`: the SDK's next read there learns it again."""
        for name, value in headers:
            if name == b"mcp-session-id":
                transport = self._server.session_manager._server_instances.get(value.decode("latin-1"))
                if transport is not None:
                    self._sessions.pop(transport, None)

    def _plan(self, scope: Scope, headers: dict[str, str], body: bytes) -> _Plan | None:
        """The read this request is, if the path answers it; None when the SDK must."""
        if _MARK not in body:  # not a read as this path takes it: the SDK parses it, once
            return None
        version_header = headers.get("mcp-protocol-version")
        modern = version_header is not None and version_header not in HANDSHAKE_PROTOCOL_VERSIONS
        if modern and version_header not in MODERN_PROTOCOL_VERSIONS:
            return None
        if not self._secure(headers):
            return None
        wants_json, wants_sse = _accepts(headers.get("accept", ""))
        if not wants_json or (not self._json_response and not wants_sse):
            return None
        try:
            message = loads_strict(body)
        except ValueError:  # a lone surrogate, NaN, past 1,024 levels or not JSON: the SDK's parser answers it
            return None
        if type(message) is not dict or message.keys() != {"jsonrpc", "id", "method", "params"}:
            return None
        request_id, params = message["id"], message["params"]
        if (message["jsonrpc"] != "2.0" or message["method"] != METHOD or type(request_id) not in (int, str)
                or type(params) is not dict or type(params.get("uri")) is not str):
            return None
        if modern:
            version = self._modern_version(message, headers)
            return None if version is None else _Plan(request_id, params["uri"], version, True, None)
        if params.keys() != {"uri"}:
            return None
        if self._stateless:
            return _Plan(request_id, params["uri"], version_header or DEFAULT_NEGOTIATED_VERSION, False, None)
        session = self._session(scope, headers)
        version = self._sessions.get(session) if session is not None else None
        return None if version is None else _Plan(request_id, params["uri"], version, False, session)

    def _secure(self, headers: dict[str, str]) -> bool:
        """The SDK's transport-security checks for a POST (and the legacy transport's own Content-Type check)."""
        content_type = headers.get("content-type")
        if content_type is None or not content_type.lower().startswith("application/json"):
            return False
        if "application/json" not in (part.strip() for part in content_type.split(";")[0].split(",")):
            return False
        security = self._security
        if not security.enable_dns_rebinding_protection:
            return True
        pair = (headers.get("host"), headers.get("origin"))
        verdict = self._origins.get(pair)
        if verdict is None:
            host, origin = pair
            verdict = (bool(host) and _allowed(host, security.allowed_hosts)  # type: ignore[arg-type]
                       and (not origin or _allowed(origin, security.allowed_origins)))
            if len(self._origins) >= _KEPT:
                self._origins.clear()
            self._origins[pair] = verdict
        return verdict

    def _modern_version(self, message: dict[str, Any], headers: dict[str, str]) -> str | None:
        """The version a modern read is served at, when the SDK's ladder and validator accept it as is."""
        params = message["params"]
        if params.keys() != {"uri", "_meta"}:
            return None
        route = classify_inbound_request(message, headers=headers)
        if isinstance(route, InboundLadderRejection):
            return None
        return route.protocol_version if self._envelopes.valid(METHOD, route.protocol_version, params) else None

    def _session(self, scope: Scope, headers: dict[str, str]) -> Any:
        """The open legacy session this request names, held by the credential that opened it; None otherwise."""
        session_id = headers.get("mcp-session-id")
        manager = self._server.session_manager
        transport = manager._server_instances.get(session_id) if session_id is not None else None
        if transport is None or transport.is_terminated:
            return None
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != manager._session_owners.get(session_id):  # type: ignore[arg-type]
            return None
        idle = transport.idle_scope
        if idle is not None and transport._idle_timeout is not None and idle.cancel_called:
            return None
        return transport

    async def _serve(self, plan: _Plan, scope: Scope, receive: Receive, send: Send) -> None:
        session = plan.session
        idle = session.idle_scope if session is not None and session._idle_timeout is not None else None
        if idle is not None:  # as the SDK's transport does: a request in flight holds the session open
            session._requests_in_flight += 1
            if session._requests_in_flight == 1:  # with others in flight, it is held already
                idle.deadline = math.inf
        try:
            await self._watched(plan, scope, receive, send)
        finally:
            if idle is not None:
                session._requests_in_flight -= 1
                if not session._requests_in_flight:
                    idle.deadline = anyio.current_time() + session._idle_timeout

    async def _watched(self, plan: _Plan, scope: Scope, receive: Receive, send: Send) -> None:
        """A read served as the SDK serves it (http_long_reads): when its answer may be SSE, a long one is answered
        as the last event of an SSE stream that pings, and on the modern wire cancelled when the client goes away;
        with JSON answers only, a long one is cancelled when the client goes away, on either wire."""
        watch = self._long.start(receive, send, not plan.modern,
                                 plan.session.mcp_session_id if plan.session is not None else None)
        try:
            status, body = await self._cancellable(plan, scope, receive)
            await watch.end()  # the client may go away during this too
        except asyncio.CancelledError:
            await watch.end()
            if watch.settle():
                return  # the client is gone: nothing to send
            raise
        if watch.streaming:
            await send({"type": "http.response.body", "body": LongRead.event(body), "more_body": False})
        else:
            await self._send(plan, status, body, send)

    async def _cancellable(self, plan: _Plan, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        """`_answer`; in a legacy session, `notifications/cancelled` there stops it: then, as the SDK's legacy
        transport, the read's stream ends with a REQUEST_CANCELLED error."""
        if plan.session is None:
            return await self._answer(plan, scope, receive)
        key = (plan.session, plan.request_id)
        if key in self._running:  # the id of a read still in flight there: served, cancellable as the first only
            return await self._answer(plan, scope, receive)
        task = self._running[key] = asyncio.current_task()
        try:
            return await self._answer(plan, scope, receive)
        except asyncio.CancelledError:
            if key not in self._running or self._running[key] is not None or task is None:
                raise  # not a notifications/cancelled: the server's own
            task.uncancel()
        finally:
            self._running.pop(key, None)
        error = types.ErrorData(code=REQUEST_CANCELLED, message="Request cancelled")
        message = types.JSONRPCError(jsonrpc="2.0", id=plan.request_id, error=error)
        return 200, message.model_dump_json(by_alias=True, exclude_unset=True).encode()

    async def _answer(self, plan: _Plan, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        """The HTTP status and the JSON-RPC message (encoded) for `plan`."""
        context = _Context(plan.version, Request(scope, receive), plan.request_id)
        try:
            result = await self._handler(context, _Params(plan.uri))
            encoded = self._encode(plan, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped exactly as the SDK maps it on each wire
            return self._error(plan, exc)
        return 200, b'{"jsonrpc":"2.0","id":' + dumps(plan.request_id) + b',"result":' + encoded + b"}"

    def _encode(self, plan: _Plan, result: Any) -> bytes:
        """The wire form of the handler's `result`: remembered per URI and version, since a result equal to the last
        one there (the same text object, usually, from the cache) shapes and encodes to the same bytes."""
        key = (plan.modern, plan.version, plan.uri)
        last = self._encoded.get(key)
        if last is not None and last[0] == result:
            return last[1]
        # UTF-8 on both wires: the SDK's modern entry escapes what is not ASCII (json.dumps), its legacy transport
        # does not (pydantic); a client parses the same message either way.
        encoded = dumps(shaped(self._server, METHOD, plan.version, result, self._stamp))
        if _rememberable(result):
            replaced = self._encoded.pop(key, None)
            self._encoded_bytes += len(encoded) - (len(replaced[1]) if replaced is not None else 0)
            while self._encoded and self._encoded_bytes > _ENCODED_BYTES:  # the oldest go first
                self._encoded_bytes -= len(self._encoded.pop(next(iter(self._encoded)))[1])
            self._encoded[key] = (result, encoded)
        return encoded

    def _error(self, plan: _Plan, exc: Exception) -> tuple[int, bytes]:
        if plan.modern:
            error = modern_error_data(exc)
            data = {"jsonrpc": "2.0", "id": plan.request_id,
                    "error": error.model_dump(mode="json", by_alias=True, exclude_none=True)}
            from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS

            return ERROR_CODE_HTTP_STATUS.get(error.code, 200), json.dumps(data, separators=(",", ":")).encode()
        legacy = handler_exception_to_error_data(exc)
        if legacy is None:
            logger.exception("handler for %r raised", METHOD)
            legacy = types.ErrorData(code=0, message=str(exc))
        message = types.JSONRPCError(jsonrpc="2.0", id=plan.request_id, error=legacy)
        return 200, message.model_dump_json(by_alias=True, exclude_unset=True).encode()

    async def _send(self, plan: _Plan, status: int, body: bytes, send: Send) -> None:
        # The same headers as the SDK's, but one body with its length: the SDK's SSE answer is chunked, but it is one
        # event too, and a client reads the same bytes.
        if plan.modern or self._json_response:
            head = [(b"content-type", _JSON_TYPE)]
            if plan.session is not None:
                head.append((b"mcp-session-id", plan.session.mcp_session_id.encode()))
        else:
            body = LongRead.event(body)
            head = legacy_sse_head(plan.session.mcp_session_id if plan.session is not None else None)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), *head]})
        await send({"type": "http.response.body", "body": body})


def _rememberable(result: Any) -> bool:
    """Whether `result` is a small read result (at most `_ENCODED_MAX` characters of content) worth remembering."""
    contents = result.get("contents") if isinstance(result, dict) else None
    return isinstance(contents, list) and sum(
        len(c.get("text") or c.get("blob") or "") if isinstance(c, dict) else _ENCODED_MAX for c in contents
    ) <= _ENCODED_MAX


def fast_http_reads(app: ASGIApp, server: Server[Any], security: TransportSecuritySettings, *, max_body: int,
                    json_response: bool, stateless: bool) -> ASGIApp:
    """`app` behind the fast path for `server`'s reads; `app` itself when the server has no read handler or the path
    is turned off (`AGGREGATOR_HTTP_FAST=0`)."""
    if os.environ.get("AGGREGATOR_HTTP_FAST", "1") == "0" or server.get_request_handler(METHOD) is None:
        return app
    return HttpFastReads(app, server, security, max_body=max_body, json_response=json_response, stateless=stateless)
