"""A small upstream MCP server for tests/test_upstream.py: `python upstream_server.py stdio` or `... http PORT`.

Static text and binary resources, a template with completion, one echoing a request header, a resource larger than
small limits, one that never answers, one whose handler fails with a secret in its message, and one whose name
depends on `UPSTREAM_TAG`. With `UPSTREAM_PIDFILE` set it writes its pid there (a test kills it); with
`UPSTREAM_CACHE=private:5000` (scope:ttlMs) its reads carry those caching hints (modern wire).
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Completion, ResourceTemplateReference

PNG = bytes.fromhex("89504e470d0a1a0a") + bytes(range(256))
TAG = os.environ.get("UPSTREAM_TAG", "one")

_scope, _, _ttl = os.environ.get("UPSTREAM_CACHE", "").partition(":")
server = MCPServer("test-upstream", version="1.0", cache_hints={
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


@server.resource("test://hang")
async def hang() -> str:
    await anyio.sleep(3600)
    return "never"


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


if __name__ == "__main__":
    if os.environ.get("UPSTREAM_PIDFILE"):
        with open(os.environ["UPSTREAM_PIDFILE"], "w") as pidfile:
            pidfile.write(str(os.getpid()))
    if sys.argv[1] == "stdio":
        print("upstream starting on stdio", file=sys.stderr, flush=True)
        server.run("stdio")
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
