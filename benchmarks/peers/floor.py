"""The protocol floor: a bare low-level SDK `Server` answering from preloaded `Resource` objects and strings.

Usage: python -m benchmarks.peers.floor FOLDER PAGE_SIZE [--annotated] [--disk] [--http PORT]
(URIs are bench://<path>)

Every file is read into a dict at start; listing pages through a preloaded list with an integer cursor; a read is
one dict lookup. `--annotated` also lists what aggregator-annotated lists (`annotations.lastModified` from the file's
mtime), so listing costs compare like for like. `--disk` (the `floor-disk` peer) opens and reads the file on every
read instead, on the event loop with a plain `open`: what a bare SDK server reading from disk costs, with none of
aggregator's safety (no thread, timeout, containment or file-type check). Unknown URIs get -32602 with data.uri.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import anyio
from mcp import types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

TTL_MS = 300_000


def load(root: str) -> dict[str, str]:
    """Every file under `root` as {bench://<relative path>: text}."""
    contents: dict[str, str] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as handle:
                contents["bench://" + os.path.relpath(path, root).replace(os.sep, "/")] = handle.read()
    return contents


def resources_of(root: str, contents: dict[str, str], annotated: bool) -> list[types.Resource]:
    """One `Resource` per file, sorted by URI; with `annotated`, lastModified from the file's mtime."""
    def annotations(uri: str) -> types.Annotations | None:
        if not annotated:
            return None
        mtime = os.stat(os.path.join(root, uri[len("bench://"):])).st_mtime
        return types.Annotations(last_modified=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime)))

    return [types.Resource(uri=uri, name=uri[len("bench://"):], mime_type="text/markdown",
                           size=len(contents[uri]), annotations=annotations(uri))
            for uri in sorted(contents)]


def build(root: str, page_size: int, annotated: bool = False, disk: bool = False) -> Server[Any]:
    """The floor server over `root`, listing `page_size` resources per page; with `disk`, every read opens and
    reads the file (the listing is the same)."""
    contents = load(root)
    resources = resources_of(root, contents, annotated)
    paths = {uri: os.path.join(root, uri[len("bench://"):]) for uri in contents} if disk else {}

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        start = int(params.cursor) if params and params.cursor else 0
        end = start + page_size
        return types.ListResourcesResult(resources=resources[start:end],
                                         next_cursor=str(end) if end < len(resources) else None,
                                         ttl_ms=TTL_MS, cache_scope="public")

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if disk:
            path = paths.get(params.uri)
            if path is None:
                raise MCPError(-32602, "Resource not found", data={"uri": params.uri})
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        else:
            text = contents.get(params.uri)
            if text is None:
                raise MCPError(-32602, "Resource not found", data={"uri": params.uri})
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type="text/markdown", text=text)],
            ttl_ms=TTL_MS, cache_scope="public")

    return Server("floor", version="1", on_list_resources=list_resources, on_read_resource=read_resource)


async def serve(root: str, page_size: int, annotated: bool, disk: bool) -> None:
    """Serve the floor over stdio until stdin closes."""
    server = build(root, page_size, annotated, disk)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve_http(root: str, page_size: int, annotated: bool, disk: bool, port: int) -> None:
    """Serve the floor over Streamable HTTP at http://127.0.0.1:PORT/mcp until killed."""
    import uvicorn

    app = build(root, page_size, annotated, disk).streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    extra = sys.argv[3:]
    if "--http" in extra:
        serve_http(sys.argv[1], int(sys.argv[2]), "--annotated" in extra, "--disk" in extra,
                   int(extra[extra.index("--http") + 1]))
    else:
        anyio.run(serve, sys.argv[1], int(sys.argv[2]), "--annotated" in extra, "--disk" in extra)
