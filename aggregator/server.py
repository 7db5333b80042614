"""MCP wiring: thin handlers that translate protocol requests into `Aggregator` calls and back.

One low-level `Server` speaks both wires. The wire in use decides error codes (not-found is -32002 on the
legacy wire, -32602 on the modern one) and the modern wire's results carry `ttlMs`/`cacheScope`.
"""

from __future__ import annotations

import base64
import logging
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

__all__ = ["build_server", "initialization_options", "wire_summary"]

logger = logging.getLogger("aggregator.server")

LEGACY_NOT_FOUND = -32002
INVALID_PARAMS = types.INVALID_PARAMS
INTERNAL_ERROR = types.INTERNAL_ERROR
CACHE_SCOPE = "public"  # nothing served depends on who asks (until auth scopes exist)

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


def _icons(icons: tuple[Icon, ...] | None) -> list[types.Icon] | None:
    if not icons:
        return None
    return [types.Icon(src=i.src, mime_type=i.mime_type, sizes=list(i.sizes) if i.sizes else None,
                       theme=i.theme) for i in icons]  # type: ignore[arg-type]


def _annotations(a: Annotations | None, last_modified: str | None = None) -> types.Annotations | None:
    if a is None and last_modified is None:
        return None
    a = a or Annotations()
    return types.Annotations(audience=list(a.audience) if a.audience else None, priority=a.priority,
                             last_modified=last_modified or a.last_modified)  # type: ignore[arg-type]


def to_resource(entry: Entry) -> types.Resource:
    d: Display = entry.display
    return types.Resource(uri=entry.uri, name=entry.name, title=entry.title, description=d.description,
                          mime_type=entry.mime_type, size=entry.size, icons=_icons(d.icons),
                          annotations=_annotations(d.annotations, entry.last_modified))


def to_template(entry: TemplateEntry) -> types.ResourceTemplate:
    d = entry.spec.display
    return types.ResourceTemplate(uri_template=entry.uri_template, name=entry.spec.name, title=d.title,
                                  description=d.description, mime_type=d.mime_type, icons=_icons(d.icons),
                                  annotations=_annotations(d.annotations))


def to_contents(uri: str, content: Content) -> types.TextResourceContents | types.BlobResourceContents:
    if content.text is not None:
        return types.TextResourceContents(uri=uri, mime_type=content.mime_type, text=content.text)
    blob = base64.b64encode(content.blob or b"").decode("ascii")
    return types.BlobResourceContents(uri=uri, mime_type=content.mime_type, blob=blob)


def _ttl_ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


def build_server(aggregator: Aggregator) -> Server[Any]:
    """A low-level MCP server answering resources/list, resources/templates/list and resources/read."""

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        cursor = params.cursor if params else None

        async def body() -> types.ListResourcesResult:
            page = aggregator.list_page(cursor)
            return types.ListResourcesResult(resources=[to_resource(e) for e in page.items],  # type: ignore[arg-type]
                                             next_cursor=page.next_cursor,
                                             ttl_ms=_ttl_ms(aggregator.default_ttl), cache_scope=CACHE_SCOPE)

        return await _guarded(ctx, None, body)

    async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourceTemplatesResult:
        cursor = params.cursor if params else None

        async def body() -> types.ListResourceTemplatesResult:
            page = aggregator.template_page(cursor)
            return types.ListResourceTemplatesResult(
                resource_templates=[to_template(t) for t in page.items],  # type: ignore[arg-type]
                next_cursor=page.next_cursor, ttl_ms=_ttl_ms(aggregator.default_ttl), cache_scope=CACHE_SCOPE)

        return await _guarded(ctx, None, body)

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        uri = str(params.uri)

        async def body() -> types.ReadResourceResult:
            content = await aggregator.read(uri)
            return types.ReadResourceResult(contents=[to_contents(uri, content)],
                                            ttl_ms=_ttl_ms(aggregator.ttl_for(uri)), cache_scope=CACHE_SCOPE)

        return await _guarded(ctx, uri, body)

    settings = aggregator.manifest.server
    return Server(
        settings.name,
        version=settings.version or __version__,
        title=settings.title,
        instructions=settings.instructions,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def initialization_options(server: Server[Any]) -> InitializationOptions:
    # Truthful capabilities: nothing here sends list_changed or accepts subscriptions yet.
    return server.create_initialization_options(NotificationOptions(resources_changed=False))


def wire_summary() -> str:
    modern = ", ".join(sorted(MODERN_PROTOCOL_VERSIONS))
    return f"wires: legacy (2024-11-05..2025-11-25) and modern ({modern})"
