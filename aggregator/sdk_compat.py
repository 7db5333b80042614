"""What the server takes from the mcp SDK that the SDK does not make public (mcp 2.3): the connection, and the
claim of the standard streams.

Legacy (2025-11-25) subscriptions and list_changed registrations must outlive the message that made them, but the
SDK hands each handler a `ServerRequestContext` whose `session` is made per message. The `Connection` behind it
lasts as long as the client stays connected, is hashable (by identity), and unwinds its `exit_stack` when the
client goes: aggregator.notify keys its registrations by it and forgets them from that exit stack. mcp 2.3 keeps it
as `ServerSession._connection`; the public `Context.connection` exists but the runner does not hand handlers a
`Context` yet.

The stdio transport (aggregator.stdio) reads and writes the wire itself, but claims fd 0 and 1 the way the SDK's
`stdio_server` does (`mcp.server.stdio._claim_fd`): the wire moves to private duplicates and stray reads of
`sys.stdin` or prints to `sys.stdout` go elsewhere, so a library that prints cannot corrupt the protocol.

tests/test_sdk_compat.py fails, naming the installed SDK version, when any of this changes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from mcp.server.context import ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _open_stdout_diversion

__all__ = ["Connection", "claim_stdin", "claim_stdout", "connection_of"]

Release = Callable[[], None]


def connection_of(ctx: ServerRequestContext[Any]) -> Connection:
    """The connection the message of `ctx` came on: the same object for every message of one client connection."""
    return ctx.session._connection  # noqa: SLF001 - see the module docstring


def claim_stdin() -> tuple[BinaryIO, Release | None]:
    """The wire's input (a private duplicate of fd 0, which now reads nothing) and how to give fd 0 back (None when
    stdin is not backed by fd 0). RuntimeError if another stdio transport of this process holds it."""
    return _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)


def claim_stdout() -> tuple[BinaryIO, Release | None]:
    """The wire's output (a private duplicate of fd 1, which now goes to stderr) and how to give fd 1 back."""
    return _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
