from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest

from aggregator.cache import CachePolicy, ContentCache, Flight


@dataclass
class Blob:
    nbytes: int
    tag: str = ""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Counts what the cache asked of it."""

    def __init__(self, size: int = 10, version: str | None = "v1", delay: float = 0.0) -> None:
        self.size, self.version, self.delay = size, version, delay
        self.loads = self.stats = 0
        self.failing = False

    async def load(self) -> tuple[Blob, str | None]:
        self.loads += 1
        await anyio.sleep(self.delay)
        if self.failing:
            raise OSError("backend down")
        return Blob(self.size, f"body@{self.version}"), self.version

    async def revalidate(self, version: str) -> bool:
        self.stats += 1
        if self.failing:
            raise OSError("backend down")
        return version == self.version


def test_ttl_expiry_and_hits() -> None:
    clock, backend = Clock(), Backend(version=None)
    cache: ContentCache[str, Blob] = ContentCache(1000, timer=clock)

    async def main() -> None:
        await cache.get_or_load("k", CachePolicy(5), backend.load)
        await cache.get_or_load("k", CachePolicy(5), backend.load)
        assert backend.loads == 1 and cache.hits == 1
        clock.now = 6
        await cache.get_or_load("k", CachePolicy(5), backend.load)
        assert backend.loads == 2

    anyio.run(main)


def test_byte_budget_evicts_by_size_not_count() -> None:
    cache: ContentCache[int | str, Blob] = ContentCache(100)

    async def main() -> None:
        for i in range(5):
            await cache.get_or_load(i, CachePolicy(60), Backend(size=30).load)
        assert cache.current_bytes <= 100 and len(cache) == 3
        assert cache.get(0) is None and cache.get(4) is not None  # least recently used went first
        big = await cache.get_or_load("big", CachePolicy(60), Backend(size=500).load)
        assert big.nbytes == 500 and cache.get("big") is None  # bigger than the budget: served, not kept

    anyio.run(main)


def test_single_flight_and_errors_not_cached() -> None:
    cache: ContentCache[str, Blob] = ContentCache(1000)
    backend = Backend(delay=0.05)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(cache.get_or_load, "cold", CachePolicy(60), backend.load)
        assert backend.loads == 1
        failing = Backend(delay=0.01)
        failing.failing = True
        errors = []

        async def attempt() -> None:
            try:
                await cache.get_or_load("bad", CachePolicy(60), failing.load)
            except OSError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(attempt)
        assert failing.loads == 1 and len(errors) == 10
        with pytest.raises(OSError):
            await cache.get_or_load("bad", CachePolicy(60), failing.load)
        assert failing.loads == 2  # the error was not cached

    anyio.run(main)


def test_revalidation_costs_a_metadata_call_not_a_download() -> None:
    clock, backend = Clock(), Backend()
    cache: ContentCache[str, Blob] = ContentCache(1000, timer=clock)
    policy = CachePolicy(10)

    async def get() -> Blob:
        return await cache.get_or_load("k", policy, backend.load, backend.revalidate)

    async def main() -> None:
        await get()
        clock.now = 11
        assert (await get()).tag == "body@v1"
        assert (backend.loads, backend.stats, cache.revalidated) == (1, 1, 1)
        clock.now = 15  # fresh again after revalidation
        await get()
        assert backend.stats == 1
        backend.version = "v2"
        clock.now = 30
        assert (await get()).tag == "body@v2"
        assert (backend.loads, backend.stats) == (2, 2)

    anyio.run(main)


def test_stale_if_error_is_bounded() -> None:
    clock, backend = Clock(), Backend()
    cache: ContentCache[str, Blob] = ContentCache(1000, timer=clock)
    policy = CachePolicy(10, stale_if_error=20)

    async def get() -> Blob:
        return await cache.get_or_load("k", policy, backend.load, backend.revalidate, stale_on=(OSError,))

    async def main() -> None:
        await get()
        backend.failing = True
        clock.now = 15
        assert (await get()).tag == "body@v1" and cache.stale_served == 1
        clock.now = 31  # past expiry + staleIfError
        with pytest.raises(OSError):
            await get()
        backend.failing = False
        assert (await get()).tag == "body@v1" and backend.loads == 2  # the stale copy was dropped

    anyio.run(main)


def test_forget_decides_per_key_kind() -> None:
    """One predicate over typed keys: a source's everything, one file's decodings, one source's query results."""
    from aggregator.cache_keys import FileKey, Forget, QueryKey

    cache: ContentCache[Blob] = ContentCache(1000)
    a_md = FileKey("docs", 1, "a.md", "text/markdown", False)
    a_raw = FileKey("docs", 1, "a.md", "application/octet-stream", False)
    b_md = FileKey("docs", 1, "b.md", "text/markdown", False)
    rows = QueryKey("db", 1, "select 1", (("id", "1"),), "json")
    other = FileKey("db", 1, "a.md", None, False)  # same path, other source

    async def fill() -> None:
        for key in (a_md, a_raw, b_md, rows, other):
            await cache.get_or_load(key, CachePolicy(60), Backend().load)

    anyio.run(fill)
    assert cache.invalidate_where(Forget.of(files={("docs", "a.md")})) == 2
    assert {cache.get(k) is None for k in (b_md, rows, other)} == {False}
    assert cache.invalidate_where(Forget.of(queries={"db"})) == 1 and cache.get(other) is not None
    assert cache.invalidate_where(Forget.of(sources={"docs", "db"})) == 2 and len(cache) == 0
    with pytest.raises(TypeError):
        Forget.of(sources={"docs"})(("docs", "a.md"))  # a key of another shape is an error, not silently kept
    assert str(a_md) == "docs/a.md"  # what the cache's log lines name


def test_a_lead_landed_unkept_is_shared_with_its_followers_and_kept_nothing() -> None:
    """`lead`/`land` (a load the caller makes itself, as a relayed read does): a `get_or_load` of the key meanwhile
    follows it (no load of its own) and gets its value; a policy that keeps nothing keeps nothing, so the next read
    loads; a key with a copy or a load under way is not led."""
    backend = Backend()
    cache: ContentCache[str, Blob] = ContentCache(1000)

    async def main() -> None:
        flight: Flight[Blob] = Flight()
        assert cache.lead("k", flight) and not cache.lead("k", Flight()) and cache.misses == 1
        got: list[Blob] = []

        async def follow() -> None:
            got.append(await cache.get_or_load("k", CachePolicy(0), backend.load))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.sleep(0.01)
            cache.land("k", flight, CachePolicy(0), Blob(3, "led"))
        assert got == [Blob(3, "led")] and backend.loads == 0 and cache.hits == 1
        assert len(cache) == 0 and cache.current_bytes == 0
        again: Flight[Blob] = Flight()
        assert cache.lead("k", again)
        cache.land("k", again, CachePolicy(60), Blob(3, "kept"))
        assert cache.get("k") == Blob(3, "kept") and not cache.lead("k", Flight())

    anyio.run(main)


def test_a_lead_failed_or_given_up_tells_its_followers() -> None:
    """A lead's error reaches its followers (nothing kept); a lead given up (`land` with neither) sends them to load
    again themselves."""
    backend = Backend()
    cache: ContentCache[str, Blob] = ContentCache(1000)

    async def main() -> None:
        outcomes: list[object] = []

        async def follow() -> None:
            try:
                outcomes.append(await cache.get_or_load("k", CachePolicy(0), backend.load))
            except OSError as exc:
                outcomes.append(exc)

        failure = OSError("upstream down")
        for error in (failure, None):
            flight: Flight[Blob] = Flight()
            assert cache.lead("k", flight)
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await anyio.sleep(0.01)
                cache.land("k", flight, CachePolicy(0), error=error)
        assert outcomes == [failure, Blob(10, "body@v1")] and backend.loads == 1 and len(cache) == 0

    anyio.run(main)


def test_fresh_serves_and_counts_only_a_fresh_copy() -> None:
    """`fresh` is `get_or_load`'s hit: a fresh copy, counted as a hit; an expired or missing one is None, uncounted
    (then `get_or_load` revalidates or loads it)."""
    clock, backend = Clock(), Backend()
    cache: ContentCache[str, Blob] = ContentCache(1000, timer=clock)

    async def main() -> None:
        assert cache.fresh("k") is None
        loaded = await cache.get_or_load("k", CachePolicy(5), backend.load)
        assert cache.fresh("k") is loaded and cache.hits == 1 and cache.misses == 1
        clock.now = 6
        assert cache.fresh("k") is None and cache.hits == 1
        assert await cache.get_or_load("k", CachePolicy(5), backend.load, backend.revalidate) is loaded
        assert backend.loads == 1 and cache.revalidated == 1

    anyio.run(main)
