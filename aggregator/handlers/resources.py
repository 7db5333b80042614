"""resources/list, resources/templates/list, resources/read and completion/complete: each a thin translation
between the protocol and `ResourceService` (search:// reads go to `Discovery`). Over HTTP a caller sees and reads
only entries whose `access` scopes its token holds; results that depend on the caller say `cacheScope: private`."""

from __future__ import annotations

import json
from time import perf_counter
from collections.abc import Callable
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

    @property
    def relaying(self) -> bool:
        """Whether a read may be relayed now (`relay_read`): some source of the current snapshot can."""
        return self.service.relays

    def relay_read(self, uri: str, modern: bool, reply: Callable[[dict[str, Any] | MCPError | None], None]
                   ) -> Callable[[], None] | None:
        """`read_resource` for a trusted caller (stdio) on the `modern` wire or not, served in callbacks where the
        service can (`ResourceService.relay`): `reply` gets the result, the MCPError the handler would raise, or
        None (then call `read_resource`: nothing was counted). Counted and access-logged as `run_handler` does;
        returns how to cancel it (counted as an error, as a cancelled handler is), or None: call `read_resource`."""
        if self.discovery.is_search_uri(uri):
            return None
        relay = _Relay(uri, modern, reply, self.metrics)
        give_up = self.service.relay(uri, None, relay.done)
        if give_up is None:
            return None
        relay.give_up = give_up
        return relay.cancel

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


class _Relay:
    """One read of `relay_read`: `done` tells its outcome once, or `cancel` gives it up first (counted as an error,
    as a cancelled handler is). One object a read, its bound methods the callbacks."""

    __slots__ = ("_uri", "_modern", "_reply", "_metrics", "_started", "_ended", "give_up")

    def __init__(self, uri: str, modern: bool, reply: Callable[[dict[str, Any] | MCPError | None], None],
                 metrics: Metrics | None) -> None:
        self._uri, self._modern, self._reply, self._metrics = uri, modern, reply, metrics
        self._started = perf_counter()
        self._ended = False
        self.give_up: Callable[[], None] = _nothing

    def done(self, outcome: Served | Exception | None) -> None:
        self._ended = True
        if outcome is None:
            self._reply(None)
            return
        if isinstance(outcome, Served):
            result: dict[str, Any] | MCPError = _read_result(self._uri, outcome)
            said = "ok"
        else:
            result, said = failure_of(outcome, self._uri, self._modern)
        if self._metrics is not None:
            self._metrics.observe(READ, self._uri, said, perf_counter() - self._started, STDIO)
        self._reply(result)

    def cancel(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.give_up()
        if self._metrics is not None:
            self._metrics.observe(READ, self._uri, "error", perf_counter() - self._started, STDIO)


def _nothing() -> None:
    """What a relayed read not yet started gives up."""


def _read_result(uri: str, served: Served) -> ReadResult:
    """A read's result: ttl and cache scope come with the content, from the snapshot it was read from."""
    return read_result(uri, served.content, served.ttl, served.private)
