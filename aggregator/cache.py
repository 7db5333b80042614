"""The content cache: per-entry TTL, one byte budget, and one load per key at a time (single-flight)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from cachetools import TLRUCache

__all__ = ["ContentCache", "Sized"]

DEFAULT_BUDGET = 256 * 1024 * 1024


class Sized:
    """What the cache stores: anything that reports the bytes it holds."""

    nbytes: int


V = TypeVar("V", bound=Sized)


@dataclass(slots=True)
class _Slot(Generic[V]):
    value: V
    expires: float


class _Flight:
    """One load in progress; followers wait on `done` and read `value` or `error`."""

    __slots__ = ("done", "loaded", "value", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.loaded = False
        self.value: object = None
        self.error: BaseException | None = None


class ContentCache(Generic[V]):
    """Maps keys to values for a TTL each, evicting least recently used entries past `max_bytes`.

    Errors are never cached; an entry bigger than the whole budget is served but not kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_BUDGET, timer: Callable[[], float] = time.monotonic) -> None:
        self._entries: TLRUCache[Hashable, _Slot[V]] = TLRUCache(
            maxsize=max_bytes,
            ttu=lambda _key, slot, _now: slot.expires,
            timer=timer,
            getsizeof=lambda slot: slot.value.nbytes,
        )
        self._timer = timer
        self._flights: dict[Hashable, _Flight] = {}
        self.hits = 0
        self.misses = 0

    @property
    def current_bytes(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        slot = self._entries.get(key)
        return None if slot is None else slot.value

    async def get_or_load(self, key: Hashable, ttl: float, load: Callable[[], Awaitable[V]]) -> V:
        """The cached value for `key`, or the result of `load()`, shared by every concurrent caller."""
        while True:
            slot = self._entries.get(key)
            if slot is not None:
                self.hits += 1
                return slot.value
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, ttl, load)
            await flight.done.wait()
            if flight.loaded:
                self.hits += 1
                return flight.value  # type: ignore[return-value]
            if flight.error is not None:
                raise flight.error
            # The leader was cancelled: its followers try again rather than inherit the cancellation.

    async def _lead(self, key: Hashable, ttl: float, load: Callable[[], Awaitable[V]]) -> V:
        self.misses += 1
        flight = self._flights[key] = _Flight()
        try:
            value = await load()
        except Exception as exc:
            flight.error = exc
            raise
        else:
            flight.value, flight.loaded = value, True
            if ttl > 0:
                self._store(key, value, ttl)
            return value
        finally:
            del self._flights[key]
            flight.done.set()

    def _store(self, key: Hashable, value: V, ttl: float) -> None:
        try:
            self._entries[key] = _Slot(value, self._timer() + ttl)
        except ValueError:
            pass  # larger than the whole budget: serve it, do not keep it

    def invalidate(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
