"""MCP wiring: thin handlers that translate protocol requests into `Aggregator` calls and back.

One low-level `Server` speaks both wires. The wire in use decides error codes (not-found is -32002 on the
legacy wire, -32602 on the modern one) and the modern wire's results carry `ttlMs`/`cacheScope`.
"""

from __future__ import annotations

import base64
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
from aggregator.catalog import Entry, TemplateEntry
from aggregator.content import Content
from aggregator.core import Aggregator
from aggregator.errors import InvalidCursor, RequestError, ResourceNotFound
from aggregator.manifest.model import Annotations, Display, Icon
from aggregator.notify import Notifier, TooManySubscriptions

__all__ = ["build_server", "contents_dict", "initialization_options", "resource_dict", "template_dict", "wire_summary"]

logger = logging.getLogger("aggregator.server")

LEGACY_NOT_FOUND = -32002
INVALID_PARAMS = types.INVALID_PARAMS
INTERNAL_ERROR = types.INTERNAL_ERROR
CACHE_SCOPE = "public"  # nothing served depends on who asks (until auth scopes exist)
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
    if isinstance(exc, InvalidCursor):
        return MCPError(INVALID_PARAMS, exc.message)
    return MCPError(INTERNAL_ERROR, exc.message, data=data)


async def _guarded(ctx: ServerRequestContext[Any], uri: str | None, call: Callable[[], Awaitable[R]]) -> R:
    """Run a handler body; catalog errors become MCP errors, anything else a generic one (logged, not leaked)."""
    try:
        return await call()
    except RequestError as exc:
        raise to_mcp_error(exc, is_modern(ctx)) from None
    except MCPError:
        raise
    except Exception:
        logger.exception("unexpected failure serving %s", uri or "a request")
        raise MCPError(INTERNAL_ERROR, "Internal error", data={"uri": uri} if uri else None) from None


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
    return _compact({"audience": list(a.audience) if a.audience else None, "priority": a.priority,
                     "lastModified": a.last_modified})


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
    annotations = _annotations(d.annotations, entry.last_modified)
    if annotations:
        out["annotations"] = annotations
    return out


def template_dict(entry: TemplateEntry) -> dict[str, Any]:
    """An MCP `ResourceTemplate` as it goes on the wire."""
    d = entry.spec.display
    return _compact({"uriTemplate": entry.uri_template, "name": entry.spec.name, "title": d.title,
                     "description": d.description, "mimeType": d.mime_type, "icons": _icons(d.icons),
                     "annotations": _annotations(d.annotations)})


def contents_dict(uri: str, content: Content) -> dict[str, Any]:
    """MCP `TextResourceContents` or `BlobResourceContents` as they go on the wire."""
    if content.text is not None:
        return {"uri": uri, "mimeType": content.mime_type, "text": content.text}
    return {"uri": uri, "mimeType": content.mime_type, "blob": base64.b64encode(content.blob or b"").decode("ascii")}


def _ttl_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def build_server(aggregator: Aggregator, notifier: Notifier | None = None) -> Server[Any]:
    """A low-level MCP server answering resources/list, resources/templates/list and resources/read, and with a
    notifier, resources/subscribe and unsubscribe (legacy wire) and subscriptions/listen (modern wire)."""

    def listing(items: list[dict[str, Any]], key: str, next_cursor: str | None) -> dict[str, Any]:
        result = {key: items, "ttlMs": _ttl_ms(aggregator.default_ttl), "cacheScope": CACHE_SCOPE, **COMPLETE}
        if next_cursor is not None:
            result["nextCursor"] = next_cursor
        return result

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None

        async def body() -> dict[str, Any]:
            page = aggregator.list_page(cursor)
            return listing([resource_dict(e) for e in page.items], "resources", page.next_cursor)  # type: ignore[arg-type]

        return await _guarded(ctx, None, body)

    async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> dict[str, Any]:
        cursor = params.cursor if params else None

        async def body() -> dict[str, Any]:
            page = aggregator.template_page(cursor)
            return listing([template_dict(t) for t in page.items], "resourceTemplates", page.next_cursor)  # type: ignore[arg-type]

        return await _guarded(ctx, None, body)

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> dict[str, Any]:
        uri = str(params.uri)

        async def body() -> dict[str, Any]:
            content = await aggregator.read(uri)
            return {"contents": [contents_dict(uri, content)], "ttlMs": _ttl_ms(aggregator.ttl_for(uri)),
                    "cacheScope": CACHE_SCOPE, **COMPLETE}

        return await _guarded(ctx, uri, body)

    settings = aggregator.manifest.server
    server: Server[Any] = _Server(
        settings.name,
        version=settings.version or __version__,
        title=settings.title,
        instructions=settings.instructions,
        on_list_resources=list_resources,  # type: ignore[arg-type]  # dict results are part of HandlerResult
        on_list_resource_templates=list_templates,  # type: ignore[arg-type]
        on_read_resource=read_resource,  # type: ignore[arg-type]
    )
    if notifier is not None:
        _add_subscriptions(server, aggregator, notifier)
    return server


class _Server(Server[Any]):
    """The SDK's low-level Server, whose default initialization options advertise listChanged truthfully.

    `streamable_http_app()` builds its options with a bare `NotificationOptions()`; this default makes HTTP
    sessions advertise what stdio ones do.
    """

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        live = self.get_request_handler("resources/subscribe") is not None
        return super().create_initialization_options(
            notification_options or NotificationOptions(resources_changed=live), *args, **kwargs)


def _connection(ctx: ServerRequestContext[Any]) -> Any:
    """The connection a message came on. The SDK makes a session per message; the connection is what lasts
    (and its exit stack is where cleanup goes). Not public in mcp 2.3."""
    return ctx.session._connection  # noqa: SLF001


def _add_subscriptions(server: Server[Any], aggregator: Aggregator, notifier: Notifier) -> None:
    async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)

        async def body() -> types.EmptyResult:
            aggregator.catalog.resolve(uri)  # unknown URIs get the not-found error, not a silent subscription
            try:
                notifier.subscribe(_connection(ctx), ctx.session, uri)
            except TooManySubscriptions as exc:
                raise MCPError(INVALID_PARAMS, str(exc), data={"uri": uri}) from None
            return types.EmptyResult()

        return await _guarded(ctx, uri, body)

    async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        notifier.unsubscribe(_connection(ctx), str(params.uri))
        return types.EmptyResult()

    async def listen(ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams) -> Any:
        try:
            return await notifier.listen(ctx, params)
        except TooManySubscriptions as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None

    async def initialized(ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        notifier.register(_connection(ctx), ctx.session)  # a legacy connection: it hears list_changed from now on

    server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    server.add_request_handler("subscriptions/listen", types.SubscriptionsListenRequestParams, listen)
    server.add_notification_handler("notifications/initialized", types.NotificationParams, initialized)


def initialization_options(server: Server[Any]) -> InitializationOptions:
    # listChanged is true only when the server can send it (a notifier is wired); subscribe follows the handler.
    return server.create_initialization_options()


def wire_summary() -> str:
    modern = ", ".join(sorted(MODERN_PROTOCOL_VERSIONS))
    return f"wires: legacy (2024-11-05..2025-11-25) and modern ({modern})"
