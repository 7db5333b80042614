"""The protocol floor: a bare low-level SDK server serving preloaded Resource objects and strings.

Usage: python -m benchmarks.peers.floor FOLDER PAGE_SIZE [--annotated]   (URIs are bench://<relative path>)
`--annotated` adds what aggregator lists too (annotations.lastModified from the file's mtime), so listing
costs compare like for like.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError


def build(root: str, page_size: int, annotated: bool = False) -> Server[Any]:
    contents: dict[str, str] = {}
    mtimes: dict[str, str] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as handle:
                contents["bench://" + rel] = handle.read()
            mtimes["bench://" + rel] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.stat(path).st_mtime))
    uris = sorted(contents)
    resources = [types.Resource(uri=u, name=u[len("bench://"):], mime_type="text/markdown", size=len(contents[u]),
                                annotations=types.Annotations(last_modified=mtimes[u]) if annotated else None)
                 for u in uris]

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        start = int(params.cursor) if params and params.cursor else 0
        end = start + page_size
        return types.ListResourcesResult(resources=resources[start:end],
                                         next_cursor=str(end) if end < len(resources) else None,
                                         ttl_ms=300_000, cache_scope="public")

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        text = contents.get(params.uri)
        if text is None:
            raise MCPError(-32002, "Resource not found", data={"uri": params.uri})
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type="text/markdown", text=text)],
            ttl_ms=300_000, cache_scope="public")

    return Server("floor", version="1", on_list_resources=list_resources, on_read_resource=read_resource)


async def main(root: str, page_size: int, annotated: bool) -> None:
    server = build(root, page_size, annotated)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), "--annotated" in sys.argv[3:])
