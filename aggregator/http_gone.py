"""With JSON answers only (`--json-response`), a client that goes away frees the work of its request, as the SDK's
SSE answers do on the modern wire: the SDK's JSON paths never listen for the disconnect, so a long read (a slow
upstream, a slow render, a large remote file) would run on to its end or its timeout, upstream too.

`JsonGone` sits in front of the SDK's app (behind the fast path, which watches its own reads: http_long_reads) and,
for a POST to /mcp whose JSON-RPC request is still unanswered WATCH_AFTER seconds on, waits for `http.disconnect`;
then it cancels the request as the modern entry cancels its handler. Nothing is started for a short one, and its
body is parsed by the SDK alone: whether it is a request to watch (and its id) is learnt only when it would be
watched. The handler of the modern wire and of a stateless legacy request runs in that request (the stateless
transport, terminated, cancels its handler); a legacy session's runs in the session, so the session is also sent
`notifications/cancelled` for it, as the client could have sent it. `subscriptions/listen` is left to the SDK, which
watches its stream itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import TYPE_CHECKING

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from aggregator.http_long_reads import LongReads

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JsonGone", "read_body"]

logger = logging.getLogger("aggregator.http")

_TOLD_WITHIN = 10.0
"""Seconds the session may take to take a `notifications/cancelled` in (it is queued for its message loop)."""


class JsonGone:
    """The ASGI app in front of the SDK's, with JSON answers only: described in the module docstring."""

    def __init__(self, app: ASGIApp, *, max_body: int) -> None:
        self.app, self._max_body = app, max_body
        self._long = LongReads(sse=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        body, replay = await read_body(receive, self._max_body)
        if body is None:  # the client went away, or the SDK refuses it at once (too large)
            await self.app(scope, replay, send)
            return
        # The SDK parses the body too: it is parsed here only once the request runs long enough to be watched.
        request = _Request(body)
        # The watcher gets the receive past the body, which the app has all in `replay`: it hears only the disconnect.
        watch = self._long.start(receive, send, False, wanted=request.watched)
        try:
            await self.app(scope, replay, send)
            await watch.end()  # the client may go away during this too
        except asyncio.CancelledError:
            await watch.end()
            if not watch.settle():
                raise  # the server's own
            logger.debug("the client went away: request %r cancelled", request.id)
            if _in_session(scope) and request.id is not None:
                await self._tell(scope, request.id)

    async def _tell(self, scope: Scope, request_id: int | str) -> None:
        """Post `notifications/cancelled` for `request_id` to the legacy session `scope` names, through the SDK's
        app with the request's own headers and caller: its answer (202) goes nowhere."""
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": "the client went away"}}
        body = json.dumps(note).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        messages: deque[Message] = deque([{"type": "http.request", "body": body, "more_body": False}])

        async def receive() -> Message:
            return messages.popleft() if messages else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            pass

        try:
            async with asyncio.timeout(_TOLD_WITHIN):
                await self.app({**scope, "headers": headers}, receive, send)
        except TimeoutError:
            logger.warning("request %r: the session did not take its cancellation in %gs", request_id, _TOLD_WITHIN)


class _Request:
    """A POST's body and, once `watched` asked, the id of the JSON-RPC request it is (None when it is not one)."""

    __slots__ = ("body", "id")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.id: int | str | None = None

    def watched(self) -> bool:
        """Whether its client going away is to be watched for here: a request that is not `initialize` or
        `subscriptions/listen` (a notification, a response or a body the SDK refuses is left to the SDK)."""
        self.id = _request_id(self.body)
        return self.id is not None


def _request_id(body: bytes) -> int | str | None:
    """The id of the JSON-RPC request `body` is, when its client going away is to be watched for here."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if type(message) is not dict or message.get("method") in (None, "initialize", "subscriptions/listen"):
        return None
    request_id = message.get("id")
    return request_id if type(request_id) in (int, str) else None


def _in_session(scope: Scope) -> bool:
    """Whether a request names a legacy session (the modern wire has none: its header routes it there)."""
    version, session = None, False
    for name, value in scope["headers"]:
        if name == b"mcp-protocol-version":
            version = value.decode("latin-1")
        elif name == b"mcp-session-id":
            session = True
    return session and (version is None or version in HANDSHAKE_PROTOCOL_VERSIONS)


async def read_body(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The whole request body (None when the client went away or sent more than `limit`) and a `receive` that
    replays what was read, then receives on."""
    read: deque[Message] = deque()
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if size > limit or not message.get("more_body", False):
            break
    chunks = [m.get("body", b"") for m in read if m["type"] == "http.request"]
    complete = read[-1]["type"] == "http.request" and not read[-1].get("more_body", False) and size <= limit

    async def replay() -> Message:
        return read.popleft() if read else await receive()

    return (b"".join(chunks) if complete else None), replay


def json_gone(app: ASGIApp, *, max_body: int, json_response: bool) -> ASGIApp:
    """`app` behind `JsonGone` when answers are JSON only; `app` itself otherwise (the SDK's SSE answers watch)."""
    return JsonGone(app, max_body=max_body) if json_response else app
