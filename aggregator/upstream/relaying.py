"""Reads of one upstream URI sent on the lean lane without a task (`Upstream.route`): the `RelayRoute` an MCP
source gives for a path. The read's own object is a `lane.Sent` (the lane's waiter and the give-up handle at once),
which borrows a slot of the upstream's cap until its answer is settled or it is given up."""

from __future__ import annotations

from typing import Any, Protocol

import anyio

from aggregator.upstream.answers import Make
from aggregator.upstream.lane import Lane, Sent
from aggregator.upstream.link import Link

__all__ = ["Route", "Sender"]


class Sender(Protocol):
    """What a route asks of the `Upstream` it sends on: a free lane with a slot of its cap, the cap, its timeout,
    and a read's outcome checked as `read` checks it."""

    timeout: float

    @property
    def _limiter(self) -> anyio.CapacityLimiter: ...

    @property
    def _conn(self) -> Link | None: ...

    def _free_lane(self, borrower: object) -> Lane | None: ...

    def _settled(self, conn: Link, lane: Lane, uri: str, max_bytes: int, answer: dict[str, Any] | None | BaseException,
                 make: Make[Any]) -> Any: ...


class Route:
    """Reads of `uri` (at most `max_bytes`) on `upstream`'s lean lane, their outcomes made by `make` (the source's
    blob of a read's checked contents)."""

    __slots__ = ("_upstream", "_uri", "_max_bytes", "_make", "_lane", "_tail")

    def __init__(self, upstream: Sender, uri: str, max_bytes: int, make: Make[Any]) -> None:
        self._upstream, self._uri, self._max_bytes, self._make = upstream, uri, max_bytes, make
        self._lane: Lane | None = None
        self._tail = b""
        """What follows the id in the request line on `_lane` (each connection has its own)."""

    def send(self, sent: Sent) -> bool:
        """Send a read now, its answer handed to `sent` where it arrives (the message, None when the connection
        ended, TimeoutError past the upstream's timeout), a slot of the cap taken on its behalf; False (nothing sent,
        no slot held) when the lane is not free at once."""
        upstream = self._upstream
        lane = upstream._free_lane(sent)  # noqa: SLF001 - the upstream's own lane and cap
        if lane is None:
            return False
        sent._link = upstream._conn  # noqa: SLF001 - the connection `_free_lane` found up
        if lane is not self._lane:
            self._lane, self._tail = lane, lane.read_tail(self._uri)
        if not lane.send_read(self._tail, sent, upstream.timeout):
            self.release(sent)
            return False
        return True

    def settle(self, sent: Sent, answer: dict[str, Any] | None | BaseException) -> Any:
        """What `read` returns of `sent`'s answer, its slot freed; None when the connection was lost under it (read
        again: the next connection); raises what `read` raises."""
        self.release(sent)
        return self._upstream._settled(sent._link, sent._lane, self._uri, self._max_bytes, answer,  # noqa: SLF001
                                       self._make)

    def release(self, sent: Sent) -> None:
        """Free the slot of a read given up before its answer."""
        self._upstream._limiter.release_on_behalf_of(sent)  # noqa: SLF001 - the slot taken for it
