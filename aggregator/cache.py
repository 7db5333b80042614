"""The content cache: one byte budget, per-entry freshness, revalidation, stale-if-error and single-flight.

An expired entry is not thrown away: while it stays within the byte budget it can be revalidated (a cheap
metadata call comparing versions) instead of downloaded again, and served stale for a bounded time when the
backend fails. Errors are never cached, and concurrent misses of one key share one backend call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import anyio
from cachetools import Cache, LRUCache

from aggregator.tracing import NO_SPAN, cache_event, enabled, span

__all__ = ["CachePolicy", "ContentCache", "Flight", "Sized"]

logger = logging.getLogger("aggregator.cache")

DEFAULT_BUDGET = 256 * 1024 * 1024


class Sized(Protocol):
    """What the cache stores: anything that reports the bytes it holds."""

    @property
    def nbytes(self) -> int: ...


V = TypeVar("V", bound=Sized)
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class CachePolicy:
    ttl: float
    """Seconds an entry is fresh; 0 means never kept."""
    stale_if_error: float = 0.0
    """Seconds past expiry an entry may still be served when reloading it fails."""


@dataclass(slots=True)
class _Slot(Generic[V]):
    value: V
    version: str | None
    fresh_until: float
    stale_until: float


class Flight(Generic[V]):
    """One load in progress; followers `wait` for it to end, then read `value` or `error`. The event exists only
    once a follower waits: most loads have none, and an event per load is a good part of a cold read's cost. A
    caller that leads a load itself (`ContentCache.lead`) may pass a subclass holding its own state as well."""

    # Class-level defaults, no `__init__` and no slots: a flight is made per miss, and a Python `__init__` setting
    # five slots costs about three times an instance that sets only what its load changes (in its own dict).
    _done: anyio.Event | None = None
    ended: bool = False
    loaded: bool = False
    value: V | None = None
    error: BaseException | None = None

    async def wait(self) -> None:
        if not self.ended:
            if self._done is None:
                self._done = anyio.Event()
            await self._done.wait()

    def end(self) -> None:
        self.ended = True
        if self._done is not None:
            self._done.set()


Load = Callable[[], Awaitable[tuple[V, str | None]]]
"""Fetch the value and its version (ETag, object id, mtime+size) from the backend."""
Revalidate = Callable[[str], Awaitable[bool]]
"""True if the backend still holds this version (a metadata call, not a download)."""


class ContentCache(Generic[K, V]):
    """Least recently used entries go first once `max_bytes` is reached; an entry bigger than the budget is not kept.
    Keys are of type K (the service's: tuples that start with source and path)."""

    def __init__(self, max_bytes: int = DEFAULT_BUDGET, timer: Callable[[], float] = time.monotonic) -> None:
        self._entries: LRUCache[K, _Slot[V]] = LRUCache(maxsize=max_bytes,
                                                        getsizeof=lambda slot: slot.value.nbytes)
        self._timer = timer
        self._flights: dict[K, Flight[V]] = {}
        self.hits_by: Counter[str] = Counter()
        self.misses_by: Counter[str] = Counter()
        """Hits and misses by the key's `source` (keys without one count under ''): the console's per-source rates,
        and summed, /metrics' totals."""
        self.revalidated = 0
        self.stale_served = 0

    @property
    def hits(self) -> int:
        return sum(self.hits_by.values())

    @property
    def misses(self) -> int:
        return sum(self.misses_by.values())

    def _hit(self, key: K) -> None:
        self.hits_by[_group(key)] += 1
        cache_event("hit", key)

    @property
    def current_bytes(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The fresh value for `key`, or None."""
        slot = self._entries.get(key)
        return slot.value if slot is not None and self._timer() < slot.fresh_until else None

    def fresh(self, key: K) -> V | None:
        """The fresh value for `key` counted as a hit, as `get_or_load` would serve it; None: `get_or_load` it."""
        slot = self._entries.get(key)
        if slot is not None and self._timer() < slot.fresh_until:
            self._hit(key)
            return slot.value
        return None

    async def get_or_load(self, key: K, policy: CachePolicy, load: Load[V],
                          revalidate: Revalidate | None = None,
                          stale_on: tuple[type[BaseException], ...] = ()) -> V:
        """The value for `key`: fresh from the cache, revalidated, loaded, or (on a `stale_on` error) stale."""
        while True:
            slot = self._entries.get(key)
            if slot is not None and self._timer() < slot.fresh_until:
                self._hit(key)
                return slot.value
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, slot, policy, load, revalidate, stale_on)
            await flight.wait()
            if flight.loaded and getattr(flight.value, "private", False):
                continue  # it depended on who asked: this caller loads its own
            if flight.loaded:
                self._hit(key)
                assert flight.value is not None  # loaded: the leader stored its value
                return flight.value
            if flight.error is not None:
                raise flight.error
            # The leader was cancelled: its followers try again rather than inherit the cancellation.

    async def _lead(self, key: K, old: _Slot[V] | None, policy: CachePolicy, load: Load[V],
                    revalidate: Revalidate | None, stale_on: tuple[type[BaseException], ...]) -> V:
        flight: Flight[V] = Flight()  # not `Flight[V]()`: calling a subscripted generic costs microseconds
        self._flights[key] = flight
        try:
            with span("aggregator.cache.load", **_traced(key)) if enabled() else NO_SPAN:
                value = await self._refresh(key, old, policy, load, revalidate, stale_on)
        except Exception as exc:
            flight.error = exc
            raise
        else:
            flight.value, flight.loaded = value, True
            return value
        finally:
            del self._flights[key]
            flight.end()

    async def _refresh(self, key: K, old: _Slot[V] | None, policy: CachePolicy, load: Load[V],
                       revalidate: Revalidate | None, stale_on: tuple[type[BaseException], ...]) -> V:
        """`old`: the expired copy `get_or_load` found under `key` just before (no await between), if any."""
        try:
            if old is not None and old.version is not None and revalidate is not None:
                if await revalidate(old.version):
                    self.revalidated += 1
                    cache_event("revalidated")
                    self._store(key, old.value, old.version, policy)
                    return old.value
            self.misses_by[_group(key)] += 1
            cache_event("miss")
            value, version = await load()
        except stale_on:
            if old is not None and self._timer() < old.stale_until:
                self.stale_served += 1
                cache_event("stale")
                logger.warning("serving a stale copy of %s after a backend error", _label(key))
                return old.value
            self._entries.pop(key, None)
            raise
        except Exception:
            self._entries.pop(key, None)
            raise
        self._store(key, value, version, policy)
        return value

    def lead(self, key: K, flight: Flight[V]) -> bool:
        """Whether the caller may load `key` itself as `flight` (a new one), which it then ends with `land`
        (concurrent `get_or_load`s of the key follow it meanwhile); False when the cache holds a copy (fresh, or
        one to revalidate or serve stale) or a load is under way: the caller goes through `get_or_load`."""
        if key in self._flights or key in self._entries:
            return False
        self._flights[key] = flight
        self.misses_by[_group(key)] += 1
        cache_event("miss")
        return True

    def land(self, key: K, flight: Flight[V], policy: CachePolicy, value: V | None = None,
             error: BaseException | None = None) -> None:
        """End the load `lead` began: its value stored as `get_or_load` stores one, or its error (nothing kept);
        neither: it was given up, and those following it load again."""
        # No copy under `key` to drop: `lead` found none, and none is stored while its flight is up (every other
        # load of the key follows it). So a policy that keeps nothing (a relayed read's) has nothing to do here.
        if value is not None:
            if policy.ttl > 0:
                self._store(key, value, None, policy)
            flight.value, flight.loaded = value, True
        elif error is not None:
            flight.error = error
        if self._flights.get(key) is flight:
            del self._flights[key]
        flight.end()

    def _store(self, key: K, value: V, version: str | None, policy: CachePolicy) -> None:
        # A value may say how long it may be kept (`max_age`), or that it depends on who asked (`private`).
        max_age = getattr(value, "max_age", None)
        ttl = policy.ttl if max_age is None else min(policy.ttl, max_age)
        if ttl <= 0 or getattr(value, "private", False):
            self._entries.pop(key, None)
            return
        now = self._timer()
        fresh_until = now + ttl
        try:
            self._entries[key] = _Slot(value, version, fresh_until, fresh_until + policy.stale_if_error)
        except ValueError:
            self._entries.pop(key, None)  # larger than the whole budget: serve it, do not keep it

    def invalidate(self, key: K) -> None:
        self._entries.pop(key, None)

    def invalidate_where(self, predicate: Callable[[K], bool]) -> int:
        """Drop every entry whose key satisfies `predicate`; returns how many went."""
        doomed = [key for key in list(self._entries.keys()) if predicate(key)]
        for key in doomed:
            self._entries.pop(key, None)
        return len(doomed)

    def clear(self) -> None:
        self._entries.clear()

    def peek(self, key: K) -> tuple[float, int] | None:
        """The seconds the entry under `key` stays fresh (negative: expired, kept to revalidate) and the bytes it
        holds; None when none is held. Counts no hit or miss and leaves the LRU order alone (the console's detail
        pane looks, it does not read)."""
        if key not in self._entries:
            return None
        slot = Cache.__getitem__(self._entries, key)
        return slot.fresh_until - self._timer(), slot.value.nbytes

    def bytes_by(self) -> Counter[str]:
        """Bytes held, by the key's `source` (O(entries): for the console, not the read path)."""
        held: Counter[str] = Counter()
        for key in list(self._entries.keys()):
            # Cache.__getitem__, not the LRU's own: looking must not make every entry the most recently used.
            slot = Cache.__getitem__(self._entries, key)
            held[_group(key)] += slot.value.nbytes
        return held


def _group(key: Hashable) -> str:
    return str(getattr(key, "source", ""))


def _traced(key: Hashable) -> dict[str, object]:
    """What a span may say of a key: its source and path (a query's SQL and parameters stay out)."""
    return {"source_id": getattr(key, "source", None), "path": getattr(key, "path", None)}


def _label(key: Hashable) -> str:
    # A plain tuple starts with source and path; a key of its own (a FileKey, a tuple too) says what it is.
    return "/".join(str(part) for part in key[:2]) if type(key) is tuple else str(key)
