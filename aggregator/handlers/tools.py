"""The tool fallback, for clients without resources: `read_resource` and one tool per template the caller may see,
whose results are the contents resources/read gives (as embedded resources); `list_resources` and
`search_resources` answer with JSON (as text and as structured content) of what resources/list would show the
caller. Bad arguments come back in-band (`isError`), as MCP asks of tools."""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from aggregator.catalog import Catalog
from aggregator.errors import InvalidCursor, RequestError
from aggregator.handlers.running import INVALID_PARAMS, run_handler, scopes_of
from aggregator.mcp_shapes import COMPLETE, cache_scope, contents_dict, resource_dict, search_result, ttl_ms
from aggregator.metrics import Metrics
from aggregator.search import Discovery
from aggregator.search_query import InvalidSearch, parse_limit
from aggregator.service import ResourceService
from aggregator.tools import LIST_TOOL, SEARCH_TOOL, ToolSpec, template_tools, uri_for

__all__ = ["add_tools"]

_LIST_ARGUMENTS = frozenset({"prefix", "mimeType", "name", "cursor", "limit"})
_SEARCH_ARGUMENTS = frozenset({"query", "prefix", "limit"})


def add_tools(server: Server[Any], service: ResourceService, discovery: Discovery, metrics: Metrics | None) -> None:
    """Register tools/list and tools/call on `server`."""
    by_generation: dict[int, list[ToolSpec]] = {}

    def tools_for(catalog: Catalog, scopes: frozenset[str] | None) -> list[ToolSpec]:
        tools = by_generation.get(catalog.generation)
        if tools is None:
            by_generation.clear()
            tools = by_generation[catalog.generation] = template_tools(catalog.templates)
        return [t for t in tools if t.template is None or scopes is None or t.template.spec.access <= scopes]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> dict[str, Any]:
        async def body() -> dict[str, Any]:
            scopes, snapshot = scopes_of(ctx), service.snapshot
            return {"tools": [t.definition for t in tools_for(snapshot.catalog, scopes)],
                    "ttlMs": ttl_ms(snapshot.manifest.defaults.ttl),
                    "cacheScope": cache_scope(snapshot.listing_private(scopes)), **COMPLETE}

        return await run_handler(ctx, None, body, metrics)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        scopes = scopes_of(ctx)
        tool = next((t for t in tools_for(service.catalog, scopes) if t.name == params.name), None)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        if tool.name in (LIST_TOOL, SEARCH_TOOL):
            return await run_handler(ctx, None, lambda: _discover(discovery, tool.name, params.arguments or {}, scopes),
                                     metrics)
        try:
            uri = uri_for(tool, params.arguments or {})
        except ValueError as exc:
            return _tool_error(str(exc))

        async def body() -> dict[str, Any]:
            try:
                served = await service.read(uri, scopes)
            except RequestError as exc:
                return _tool_error(exc.message)
            return {"content": [{"type": "resource", "resource": contents_dict(uri, served.content)}], "isError": False,
                    **COMPLETE}

        return await run_handler(ctx, uri, body, metrics)

    server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)


async def _discover(discovery: Discovery, name: str, arguments: dict[str, Any], scopes: frozenset[str] | None
                    ) -> dict[str, Any]:
    """A list_resources or search_resources call; bad arguments come back in-band (`isError`)."""
    try:
        allowed = _SEARCH_ARGUMENTS if name == SEARCH_TOOL else _LIST_ARGUMENTS
        unknown = sorted(set(arguments) - allowed)
        if unknown:
            raise InvalidSearch(f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(sorted(allowed))}")
        strings = {key: _string_argument(arguments, key) for key in allowed - {"limit"}}
        if name == LIST_TOOL:
            size = discovery.service.page_size
            page = discovery.list_page(strings["cursor"], scopes, prefix=strings["prefix"] or "",
                                       mime_type=strings["mimeType"], name=strings["name"],
                                       limit=parse_limit(arguments.get("limit"), size, size))
            result: dict[str, Any] = {"resources": [resource_dict(e) for e in page.items]}
            if page.next_cursor is not None:
                result["nextCursor"] = page.next_cursor
        else:
            query = strings["query"]
            if query is None:
                raise InvalidSearch("argument 'query' (a string) is required")
            hits = await discovery.search(query, scopes, prefix=strings["prefix"] or "",
                                          limit=parse_limit(arguments.get("limit")))
            result = search_result(query, hits)
    except (InvalidSearch, InvalidCursor) as exc:
        return _tool_error(exc.message)
    return {"content": [{"type": "text", "text": json.dumps(result, ensure_ascii=False)}],
            "structuredContent": result, "isError": False, **COMPLETE}


def _string_argument(arguments: dict[str, Any], key: str) -> str | None:
    value = arguments.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidSearch(f"argument {key!r} must be a string")
    return value


def _tool_error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True, **COMPLETE}
