"""One write per small HTTP response: uvicorn writes a response's status line and headers as soon as the app starts
the response, and its body with the next message, so every answer costs two `send` calls and two TCP segments (on
loopback each send also runs the receiver's side of TCP: about half of a cached read's CPU). This holds the head back
until the body's first part, which the app sends in the same step, so both leave in one write; a head the app does
not follow at once (a stream whose first event is yet to come) leaves at the end of the loop's current iteration.

`CoalescedWrites` stands in for the connection's transport in one request/response cycle (its `transport`); the
protocol keeps the real one for everything else.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CoalescedWrites"]


class CoalescedWrites:
    """The transport of one response cycle, writing its first write (the head) together with the next one."""

    __slots__ = ("_fresh", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None
        self._fresh = True
        """The head, written with the next write or at the end of this loop iteration, whichever comes first."""

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._fresh:  # the cycle's first write: the response's head (or a 100 Continue)
            self._fresh = False
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write the head if it is still held."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else a cycle may ask of its transport
        return getattr(self._transport, name)
