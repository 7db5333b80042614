"""What the server takes from the mcp SDK that the SDK does not make public (mcp 2.3): one thing, the connection.

Legacy (2025-11-25) subscriptions and list_changed registrations must outlive the message that made them, but the
SDK hands each handler a `ServerRequestContext` whose `session` is made per message. The `Connection` behind it
lasts as long as the client stays connected, is hashable (by identity), and unwinds its `exit_stack` when the
client goes: aggregator.notify keys its registrations by it and forgets them from that exit stack. mcp 2.3 keeps it
as `ServerSession._connection`; the public `Context.connection` exists but the runner does not hand handlers a
`Context` yet. tests/test_sdk_compat.py fails, naming the installed SDK version, when that changes.
"""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.connection import Connection

__all__ = ["Connection", "connection_of"]


def connection_of(ctx: ServerRequestContext[Any]) -> Connection:
    """The connection the message of `ctx` came on: the same object for every message of one client connection."""
    return ctx.session._connection  # noqa: SLF001 - see the module docstring
