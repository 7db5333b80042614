"""The cluster's change bus, poll leases and interests against a real Redis (unique key prefix per test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.cluster.bus import MAX_EVENT_BYTES, ChangeBus, ChangeEvent
from aggregator.cluster.leases import DATA, PollLeases
from aggregator.cluster.link import RedisLink
from aggregator.manifest.model import ClusterSettings
from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
from tests.replicas import redis_server


@pytest.fixture
def settings() -> Iterator[ClusterSettings]:
    url = require_shared()
    prefix = unique_prefix()
    yield ClusterSettings(redis=url, prefix=prefix, timeout=1.0)
    delete_prefix(url, prefix)


async def _until(condition: object, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.02)


def test_events_round_trip_and_own_events_are_ignored(settings: ClusterSettings) -> None:
    async def main() -> None:
        a, b = RedisLink(settings, "a"), RedisLink(settings, "b")
        bus_a, bus_b = ChangeBus(a), ChangeBus(b)
        got_a: list[ChangeEvent] = []
        got_b: list[ChangeEvent] = []
        bus_a.listeners.append(got_a.append)
        bus_b.listeners.append(got_b.append)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus_a.run)
                tg.start_soon(bus_b.run)
                await _until(lambda: bus_a.connected and bus_b.connected)
                event = ChangeEvent("a", "d1", "fp1", ("x/a.md", "b.md"), data=True, kind="updated")
                assert await bus_a.publish(event)
                await _until(lambda: got_b)
                assert got_b == [event]
                await anyio.sleep(0.2)
                assert got_a == [] and bus_a.received == 0 and bus_b.received == 1
                bus_a.stop()
                bus_b.stop()
        finally:
            await a.aclose()
            await b.aclose()

    anyio.run(main)


def test_hostile_events_are_counted_and_ignored_and_the_subscriber_lives(settings: ClusterSettings) -> None:
    import json

    good = ChangeEvent("other", "d", "fp", ("a.md",)).encode()
    facts = json.loads(good)
    hostile: list[bytes] = [
        b"\xff\xfe not utf-8", b"not json", b"[]", b"null", b'"text"', b"{}",
        json.dumps({**facts, "paths": "a.md"}).encode(),
        json.dumps({**facts, "paths": [1, 2]}).encode(),
        json.dumps({**facts, "paths": [""]}).encode(),
        json.dumps({**facts, "data": "yes"}).encode(),
        json.dumps({**facts, "kind": "delete-everything"}).encode(),
        json.dumps({**facts, "origin": 5}).encode(),
        json.dumps({**facts, "extra": 1}).encode(),
        json.dumps({**facts, "paths": ["x" * 5000]}).encode(),
        json.dumps({**facts, "versions": ["v1"]}).encode(),
        json.dumps({**facts, "versions": {"other.md": "v1"}}).encode(),  # a path the event does not name
        json.dumps({**facts, "versions": {DATA: "v1"}}).encode(),  # query data the event does not name
        json.dumps({**facts, "versions": {"a.md": 7}}).encode(),
        b"[" * 100_000,  # deeply nested
        json.dumps({**facts, "paths": ["p"] * (MAX_EVENT_BYTES // 4)}).encode(),  # too big
    ]

    async def main() -> None:
        link = RedisLink(settings, "me")
        bus = ChangeBus(link)
        got: list[ChangeEvent] = []
        bus.listeners.append(got.append)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus.run)
                await _until(lambda: bus.connected)
                for raw in hostile:
                    await link.client.publish(bus.channel, raw)
                await link.client.publish(bus.channel, good)
                await _until(lambda: got)
                assert got == [ChangeEvent.decode(good)]
                assert bus.rejected == len(hostile)
                assert bus.restarts == 0 and bus.connected
                bus.stop()
        finally:
            await link.aclose()

    anyio.run(main)


def test_a_big_change_is_published_in_parts_that_are_accepted(settings: ClusterSettings) -> None:
    paths = tuple(f"folder/file-{i:06}.md" for i in range(30_000))

    async def main() -> None:
        a, b = RedisLink(settings, "a"), RedisLink(settings, "b")
        bus_b = ChangeBus(b)
        got: list[ChangeEvent] = []
        bus_b.listeners.append(got.append)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus_b.run)
                await _until(lambda: bus_b.connected)
                versions = {**{p: f'"{i}"' for i, p in enumerate(paths)}, None: "rows-1"}
                assert await ChangeBus(a).publish(ChangeEvent("a", "d", "fp", paths, data=True, versions=versions))
                await _until(lambda: sum(len(e.paths) for e in got) == len(paths))
                assert len(got) > 1 and bus_b.rejected == 0
                assert tuple(p for e in got for p in e.paths) == paths
                assert [e.data for e in got].count(True) == 1
                # Each part carries the versions of what it names, the query data's with the part that names it.
                assert {k: v for e in got for k, v in e.versions.items()} == versions
                assert all(set(e.versions) == {*e.paths, *([None] if e.data else [])} for e in got)
                bus_b.stop()
        finally:
            await a.aclose()
            await b.aclose()

    anyio.run(main)


def test_publish_never_raises_when_redis_is_gone(tmp_path: Path) -> None:
    with redis_server(tmp_path) as redis:
        settings = ClusterSettings(redis=redis.url, prefix=unique_prefix(), timeout=0.3)
        redis.stop()

        async def main() -> None:
            link = RedisLink(settings, "a")
            bus = ChangeBus(link)
            try:
                assert not await bus.publish(ChangeEvent("a", "d", "fp", ("a.md",)))
                assert not await bus.publish(ChangeEvent("a", "d", "fp", ("a.md",)))
                assert bus.publish_errors == 2 and not bus.connected
            finally:
                await link.aclose()

        anyio.run(main)


def test_the_subscriber_restarts_after_its_connection_is_killed(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """CLIENT KILL TYPE pubsub on a private Redis: the supervised subscriber counts a restart, reconnects, runs
    the reconnect callbacks once, and delivers events again."""
    with redis_server(tmp_path) as redis:
        settings = ClusterSettings(redis=redis.url, prefix=unique_prefix(), timeout=0.5)

        async def main() -> None:
            a, b = RedisLink(settings, "a"), RedisLink(settings, "b")
            bus = ChangeBus(b)
            got: list[ChangeEvent] = []
            reconnects: list[int] = []

            async def reconnected() -> None:
                reconnects.append(1)

            bus.listeners.append(got.append)
            bus.on_reconnect.append(reconnected)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(bus.run)
                    await _until(lambda: bus.connected)
                    assert reconnects == []
                    await anyio.to_thread.run_sync(redis.cli, "CLIENT", "KILL", "TYPE", "pubsub")
                    await _until(lambda: bus.restarts >= 1 and bus.connected)
                    assert reconnects == [1]
                    publisher = ChangeBus(a)
                    event = ChangeEvent("a", "d", "fp", ("a.md",))
                    await _until(lambda: redis.cli("PUBSUB", "NUMSUB", bus.channel).split()[-1] == "1")
                    assert await publisher.publish(event)
                    await _until(lambda: got)
                    assert got == [event]
                    bus.stop()
            finally:
                await a.aclose()
                await b.aclose()

        anyio.run(main)
    assert "unavailable" in caplog.text and "is back" in caplog.text
    assert "127.0.0.1:" in caplog.text


def test_lease_is_exclusive_and_taken_over_once_the_holder_stops(settings: ClusterSettings) -> None:
    interval = 0.2

    async def main() -> None:
        links = [RedisLink(settings, name) for name in ("a", "b", "c")]
        leases = [PollLeases(link) for link in links]
        try:
            held = [await lease.hold("fp", interval) for lease in leases]
            assert held == [True, False, False]
            assert [await lease.hold("fp", interval) for lease in leases] == [True, False, False]  # renewed
            # The holder stops renewing: another holds it within 2 intervals past its expiry (2.5 intervals).
            waited = 0.0
            while not any([await lease.hold("fp", interval) for lease in leases[1:]]):
                await anyio.sleep(interval / 4)
                waited += interval / 4
                assert waited < interval * (2.5 + 2)
            assert sum(bool(lease.held) for lease in leases[1:]) == 1
            # The old holder finds it lost and cannot extend or release the new holder's lease.
            assert not await leases[0].hold("fp", interval)
            await leases[0].release("fp")
            new = next(lease for lease in leases[1:] if lease.held)
            assert await new.hold("fp", interval)
            await new.release_all()
            assert await leases[0].hold("fp", interval)  # released: free at once
        finally:
            for link in links:
                await link.aclose()

    anyio.run(main)


def test_interests_union_over_replicas_and_expire(settings: ClusterSettings) -> None:
    async def main() -> None:
        a, b = PollLeases(RedisLink(settings, "a")), PollLeases(RedisLink(settings, "b"))
        try:
            assert await a.wanted("fp") == set()
            await a.want("fp", {"x.md", "y.md"}, interval=10)
            await b.want("fp", {"y.md", DATA}, interval=0.1)
            await a.want("other", {"z.md"}, interval=10)
            assert await a.wanted("fp") == {"x.md", "y.md", DATA}
            await a.want("fp", {"x.md"}, interval=10)  # replaced, not added to
            assert await b.wanted("fp") == {"x.md", "y.md", DATA}
            await anyio.sleep(0.5)  # b's set expired (3 intervals)
            assert await b.wanted("fp") == {"x.md"}
            await a.want("fp", set(), interval=10)
            assert await a.wanted("fp") == set()
        finally:
            await a.link.aclose()
            await b.link.aclose()

    anyio.run(main)


def test_the_last_polled_versions_are_kept_for_the_next_holder(settings: ClusterSettings) -> None:
    async def main() -> None:
        a, b = PollLeases(RedisLink(settings, "a")), PollLeases(RedisLink(settings, "b"))
        try:
            assert await b.seen("fp") == {}
            await a.record("fp", {"x.md": '"v1"', "gone.md": None, None: "rows-7"})
            assert await b.seen("fp") == {"x.md": '"v1"', "gone.md": None, None: "rows-7"}
            await a.record("fp", {"x.md": '"v2"'})  # replaced whole
            assert await b.seen("fp") == {"x.md": '"v2"'}
            await a.link.client.hset(a.link.key("versions", "fp"), "junk.md", b"\xff not json")
            assert await b.seen("fp") == {"x.md": '"v2"'}
        finally:
            await a.link.aclose()
            await b.link.aclose()

    anyio.run(main)


def test_paths_polled_for_the_cluster_are_safe_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interests come from Redis, which others write too: unsafe paths are never polled, and the count is capped."""
    import aggregator.cluster.leases as leases

    assert leases.pollable({"a.md", "dir/b.md", DATA, "../etc/passwd", "/abs", "http://evil/x", "a/%2e%2e/b",
                            ""}) == {"a.md", "dir/b.md", None}
    monkeypatch.setattr(leases, "MAX_POLLED_PATHS", 3)
    assert len(leases.pollable({f"{i}.md" for i in range(10)})) == 3
