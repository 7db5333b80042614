"""An upstream's errors as the operator reads them, and what they mean to a call: lost, not found, or neither.

An upstream's own message is quoted escaped and cut short, for the log only: the read path maps SourceError to a
fixed message, so none of it reaches a client.
"""

from __future__ import annotations

import mcp_types as types
from mcp.shared.exceptions import MCPError

__all__ = ["LOST", "RESOURCE_NOT_FOUND", "TOO_BIG", "describe_failure", "not_found", "past_cap", "quote", "too_big"]

RESOURCE_NOT_FOUND = -32002  # 2025-11-25's code; the modern wire says -32602 with data.uri
LOST = frozenset({types.CONNECTION_CLOSED})
"""Codes that say the connection itself is gone (a call on it is sent again on the next one)."""
TOO_BIG = "(maxMessageBytes)"
"""Ends the reason a connection was lost to a message past the cap: the call it answered is not sent again."""


def too_big(limit: int) -> str:
    """Why a connection ended on a message over `limit` bytes."""
    return f"a message over {limit:,} bytes {TOO_BIG}"


def past_cap(exc: MCPError) -> bool:
    """Whether a call failed because its answer was past `maxMessageBytes`: ours (stdio, a JSON answer over HTTP)
    or the SDK's cap on one SSE event. Such a call is not sent again."""
    message = str(exc.error.message)
    return message.endswith(TOO_BIG) or "Server-sent event exceeded the" in message


def not_found(exc: MCPError) -> bool:
    """The legacy wire's -32002, or the modern wire's -32602 naming the URI in its data."""
    data = exc.error.data
    return exc.code == RESOURCE_NOT_FOUND or (exc.code == types.INVALID_PARAMS and isinstance(data, dict)
                                              and "uri" in data)


def quote(exc: MCPError) -> str:
    """An upstream error for the log: its code and its message escaped and cut short (never for a client)."""
    return f"error {exc.code}: {str(exc.error.message)[:200]!r}"


def describe_failure(exc: BaseException) -> str:
    """A short operator-facing reason for a failed connection or call (an exception group's first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return quote(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
