"""MCP wiring: thin handlers that translate protocol requests into `ResourceService` calls and back.

One low-level `Server` speaks both wires. The wire in use decides error codes (not-found is -32002 on the
legacy wire, -32602 on the modern one) and the modern wire's results carry `ttlMs`/`cacheScope`.
"""

from __future__ import annotations

import base64
import json
import logging
from functools import lru_cache
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator import __version__
from aggregator.catalog import FILE_MTIME, Catalog, Entry, TemplateEntry
from aggregator.completion import NONE as NO_COMPLETIONS
from aggregator.completion import Completer
from aggregator.content import Content
from aggregator.service import ResourceService, ServedPage
from aggregator.errors import InvalidCursor, RequestError, ResourceNotFound
from aggregator.manifest.model import Annotations, Display, Icon
from aggregator.auth import caller_name, caller_scopes
from aggregator.metrics import Metrics, timer
from aggregator.notify import Notifier, TooManySubscriptions
from aggregator.sdk_compat import connection_of
from aggregator.search import SEARCH_TEMPLATE, Discovery, Hit, InvalidSearch, parse_limit
from aggregator.tools import LIST_TOOL, SEARCH_TOOL, ToolSpec, template_tools, uri_for

__all__ = ["build_server", "contents_dict", "initialization_options", "resource_dict", "template_dict", "wire_summary"]

logger = logging.getLogger("aggregator.server")

LEGACY_NOT_FOUND = -32002
INVALID_PARAMS = types.INVALID_PARAMS
INTERNAL_ERROR = types.INTERNAL_ERROR
# The modern wire requires `resultType`; the legacy wire's result schema drops it.
COMPLETE = {"resultType": "complete"}

R = TypeVar("R")


def is_modern(ctx: ServerRequestContext[Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def to_mcp_error(exc: RequestError, modern: bool) -> MCPError:
    """The MCP error a client sees for a catalog error, with the code its wire expects."""
    data = {"uri": exc.uri} if exc.uri is not None else None
    if isinstance(exc, ResourceNotFound):
        return MCPError(INVALID_PARAMS if modern else LEGACY_NOT_FOUND, "Resource not found", data=data)
    if isinstance(exc, (InvalidCursor, InvalidSearch)):
        return MCPError(INVALID_PARAMS, exc.message)
    return MCPError(INTERNAL_ERROR, exc.message, data=data)


async def _run_handler(ctx: ServerRequestContext[Any], uri: str | None, call: Callable[[], Awaitable[R]],
                   metrics: Metrics | None = None) -> R:
    """Run a handler body; catalog errors become MCP errors, anything else a generic one (logged, not leaked).
    With `metrics`, the request is counted and access-logged with its outcome."""
    elapsed, outcome = timer(), "error"
    try:
        result = await call()
        outcome = "ok"
        return result
    except RequestError as exc:
        outcome = _OUTCOMES.get(type(exc).__name__, "error")
        raise to_mcp_error(exc, is_modern(ctx)) from None
    except MCPError:
        outcome = "invalid"
        raise
    except Exception:
        logger.exception("unexpected failure serving %s", uri or "a request")
        raise MCPError(INTERNAL_ERROR, "Internal error", data={"uri": uri} if uri else None) from None
    finally:
        if metrics is not None:
            metrics.observe(ctx.method, uri, outcome, elapsed(), caller_name(ctx.request))


_OUTCOMES = {"ResourceNotFound": "not_found", "InvalidCursor": "invalid", "InvalidSearch": "invalid",
             "ResourceTooLarge": "too_large", "ResourceUnavailable": "unavailable", "ResourceOverBudget": "over_budget",
             "ResourceCorrupt": "corrupt", "ResourceRenderFailed": "render_failed"}


def _scopes(ctx: ServerRequestContext[Any]) -> frozenset[str] | None:
    return caller_scopes(ctx.request)


def _cache_scope(private: bool) -> str:
    return "private" if private else "public"


# Handlers return wire-shaped dicts: the SDK validates and sieves every result against the negotiated
# protocol version anyway, so building pydantic models first would only do that work twice.


@lru_cache(maxsize=1024)
def _icons(icons: tuple[Icon, ...] | None) -> list[dict[str, Any]] | None:
    if not icons:
        return None
    return [_compact({"src": i.src, "mimeType": i.mime_type, "sizes": list(i.sizes) if i.sizes else None,
                      "theme": i.theme}) for i in icons]


@lru_cache(maxsize=1024)
def _static_annotations(a: Annotations | None) -> dict[str, Any]:
    if a is None:
        return {}
    # `lastModified: file` is filled per entry (`Entry.listed_last_modified`).
    return _compact({"audience": list(a.audience) if a.audience else None, "priority": a.priority,
                     "lastModified": None if a.last_modified == FILE_MTIME else a.last_modified})


def _annotations(a: Annotations | None, last_modified: str | None = None) -> dict[str, Any] | None:
    fields = _static_annotations(a)
    if last_modified is not None and "lastModified" not in fields:
        return {**fields, "lastModified": last_modified}
    return dict(fields) if fields else None


def _compact(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def resource_dict(entry: Entry) -> dict[str, Any]:
    """An MCP `Resource` as it goes on the wire. Called for every listed entry of a page: kept lean."""
    d: Display = entry.display
    out: dict[str, Any] = {"uri": entry.uri, "name": entry.name}
    if entry.title is not None:
        out["title"] = entry.title
    if d.description is not None:
        out["description"] = d.description
    if entry.mime_type is not None:
        out["mimeType"] = entry.mime_type
    if entry.size is not None:
        out["size"] = entry.size
    if d.icons:
        out["icons"] = _icons(d.icons)
    if d.annotations is not None:
        annotations = _annotations(d.annotations, entry.listed_last_modified)
        if annotations:
            out["annotations"] = annotations
    return out


def template_dict(entry: TemplateEntry) -> dict[str, Any]:
    """An MCP `ResourceTemplate` as it goes on the wire."""
    d = entry.spec.display
    return _compact({"uriTemplate": entry.uri_template, "name": entry.spec.name, "title": d.title,
                     "description": d.description, "mimeType": d.mime_type, "icons": _icons(d.icons),
                     "annotations": _annotations(d.annotations)})


SEARCH_TEMPLATE_DICT = {
    "uriTemplate": SEARCH_TEMPLATE, "name": "search", "title": "Search resources", "mimeType": "application/json",
    "description": "Resources whose URI, name, title, description or (indexed) text hold every word of q, best "
                   "first, as JSON with snippets; prefix narrows to URIs starting with it, limit caps the results "
                   "(default 20, at most 100). E.g. search://?q=install%20docker&limit=5",
}


def hit_dict(hit: Hit) -> dict[str, Any]:
    """A search result: the resource as resources/list shows it, and a snippet when its text matched."""
    out = resource_dict(hit.entry)
    if hit.snippet:
        out["snippet"] = hit.snippet
    return out


def search_result(query: str, hits: list[Hit]) -> dict[str, Any]:
    return {"query": query, "results": [hit_dict(h) for h in hits]}


def contents_dict(uri: str, content: Content) -> dict[str, Any]:
    """MCP `TextResourceContents` or `BlobResourceContents` as they go on the wire."""
    if content.text is not None:
        return {"uri": uri, "mimeType": content.mime_type, "text": content.text}
    return {"uri": uri, "mimeType": content.mime_type, "blob": base64.b64encode(content.blob or b"").decode("ascii")}


def _ttl_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def build_server(service: ResourceService, notifier: Notifier | None = None, metrics: Metrics | None = None, *,
                 legacy_notifications: bool = True, discovery: Discovery | None = None) -> Server[Any]:
    """A low-level MCP server answering resources/list, resources/templates/list and resources/read, and with a
    notifier, resources/subscribe and unsubscribe (legacy wire) and subscriptions/listen (modern wire).

    Over HTTP a caller sees and reads only entries whose `access` scopes its token holds; over stdio (no HTTP
    request) everything. Results that depend on the caller say `cacheScope: private`.
    `legacy_notifications=False` (stateless HTTP: no session outlives a request) makes the legacy wire advertise
    neither subscribe nor listChanged and refuse `resources/subscribe`; the modern wire's listen is unaffected.
    `discovery` answers search:// reads and the list/search tools (its indexer runs apart: `Discovery.run`).
    """
    if discovery is None:
        discovery = Discovery(service, tools=service.manifest.server.tools)

    def listing(items: list[dict[str, Any]], key: str, served: ServedPage) -> dict[str, Any]:
        result = {key: items, "ttlMs": _ttl_ms(served.ttl), "cacheScope": _cache_scope(served.private), **COMPLETE}
        if served.page.next_cursor is not None:
            result["nextCursor"] = served.page.next_cursor
        return result

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None

        async def body() -> dict[str, Any]:
            served = service.list_page(cursor, _scopes(ctx))
            return listing([resource_dict(e) for e in served.page.items], "resources", served)

        return await _run_handler(ctx, None, body, metrics)

    async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None

        async def body() -> dict[str, Any]:
            served = service.template_page(cursor, _scopes(ctx))
            items = [template_dict(t) for t in served.page.items]
            if served.page.next_cursor is None and discovery.template_offered():
                items.append(SEARCH_TEMPLATE_DICT)
            return listing(items, "resourceTemplates", served)

        return await _run_handler(ctx, None, body, metrics)

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> dict[str, Any]:
        uri = str(params.uri)

        async def body() -> dict[str, Any]:
            scopes = _scopes(ctx)
            if discovery.is_search_uri(uri):
                q, prefix, limit = discovery.parse_search_uri(uri)
                hits = await discovery.search(q, scopes, prefix=prefix, limit=limit)
                text = json.dumps(search_result(q, hits), ensure_ascii=False)
                return {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}], "ttlMs": 0,
                        "cacheScope": _cache_scope(scopes is not None and service.catalog.restricted),
                        **COMPLETE}
            # ttl and cache scope come with the content, from the snapshot it was read from.
            served = await service.read(uri, scopes)
            return {"contents": [contents_dict(uri, served.content)], "ttlMs": _ttl_ms(served.ttl),
                    "cacheScope": _cache_scope(served.private), **COMPLETE}

        return await _run_handler(ctx, uri, body, metrics)

    completer = Completer()

    async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> dict[str, Any]:
        async def body() -> dict[str, Any]:
            found = NO_COMPLETIONS
            ref = params.ref
            if isinstance(ref, types.ResourceTemplateReference):
                async with service.lease() as snapshot:  # the template and its source from one snapshot
                    template = snapshot.template_for(ref.uri, _scopes(ctx))
                    if template is not None:
                        context = params.context.arguments if params.context else None
                        source = snapshot.sources.get(template.spec.source) if template.spec.source else None
                        found = await completer.complete(template, source, params.argument.name,
                                                         params.argument.value, context)
            # Unknown references (prompts: there are none) complete to nothing rather than fail.
            return {"completion": {"values": found.values, "total": found.total, "hasMore": found.has_more},
                    **COMPLETE}

        return await _run_handler(ctx, None, body, metrics)

    settings = service.manifest.server
    server: Server[Any] = _Server(
        settings.name,
        version=settings.version or __version__,
        title=settings.title,
        instructions=settings.instructions,
        on_list_resources=list_resources,  # dict results are part of HandlerResult
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_completion=complete,
        legacy_notifications=legacy_notifications and notifier is not None,
    )
    if notifier is not None:
        _add_subscriptions(server, service, notifier, metrics, legacy=legacy_notifications)
    if settings.tools:
        _add_tools(server, service, discovery, metrics)
    return server


class _Server(Server[Any]):
    """The SDK's low-level Server, whose legacy-wire capabilities advertise subscribe and listChanged truthfully.

    `streamable_http_app()` builds its options with a bare `NotificationOptions()`; this default makes HTTP
    sessions advertise what stdio ones do. Without legacy notifications (stateless HTTP) the legacy wire
    advertises neither; the modern wire's flags follow `subscriptions/listen` as the SDK derives them.
    """

    def __init__(self, *args: Any, legacy_notifications: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.legacy_notifications = legacy_notifications

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(resources_changed=self.legacy_notifications), *args, **kwargs)

    def get_capabilities(self, *args: Any, protocol_version: str | None = None, **kwargs: Any
                         ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        if (protocol_version not in MODERN_PROTOCOL_VERSIONS and not self.legacy_notifications
                and capabilities.resources is not None):
            # The subscribe handler stays registered (to refuse with a reason), so the SDK would say true.
            capabilities.resources = types.ResourcesCapability(subscribe=False, list_changed=False)
        return capabilities


STATELESS_SUBSCRIBE = ("resources/subscribe is not available: this server runs stateless (--stateless), so no "
                       "session outlives a request to deliver notifications/resources/updated on; use "
                       "subscriptions/listen on the 2026-07-28 wire, or a server without --stateless")


def _add_subscriptions(server: Server[Any], service: ResourceService, notifier: Notifier,
                       metrics: Metrics | None, *, legacy: bool = True) -> None:
    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)

        async def body() -> types.EmptyResult:
            if not legacy:
                # Accepting would be a promise never kept: the session is thrown away with this request.
                raise MCPError(types.METHOD_NOT_FOUND, STATELESS_SUBSCRIBE, data={"uri": uri})
            # Unknown or hidden URIs get the not-found error, not a silent subscription.
            service.allowed(uri, _scopes(ctx))
            try:
                notifier.subscribe(connection_of(ctx), ctx.session, uri, _visible_to(service, _scopes(ctx)))
            except TooManySubscriptions as exc:
                raise MCPError(INVALID_PARAMS, str(exc), data={"uri": uri}) from None
            return types.EmptyResult()

        return await _run_handler(ctx, uri, body, metrics)

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        notifier.unsubscribe(connection_of(ctx), str(params.uri))
        return types.EmptyResult()

    async def listen(ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams) -> Any:
        scopes, uris = _scopes(ctx), params.notifications.resource_subscriptions or []
        kept = [uri for uri in uris if scopes is None or _listenable(service, uri, scopes)]
        if len(kept) != len(uris):
            # Hidden URIs are dropped as silently as unknown ones are kept: a caller cannot probe for them.
            notifications = params.notifications.model_copy(update={"resource_subscriptions": kept})
            params = params.model_copy(update={"notifications": notifications})
        try:
            return await notifier.listen(ctx, params, _visible_to(service, scopes))
        except TooManySubscriptions as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None

    async def initialized(ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        notifier.register(connection_of(ctx), ctx.session)  # a legacy connection: it hears list_changed from now on

    server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen)
    if legacy:  # a stateless session is thrown away with its request: nothing to register
        server.add_notification_handler("notifications/initialized", types.NotificationParams, initialized)


def _add_tools(server: Server[Any], service: ResourceService, discovery: Discovery, metrics: Metrics | None) -> None:
    """The tool fallback: `read_resource` and one tool per template the caller may see; results are the same
    contents `resources/read` gives, as embedded resources. `list_resources` and `search_resources` answer with
    JSON (as text and as structured content) of what resources/list would show the caller."""
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
            scopes, snapshot = _scopes(ctx), service.snapshot
            return {"tools": [t.definition for t in tools_for(snapshot.catalog, scopes)],
                    "ttlMs": _ttl_ms(snapshot.manifest.defaults.ttl),
                    "cacheScope": _cache_scope(snapshot.listing_private(scopes)), **COMPLETE}

        return await _run_handler(ctx, None, body, metrics)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        scopes = _scopes(ctx)
        tool = next((t for t in tools_for(service.catalog, scopes) if t.name == params.name), None)
        if tool is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
        if tool.name in (LIST_TOOL, SEARCH_TOOL):
            return await _run_handler(ctx, None, lambda: _discover(discovery, tool.name, params.arguments or {}, scopes),
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

        return await _run_handler(ctx, uri, body, metrics)

    server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)


_LIST_ARGUMENTS = frozenset({"prefix", "mimeType", "name", "cursor", "limit"})
_SEARCH_ARGUMENTS = frozenset({"query", "prefix", "limit"})


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


def _readable(service: ResourceService, uri: str, scopes: frozenset[str]) -> bool:
    try:
        service.allowed(uri, scopes)
    except ResourceNotFound:
        return False
    return True


def _visible_to(service: ResourceService, scopes: frozenset[str] | None) -> Callable[[str], bool] | None:
    """Whether a caller may hear `updated` for a URI, asked when it is sent: a reload may have added `access` to
    it, or it may have appeared hidden. None for a trusted (stdio) caller, who hears everything."""
    if scopes is None:
        return None
    return lambda uri: _readable(service, uri, scopes)


def _listenable(service: ResourceService, uri: str, scopes: frozenset[str]) -> bool:
    """Unknown URIs may be listened to (they may appear); known ones only with the scopes they need."""
    if _readable(service, uri, scopes):
        return True
    try:
        service.catalog.resolve(uri)
    except ResourceNotFound:
        return True
    return False


def initialization_options(server: Server[Any]) -> InitializationOptions:
    # listChanged is true only when the server can send it (a notifier is wired); subscribe follows the handler.
    return server.create_initialization_options()


def wire_summary() -> str:
    modern = ", ".join(sorted(MODERN_PROTOCOL_VERSIONS))
    return f"wires: legacy (2024-11-05..2025-11-25) and modern ({modern})"
