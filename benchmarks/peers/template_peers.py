"""Peers for the 1,000-template workload: URIs `tpl://tNNNN/dNNNN/fNNN`, template NNNN of N, each reading
`dNNNN/fNNN.md` of the workload folder.

Usage: python -m benchmarks.peers.template_peers floor|sdk_mcpserver FOLDER TEMPLATES

- `floor`: a bare low-level SDK `Server` that parses the URI by hand (one regex) and answers from preloaded strings:
  the cheapest a hand-written server can be.
- `sdk_mcpserver`: the SDK's `MCPServer` with one decorated template resource per template, as a user would write it
  (it tries its templates in registration order and reads the file on every read).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from benchmarks.peers.floor import TTL_MS, load

URI = re.compile(r"tpl://t(\d{4})/(d\d{4})/(f\d{3})")


def template_text(i: int) -> str:
    return f"tpl://t{i:04}/{{folder}}/{{file}}"


def floor(root: str, templates: int) -> Server[Any]:
    contents = {uri[len("bench://"):]: text for uri, text in load(root).items()}

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        m = URI.fullmatch(params.uri)
        text = contents.get(f"{m.group(2)}/{m.group(3)}.md") if m and int(m.group(1)) < templates else None
        if text is None:
            raise MCPError(-32602, "Resource not found", data={"uri": params.uri})
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, mime_type="text/markdown", text=text)],
            ttl_ms=TTL_MS, cache_scope="public")

    async def list_templates(ctx: Any, params: types.PaginatedRequestParams | None
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template=template_text(i), name=f"t{i:04}") for i in range(templates)],
            ttl_ms=TTL_MS, cache_scope="public")

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[], ttl_ms=TTL_MS, cache_scope="public")

    return Server("floor-templates", version="1", on_read_resource=read_resource,
                  on_list_resource_templates=list_templates, on_list_resources=list_resources)


def sdk_mcpserver(root: str, templates: int) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("sdk-mcpserver-templates", log_level="WARNING")
    base = Path(root)
    for i in range(templates):
        def read(folder: str, file: str) -> str:
            return (base / folder / f"{file}.md").read_text()

        server.resource(template_text(i), name=f"t{i:04}", mime_type="text/markdown")(read)
    return server


async def _serve_floor(root: str, templates: int) -> None:
    server = floor(root, templates)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    kind, folder, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "floor":
        anyio.run(_serve_floor, folder, count)
    else:
        sdk_mcpserver(folder, count).run("stdio")
