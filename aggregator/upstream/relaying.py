"""A read `Upstream.relay` sent on the lean lane: one object that is the lane's waiter, the sent read's handle, the
give-up handle and the borrower of the upstream's cap slot at once (no closures, no cells: a relayed read is the
gateway's hot path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio

from aggregator.upstream.answers import Make
from aggregator.upstream.lane import Lane, Sent
from aggregator.upstream.link import Link

__all__ = ["RelayedRead", "Sender"]

R = TypeVar("R")


class Sender(Protocol):
    """What a relayed read asks of the `Upstream` that sent it: the cap it holds a slot of, and its outcome checked."""

    @property
    def _limiter(self) -> anyio.CapacityLimiter: ...

    def _settled(self, conn: Link, lane: Lane, uri: str, max_bytes: int, answer: dict[str, Any] | None | BaseException,
                 make: Make[R]) -> R | None: ...


class RelayedRead(Sent):
    """A read `Upstream.relay` sent, a slot of the cap held on its behalf until it is answered or given up: its
    outcome checked as `Upstream.read` checks it (`Upstream._settled`, made by `make`) and handed to `done`, once."""

    __slots__ = ("_upstream", "_conn", "_uri", "_max_bytes", "_done", "_make")

    def __init__(self, upstream: Sender, conn: Link, uri: str, max_bytes: int,
                 done: Callable[[Any], None], make: Make[Any]) -> None:
        self._upstream, self._conn, self._uri, self._max_bytes, self._done, self._make = (
            upstream, conn, uri, max_bytes, done, make)

    def answered(self, outcome: dict[str, Any] | None | BaseException) -> None:
        upstream, done = self._upstream, self._done
        self._done = _ignored  # let go: `done`'s closures may hold the give-up handle, this object
        upstream._limiter.release_on_behalf_of(self)  # noqa: SLF001 - the slot taken for it
        try:
            read = upstream._settled(self._conn, self._lane, self._uri, self._max_bytes, outcome,  # noqa: SLF001
                                     self._make)
        except Exception as exc:  # noqa: BLE001 - the caller's to map, as `read` raises it
            done(exc)
            return
        done(read)

    def give_up(self) -> None:
        """Never told; the slot is free again and the upstream told (nothing once answered)."""
        if not self._over:
            self._upstream._limiter.release_on_behalf_of(self)  # noqa: SLF001 - the slot taken for it
            self._done = _ignored
            super().give_up()


def _ignored(outcome: object) -> None:
    """What a read answered or given up hands its outcome to (nothing: it is told once)."""
