"""How every handler body runs: catalog errors become the MCP error the caller's wire expects (not-found is -32002
on the legacy wire, -32602 on the modern one), anything unexpected a generic one (logged, never leaked), and each
request is counted and access-logged with its outcome."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.callers import caller_name, caller_scopes
from aggregator.errors import InvalidCursor, RequestError, ResourceNotFound
from aggregator.metrics import Metrics, timer
from aggregator.search_query import InvalidSearch

__all__ = ["INTERNAL_ERROR", "INVALID_PARAMS", "LEGACY_NOT_FOUND", "failure_of", "is_modern", "run_handler",
           "scopes_of", "to_mcp_error"]

logger = logging.getLogger("aggregator.server")

LEGACY_NOT_FOUND = -32002
INVALID_PARAMS = types.INVALID_PARAMS
INTERNAL_ERROR = types.INTERNAL_ERROR

R = TypeVar("R")

_OUTCOMES = {"ResourceNotFound": "not_found", "InvalidCursor": "invalid", "InvalidSearch": "invalid",
             "ResourceTooLarge": "too_large", "ResourceUnavailable": "unavailable", "ResourceOverBudget": "over_budget",
             "ResourceCorrupt": "corrupt", "ResourceRenderFailed": "render_failed",
             "ResourceNotConverted": "not_converted"}


def is_modern(ctx: ServerRequestContext[Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def scopes_of(ctx: ServerRequestContext[Any]) -> frozenset[str] | None:
    """The caller's scopes; None for a trusted caller (stdio: no HTTP request)."""
    return caller_scopes(ctx.request)


def to_mcp_error(exc: RequestError, modern: bool) -> MCPError:
    """The MCP error a client sees for a catalog error, with the code its wire expects."""
    data = {"uri": exc.uri} if exc.uri is not None else None
    if isinstance(exc, ResourceNotFound):
        return MCPError(INVALID_PARAMS if modern else LEGACY_NOT_FOUND, "Resource not found", data=data)
    if isinstance(exc, (InvalidCursor, InvalidSearch)):
        return MCPError(INVALID_PARAMS, exc.message)
    return MCPError(INTERNAL_ERROR, exc.message, data=data)


async def run_handler(ctx: ServerRequestContext[Any], uri: str | None, call: Callable[[], Awaitable[R]],
                      metrics: Metrics | None = None) -> R:
    """Run a handler body; catalog errors become MCP errors, anything else a generic one (logged, not leaked).
    With `metrics`, the request is counted and access-logged with its outcome."""
    elapsed, outcome = timer(), "error"
    try:
        result = await call()
        outcome = "ok"
        return result
    except Exception as exc:
        error, outcome = failure_of(exc, uri, is_modern(ctx))
        if error is exc:
            raise
        raise error from None
    finally:
        if metrics is not None:
            metrics.observe(ctx.method, uri, outcome, elapsed(), caller_name(ctx.request))


def failure_of(exc: Exception, uri: str | None, modern: bool) -> tuple[MCPError, str]:
    """What a client is told of a handler body's failure `exc` (the `modern` wire's codes), and its outcome for the
    access log: catalog errors mapped, an MCPError as it is, anything else a generic error (logged, not leaked)."""
    if isinstance(exc, RequestError):
        return to_mcp_error(exc, modern), _OUTCOMES.get(type(exc).__name__, "error")
    if isinstance(exc, MCPError):
        return exc, "invalid"
    logger.error("unexpected failure serving %s", uri or "a request", exc_info=exc)
    return MCPError(INTERNAL_ERROR, "Internal error", data={"uri": uri} if uri else None), "error"
