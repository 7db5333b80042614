"""A pipe's chunks handed to a function where the transport delivers them: asyncio's and uvloop's read transports
call their protocol's `data_received`, and a `StreamReader`'s protocol passes each chunk on through a property and
a method call more (or, for a subprocess's pipe, a `call_soon`: a turn of the loop) before anything reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["DirectProtocol", "feed_directly"]


class DirectProtocol(asyncio.Protocol):
    """The pipe's protocol with its chunks handed to `feed` at once; the end and a loss still go `inner`'s way (which
    tells the reader, or the subprocess, that it ended, after any chunk it deferred)."""

    def __init__(self, inner: asyncio.BaseProtocol, feed: Callable[[bytes], None]) -> None:
        self._inner = inner
        # The transport calls `feed` itself (asyncio's and uvloop's look `data_received` up on the instance).
        self.data_received = feed  # type: ignore[method-assign, assignment]

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if isinstance(self._inner, asyncio.Protocol) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)


def feed_directly(reader: asyncio.StreamReader, feed: Callable[[bytes], None]) -> bool:
    """Have the pipe under `reader` hand its chunks to `feed` itself; False (nothing changed) when its transport
    cannot swap protocols."""
    pipe: Any = getattr(reader, "_transport", None)
    # asyncio's pipe, or uvloop's (no asyncio.ReadTransport, but it swaps protocols as asyncio's does); a transport
    # of our own (a terminal's: `stdio_terminal`) feeds its reader itself and keeps no protocol.
    if not (isinstance(pipe, asyncio.ReadTransport) or (callable(getattr(pipe, "set_protocol", None))
                                                        and callable(getattr(pipe, "get_protocol", None)))):
        return False
    try:
        pipe.set_protocol(DirectProtocol(pipe.get_protocol(), feed))
    except NotImplementedError:
        return False
    return True
