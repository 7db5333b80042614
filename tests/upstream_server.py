"""A small upstream MCP server for tests/test_upstream.py: `python upstream_server.py stdio` or `... http PORT`.

Static text and binary resources, a template with completion, one echoing a request header, a resource larger than
small limits, one that never answers, one whose handler fails with a secret in its message, and one whose name
depends on `UPSTREAM_TAG`. With `UPSTREAM_PIDFILE` set it writes its pid there (a test kills it); with
`UPSTREAM_CACHE=private:5000` (scope:ttlMs) its reads carry those caching hints (modern wire).

Options (environment) for the tests of upstream connections (tests/test_upstream_links.py):
- `UPSTREAM_WIRE=legacy`: `server/discover` is refused, so clients fall back to the 2025-11-25 handshake (as with
  servers on older SDKs): no caching hints, sessions over HTTP.
- `UPSTREAM_SESSION_400=1` (HTTP): a request naming a session this process does not know is answered 400 naming
  it, as @modelcontextprotocol/server-everything does, instead of the SDK's 404.
- `UPSTREAM_TEXTS=1`: `test://texts` answers TEXTS in turn.
- `UPSTREAM_CHANGES=1`: `test://counter` (how many times it was read), `test://add/{name}` (reading it lists
  `test://added/{name}` and tells list_changed), `test://race/{name}` (lists `.../{name}-1` and tells, then the next
  resources/list lists `.../{name}-2` and tells while it answers the list as it was before), and every listen stream
  after the first lists `test://added/listen-N` and tells the streams already open before it subscribes.
- `UPSTREAM_EDITS=1`: `test://edited` answers `edition N` and is listed with that description; reading
  `test://edit/{N}` makes it edition N and tells list_changed, never `updated` (as a server that does not track
  subscriptions, or changes a resource without telling its subscribers, does). `test://moving/a/x`, once read,
  is listed as `test://moving/b/x` instead (the listen streams told list_changed).
- `UPSTREAM_HOLD_GET=1` (HTTP): standalone GET streams are held until a `test://add/...` read has been answered, so
  what that read changed happens before the client can hear of it.

Options for the tests of upstreams at scale (tests/test_upstream_scale.py):
- `UPSTREAM_RESOURCES=N`: N more resources `test://res/{i}` (i from 0) are listed, after the static ones, and read
  (`res {i}`) without a template, so an unlisted one reads only if the read is forwarded.
- `UPSTREAM_LISTS=K`: resources/list answers pages of K entries (default: all in one page).
- `UPSTREAM_FLOOD=N`: reading `test://flood/{any}` tells list_changed N times (both wires), spread over about
  `UPSTREAM_FLOOD_SECONDS` (default 2), then answers how many it told.
- `test://listings` (with any of the three above) reads how many resources/list requests this process answered.
- `UPSTREAM_SLOW_INIT=S` (with `UPSTREAM_WIRE=legacy`, stdio): the answer to `initialize` waits S seconds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resources import FunctionResource
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourcesListChanged, ServerEvent
from mcp.shared.exceptions import MCPError
from mcp_types import Completion, ResourceTemplateReference

PNG = bytes.fromhex("89504e470d0a1a0a") + bytes(range(256))
TAG = os.environ.get("UPSTREAM_TAG", "one")

_scope, _, _ttl = os.environ.get("UPSTREAM_CACHE", "").partition(":")


class _Bus(InMemorySubscriptionBus):
    """With UPSTREAM_CHANGES: a listen stream after the first changes the list, told only to the streams before it."""

    opened = 0

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        self.opened += 1
        if CHANGES and self.opened > 1:
            _add(f"listen-{self.opened}")
            for earlier in list(self._listeners.values()):
                earlier(ResourcesListChanged())
        return super().subscribe(listener)


CHANGES = os.environ.get("UPSTREAM_CHANGES") == "1"
TEXTS = ["plain", "ünïcödé ✓ 😀", 'quotes " and \\ backslash\n\ttab', "\u2028 and \u2029 separators",
         "\ufeffa BOM first", "the marker \x00aggregator-relayed-text\x00 inside", "", "plain again", "<script>\u0000</script>"]
"""What `test://texts` answers in turn (UPSTREAM_TEXTS): texts a relayed answer's shape must carry as they are."""
bus = _Bus()
server = MCPServer("test-upstream", version="1.0", subscriptions=bus, cache_hints={
    "resources/read": CacheHint(ttl_ms=int(_ttl), scope=_scope)} if _scope else None)  # type: ignore[typeddict-item]


@server.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return f"Hello from {TAG}"


@server.resource("test://static-binary", mime_type="image/png")
def static_binary() -> bytes:
    return PNG


@server.resource("test://big", mime_type="text/plain")
def big() -> str:
    return "x" * 100_000


_hanging = [0]


@server.resource("test://hang")
async def hang() -> str:
    _hanging[0] += 1
    try:
        await anyio.sleep(3600)
    finally:  # cancelled: the client gave up (notifications/cancelled)
        _hanging[0] -= 1
    return "never"


def hanging() -> str:
    """How many reads of test://hang are still waiting (a client that gives up one should cancel it)."""
    return str(_hanging[0])


if os.environ.get("UPSTREAM_HANGING"):  # listed only when asked: other tests count what this server lists
    server.resource("test://hanging")(hanging)


@server.resource("test://boom")
def boom() -> str:
    raise MCPError(-32603, "SECRET-TOKEN-123 leaked in an upstream error")


@server.resource(f"test://tag/{TAG}")
def tag() -> str:
    return TAG


@server.resource("test://template/{id}/data", mime_type="application/json")
def template(id: str) -> str:
    return f'{{"id": "{id}"}}'


@server.resource("test://header/{name}", mime_type="text/plain")
def header(name: str, ctx: Context) -> str:
    return (ctx.headers or {}).get(name, "-")


@server.completion()
async def complete(ref, argument, context):  # noqa: ANN001, ANN201 - the SDK's decorator contract
    if isinstance(ref, ResourceTemplateReference) and argument.name == "id":
        return Completion(values=[v for v in ("alpha", "alpine", "beta") if v.startswith(argument.value)])
    return None


def _add(name: str) -> None:
    uri = f"test://added/{name}"
    server.add_resource(FunctionResource(uri=uri, name=name, fn=lambda: uri))


async def _tell_list_changed(session: Any) -> None:
    """Both wires: the legacy session's notification (the GET stream over HTTP), the modern listen streams'."""
    await session.send_resource_list_changed()
    await bus.publish(ResourcesListChanged())


held_get = anyio.Event()
race_armed: list[str] = []

if os.environ.get("UPSTREAM_TEXTS"):  # listed only when asked: other tests count what this server lists
    texts_read = 0

    @server.resource("test://texts", mime_type="text/markdown")
    def texts() -> str:
        global texts_read
        texts_read += 1
        return TEXTS[(texts_read - 1) % len(TEXTS)]

if CHANGES:
    reads = 0

    @server.resource("test://counter", mime_type="text/plain")
    def counter() -> str:
        global reads
        reads += 1
        return f"read {reads}"

    @server.resource("test://add/{name}", mime_type="text/plain")
    async def add(name: str, ctx: Context) -> str:
        _add(name)
        await _tell_list_changed(ctx.request_context.session)
        held_get.set()
        return "added"

    @server.resource("test://race/{name}", mime_type="text/plain")
    async def race(name: str, ctx: Context) -> str:
        _add(f"{name}-1")
        race_armed.append(name)
        await _tell_list_changed(ctx.request_context.session)
        return "armed"

    _list_resources = server._handle_list_resources  # noqa: SLF001 - the handler the SDK registered

    async def list_racing(ctx: Any, params: Any) -> Any:
        """The list as it is when asked; a change armed by test://race/ lands (and is told) before it is answered."""
        result = await _list_resources(ctx, params)
        if race_armed:
            _add(f"{race_armed.pop()}-2")
            await _tell_list_changed(ctx.session)
            await anyio.sleep(0.3)  # the notification is out well before the (old) list
        return result

    server._lowlevel_server.add_request_handler(  # noqa: SLF001
        "resources/list", server._lowlevel_server._request_handlers["resources/list"].params_type,  # noqa: SLF001
        list_racing)

if os.environ.get("UPSTREAM_EDITS"):  # listed only when asked: other tests count what this server lists
    edition = [0]

    @server.resource("test://edited", mime_type="text/plain", description="edition 0")
    def edited() -> str:
        return f"edition {edition[0]}"

    @server.resource("test://edit/{n}", mime_type="text/plain")
    async def edit(n: str, ctx: Context) -> str:
        edition[0] = int(n)
        server._resource_manager._resources["test://edited"].description = f"edition {n}"  # noqa: SLF001
        await _tell_list_changed(ctx.request_context.session)
        return "edited"

    @server.resource("test://moving/a/x", mime_type="text/plain")
    async def moving() -> str:
        server._resource_manager._resources.pop("test://moving/a/x", None)  # noqa: SLF001
        server.add_resource(FunctionResource(uri="test://moving/b/x", name="moving", mime_type="text/plain",
                                             fn=lambda: "moved"))
        await bus.publish(ResourcesListChanged())
        return "moved"

LEGACY_ONLY = os.environ.get("UPSTREAM_WIRE") == "legacy"
MANY = int(os.environ.get("UPSTREAM_RESOURCES", "0"))
PAGE = int(os.environ.get("UPSTREAM_LISTS", "0"))
FLOOD = int(os.environ.get("UPSTREAM_FLOOD", "0"))
FLOOD_SECONDS = float(os.environ.get("UPSTREAM_FLOOD_SECONDS", "2"))
SLOW_INIT = float(os.environ.get("UPSTREAM_SLOW_INIT", "0"))
listings = 0


if MANY or PAGE or FLOOD:
    @server.resource("test://listings", mime_type="text/plain")
    def listings_answered() -> str:
        return str(listings)


if FLOOD:
    @server.resource("test://flood/{go}", mime_type="text/plain")
    async def flood(go: str, ctx: Context) -> str:
        session = ctx.request_context.session
        for _ in range(FLOOD):
            await _tell_list_changed(session)
            await anyio.sleep(FLOOD_SECONDS / FLOOD)
        return str(FLOOD)


def _scaled_lists() -> None:
    """resources/list with MANY generated entries after the registered ones, in pages of PAGE; resources/read of
    `test://res/{i}` answered without a template; every list counted."""
    from mcp_types import ListResourcesResult, ReadResourceResult, Resource, TextResourceContents

    lowlevel = server._lowlevel_server  # noqa: SLF001 - the handlers the SDK registered
    list_handler = lowlevel._request_handlers["resources/list"]  # noqa: SLF001
    read_handler = lowlevel._request_handlers["resources/read"]  # noqa: SLF001

    async def list_scaled(ctx: Any, params: Any) -> Any:
        global listings
        listings += 1
        own = (await _own_list(ctx, params)).resources
        start = int(params.cursor) if params is not None and params.cursor else 0
        total = len(own) + MANY
        end = total if PAGE <= 0 else min(total, start + PAGE)
        page = [own[i] if i < len(own) else Resource(uri=f"test://res/{i - len(own)}", name=f"res{i - len(own)}",
                                                       mime_type="text/plain") for i in range(start, end)]
        return ListResourcesResult(resources=page, next_cursor=str(end) if end < total else None)

    async def read_scaled(ctx: Any, params: Any) -> Any:
        uri = str(params.uri)
        if uri.startswith("test://res/") and uri[len("test://res/"):].isdigit():
            return ReadResourceResult(contents=[TextResourceContents(uri=uri, mime_type="text/plain",
                                                                     text=f"res {uri[len('test://res/'):]}")])
        return await _own_read(ctx, params)

    _own_list, _own_read = list_handler.handler, read_handler.handler
    lowlevel.add_request_handler("resources/list", list_handler.params_type, list_scaled)
    lowlevel.add_request_handler("resources/read", read_handler.params_type, read_scaled)


_scaled_lists()


async def serve_legacy_stdio() -> None:
    """stdio in the handshake era only (the SDK's HTTP manager's own loop), as a server on an older SDK would."""
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # noqa: SLF001
    async with stdio_server() as (read, write), lowlevel.lifespan(lowlevel) as state:
        if SLOW_INIT:
            read = await _slow_initialize(read)
        await serve_loop(lowlevel, read, write, lifespan_state=state,
                         init_options=lowlevel.create_initialization_options())


_pumps: list[Any] = []


async def _slow_initialize(read: Any) -> Any:
    """`read` with an `initialize` request held SLOW_INIT seconds before the server sees it."""
    forward, delayed = anyio.create_memory_object_stream[Any](16)

    async def pump() -> None:
        async with forward:
            async for message in read:
                if getattr(getattr(message, "message", None), "method", None) == "initialize":
                    await anyio.sleep(SLOW_INIT)
                await forward.send(message)

    import asyncio

    _pumps.append(asyncio.get_running_loop().create_task(pump()))  # ends with stdin
    return delayed


async def _read_body(receive: Any) -> tuple[bytes, Any]:
    """An ASGI request's body, and a `receive` that gives it again before the client's later messages."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

    async def again() -> Any:
        return replay.pop() if replay else await receive()

    return replay[0]["body"], again


def http_app() -> Any:
    """The Streamable HTTP app, with the options that change how it answers (UPSTREAM_SESSION_400, UPSTREAM_HOLD_GET)."""
    import json

    app = server.streamable_http_app()
    session_400 = os.environ.get("UPSTREAM_SESSION_400") == "1"
    hold_get = os.environ.get("UPSTREAM_HOLD_GET") == "1"

    async def refuse(send: Any, status: int, message: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "error": {"code": -32000, "message": message}}).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if hold_get and scope["method"] == "GET":
            await held_get.wait()
        if LEGACY_ONLY and scope["method"] == "POST":
            # A 2026-07-28 request (the envelope in _meta) is refused as an SDK without that era refuses it.
            body, receive = await _read_body(receive)
            if b"io.modelcontextprotocol/protocolVersion" in body:
                return await refuse(send, 400, "Bad Request: Server not initialized")

        replaced = False

        async def answer(message: Any) -> None:
            nonlocal replaced
            if session_400 and message["type"] == "http.response.start" and message["status"] == 404 and any(
                    name == b"mcp-session-id" for name, _ in scope["headers"]):
                replaced = True
                return await refuse(send, 400, "Bad Request: No valid session ID provided")
            if not replaced:
                await send(message)

        await app(scope, receive, answer)

    return wrapped


if __name__ == "__main__":
    if os.environ.get("UPSTREAM_PIDFILE"):
        with open(os.environ["UPSTREAM_PIDFILE"], "w") as pidfile:
            pidfile.write(str(os.getpid()))
    if sys.argv[1] == "stdio":
        print("upstream starting on stdio", file=sys.stderr, flush=True)
        if LEGACY_ONLY:
            anyio.run(serve_legacy_stdio)
        else:
            server.run("stdio")
    else:
        import uvicorn

        uvicorn.run(http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
