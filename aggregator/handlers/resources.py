"""resources/list, resources/templates/list, resources/read and completion/complete: each a thin translation
between the protocol and `ResourceService` (search:// reads go to `Discovery`). Over HTTP a caller sees and reads
only entries whose `access` scopes its token holds; results that depend on the caller say `cacheScope: private`."""

from __future__ import annotations

import json
from time import perf_counter
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from aggregator.callers import caller_name
from aggregator.completion import NONE as NO_COMPLETIONS
from aggregator.completion import Completer
from aggregator.handlers.running import failure_of, run_handler, scopes_of
from aggregator.listing_json import items_json
from aggregator.mcp_shapes import (COMPLETE, SEARCH_TEMPLATE_DICT, ReadResult, cache_scope, read_result, resource_dict,
                                   search_result, template_dict, ttl_ms)
from aggregator.metrics import Metrics
from aggregator.reads.reader import Served
from aggregator.reads.relayed import RelayPlan
from aggregator.search import Discovery
from aggregator.service import ResourceService, ServedPage
from aggregator.wire_results import READ, ItemsText

__all__ = ["ResourceHandlers"]

STDIO = caller_name(None)
"""Who a relayed read's caller is in the access log: it comes over stdio (trusted, no HTTP request)."""


class ResourceHandlers:
    """The resources methods' handlers over one service (bound methods are what the SDK's Server calls)."""

    def __init__(self, service: ResourceService, discovery: Discovery, metrics: Metrics | None) -> None:
        self.service, self.discovery, self.metrics = service, discovery, metrics
        self.completer = Completer()

    async def list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None
        as_text = getattr(ctx, "items_text", False)  # the stdio fast path: its page_line writes ItemsText as it is

        async def body() -> dict[str, Any]:
            if as_text:  # encoded from the rows' columns, no Entry or dict per row (`listing_json`)
                rows = self.service.list_rows(cursor, scopes_of(ctx))
                page = rows.page
                return _listing(ItemsText(items_json(page.rows, page.start, page.stop)), "resources", rows)
            served = self.service.list_page(cursor, scopes_of(ctx))
            return _listing([resource_dict(e) for e in served.page.items], "resources", served)

        return await run_handler(ctx, None, body, self.metrics)

    async def list_templates(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None

        async def body() -> dict[str, Any]:
            served = self.service.template_page(cursor, scopes_of(ctx))
            items = [template_dict(t) for t in served.page.items]
            if served.page.next_cursor is None and self.discovery.template_offered():
                items.append(SEARCH_TEMPLATE_DICT)
            return _listing(items, "resourceTemplates", served)

        return await run_handler(ctx, None, body, self.metrics)

    async def read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> dict[str, Any]:
        uri = str(params.uri)
        service, discovery = self.service, self.discovery

        async def body() -> dict[str, Any]:
            scopes = scopes_of(ctx)
            if discovery.is_search_uri(uri):
                q, prefix, limit = discovery.parse_search_uri(uri)
                hits = await discovery.search(q, scopes, prefix=prefix, limit=limit)
                text = json.dumps(search_result(q, hits), ensure_ascii=False)
                return {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}], "ttlMs": 0,
                        "cacheScope": cache_scope(scopes is not None and service.catalog.restricted), **COMPLETE}
            return _read_result(uri, await service.read(uri, scopes))

        return await run_handler(ctx, uri, body, self.metrics)

    def relay_plan(self, uri: str) -> RelayPlan | None:
        """How `read_resource` of `uri` for a trusted caller (stdio) is served in callbacks where the service can
        (`ResourceService.relay_plan`); None: call `read_resource`. What such a read serves is `relayed`'s."""
        return self.service.relay_plan(uri, self.discovery.is_search_uri)

    def relayed(self, uri: str, modern: bool, outcome: Served | Exception, started: float) -> ReadResult | MCPError:
        """What `read_resource` answers for a relayed read of `uri` on the `modern` wire or not, begun at `started`
        (`perf_counter`): the result, or the MCPError it would raise; counted and access-logged as `run_handler`
        does."""
        if isinstance(outcome, Served):
            result: ReadResult | MCPError = _read_result(uri, outcome)
            said = "ok"
        else:
            result, said = failure_of(outcome, uri, modern)
        self.relay_counted(uri, said, started)
        return result

    def relay_counted(self, uri: str, said: str, started: float) -> None:
        """Count and access-log a relayed read of `uri` begun at `started` that ended as `said` (`relayed`'s outcome;
        "ok" for one served as its plan shaped it, "error" for one given up, as a cancelled handler is)."""
        if self.metrics is not None:
            self.metrics.observe(READ, uri, said, perf_counter() - started, STDIO)

    async def complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        async def body() -> dict[str, Any]:
            found = NO_COMPLETIONS
            ref = params.ref
            if isinstance(ref, types.ResourceTemplateReference):
                async with self.service.lease() as snapshot:  # the template and its source from one snapshot
                    template = snapshot.template_for(ref.uri, scopes_of(ctx))
                    if template is not None:
                        context = params.context.arguments if params.context else None
                        source = snapshot.sources.get(template.spec.source) if template.spec.source else None
                        found = await self.completer.complete(template, source, params.argument.name,
                                                              params.argument.value, context)
            # Unknown references (prompts: there are none) complete to nothing rather than fail.
            return {"completion": {"values": found.values, "total": found.total, "hasMore": found.has_more},
                    **COMPLETE}

        return await run_handler(ctx, None, body, self.metrics)


def _listing(items: list[dict[str, Any]] | ItemsText, key: str, served: ServedPage[Any]) -> dict[str, Any]:
    result = {key: items, "ttlMs": ttl_ms(served.ttl), "cacheScope": cache_scope(served.private), **COMPLETE}
    if served.page.next_cursor is not None:
        result["nextCursor"] = served.page.next_cursor
    return result


def _read_result(uri: str, served: Served) -> ReadResult:
    """A read's result: ttl and cache scope come with the content, from the snapshot it was read from."""
    return read_result(uri, served.content, served.ttl, served.private)
