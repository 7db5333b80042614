from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest

from aggregator.cache import ContentCache


@dataclass
class Blob:
    nbytes: int


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ttl_expiry_and_hits() -> None:
    clock = Clock()
    cache: ContentCache[Blob] = ContentCache(1000, timer=clock)
    loads = 0

    async def load() -> Blob:
        nonlocal loads
        loads += 1
        return Blob(10)

    async def main() -> None:
        await cache.get_or_load("k", 5, load)
        await cache.get_or_load("k", 5, load)
        assert loads == 1 and cache.hits == 1
        clock.now = 6
        await cache.get_or_load("k", 5, load)
        assert loads == 2

    anyio.run(main)


def test_byte_budget_evicts_by_size_not_count() -> None:
    cache: ContentCache[Blob] = ContentCache(100)

    async def main() -> None:
        for i in range(5):
            await cache.get_or_load(i, 60, lambda: _value(Blob(30)))
        assert cache.current_bytes <= 100 and len(cache) == 3
        # Bigger than the budget: served, never kept.
        big = await cache.get_or_load("big", 60, lambda: _value(Blob(500)))
        assert big.nbytes == 500 and cache.get("big") is None

    anyio.run(main)


async def _value(v: Blob) -> Blob:
    return v


def test_single_flight_and_errors_not_cached() -> None:
    cache: ContentCache[Blob] = ContentCache(1000)
    calls = 0

    async def slow() -> Blob:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        return Blob(1)

    async def failing() -> Blob:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.01)
        raise OSError("backend down")

    async def main() -> None:
        nonlocal calls
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(cache.get_or_load, "cold", 60, slow)
        assert calls == 1
        calls = 0
        results = []

        async def attempt() -> None:
            try:
                await cache.get_or_load("bad", 60, failing)
            except OSError as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(attempt)
        assert calls == 1 and len(results) == 10
        with pytest.raises(OSError):
            await cache.get_or_load("bad", 60, failing)
        assert calls == 2  # the error was not cached

    anyio.run(main)
