"""Replicas on one Redis across outages, end to end: 2 `serve --http` subprocesses, a private redis-server that
hangs (SIGSTOP) or restarts with its data, a polled HTTP source, and on every replica a legacy subscription and a
listen stream that listens again whenever the server ends it, as a client does (the official client, both wires)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.subscriptions import SubscriptionLost

from tests.http_server import Upstream
from tests.replicas import RedisServer, Replica, metric_sum
from tests.test_cluster_replicas import INTERVAL, URI, Listeners, clients, on_private_redis

POLL = "HEAD docs/a.md"
"""The upstream request of a poll of URI (only a lease holder polls while Redis is up)."""


class Heard(Listeners):
    """What one client of each wire heard on one replica: the modern one across all the streams it opened."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = 0
        """Listen streams opened (the first, then one each time the server ended the last)."""


@asynccontextmanager
async def listening(replica: Replica, tg: Any) -> AsyncIterator[Heard]:
    heard = Heard()
    async with AsyncExitStack() as stack:
        modern = await clients(stack, replica, heard)
        opened = anyio.Event()

        async def listen_again_and_again() -> None:
            while True:
                async with modern.listen(resource_subscriptions=[URI]) as sub:
                    heard.streams += 1
                    opened.set()
                    try:
                        async for event in sub:
                            heard.modern.append(event)
                    except SubscriptionLost:  # the client is closing (the test ends), or the replica died
                        return

        tg.start_soon(listen_again_and_again)
        await opened.wait()
        yield heard


async def _until(condition: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


def _connected(group: list[Replica]) -> list[bool]:
    return [r.health()["cluster"]["connected"] for r in group]


@pytest.mark.parametrize("outage", ["hangs", "restarts with its data"])
def test_a_change_made_while_redis_is_out_reaches_every_listener_once(tmp_path: Path, outage: str) -> None:
    """Issue 24 item 11: while Redis is out each replica polls alone and tells its own listeners; once Redis is
    back, the lease holder (which compares with the versions kept in Redis before the outage) must not tell that
    change again, on any replica, on either wire. What a client sees: `updated` once during the outage; when Redis
    is back its listen stream ends (it listens again) and a legacy session gets list_changed; then nothing more
    until the next change, which arrives once."""
    async def outage_and_change(group: list[Replica], heard: list[Heard], redis: RedisServer,
                                upstream: Upstream) -> None:
        _interrupt(redis, outage)
        await _until(lambda: not any(_connected(group)))
        # Each replica's first poll alone takes its baseline: a change made before it is told only when Redis is
        # back (once, by the lease holder's poll); the next test covers that.
        await anyio.sleep(INTERVAL * 3)
        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged while Redis was out\n"
        await _until(lambda: all(h.updated() == (1, 1) for h in heard))

    _run(tmp_path, outage, outage_and_change)


@pytest.mark.parametrize("outage", ["hangs", "restarts with its data"])
def test_a_change_made_as_redis_goes_out_is_told_by_the_lease_holder_alone_then_once_everywhere(
        tmp_path: Path, outage: str) -> None:
    """The change is made at once as Redis goes out, before any replica's first poll alone. The lease holder
    compares that poll with what it polled last for the cluster, so its listeners hear it while Redis is still out
    (it used to take that poll as a mere baseline, and they heard nothing until Redis came back); a replica with no
    baseline tells its listeners when the lease holder publishes it after the outage; each listener hears it once."""
    async def outage_and_change(group: list[Replica], heard: list[Heard], redis: RedisServer,
                                upstream: Upstream) -> None:
        holder = next(i for i, r in enumerate(group) if r.health()["cluster"]["leases"])
        _interrupt(redis, outage)
        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged as Redis went out\n"
        await _until(lambda: heard[holder].updated() == (1, 1))  # Redis is still out
        await _until(lambda: not any(_connected(group)))  # an outage every replica noticed

    _run(tmp_path, outage, outage_and_change)


@pytest.mark.parametrize("outage", ["hangs", "restarts with its data"])
def test_a_change_the_lease_holder_polled_as_redis_went_out_is_sent_again_once_it_is_back(
        tmp_path: Path, outage: str) -> None:
    """Redis goes out while the lease holder's poll for the cluster waits on the upstream (its Redis calls done),
    and that poll sees the change: the holder's listeners hear it, but its event cannot reach the other replica.
    The change must not be kept in Redis as sent (a hung Redis runs the write that timed out when it is back):
    after the outage it is sent again, and the other replica's listeners hear it, once."""
    async def outage_and_change(group: list[Replica], heard: list[Heard], redis: RedisServer,
                                upstream: Upstream) -> None:
        holder = next(i for i, r in enumerate(group) if r.health()["cluster"]["leases"])
        polls = upstream.hits[POLL]
        upstream.answering.clear()
        await _until(lambda: upstream.hits[POLL] > polls)  # only the holder polls while Redis is up
        _interrupt(redis, outage)
        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged during a poll as Redis went out\n"
        upstream.answering.set()
        await _until(lambda: heard[holder].updated() == (1, 1))
        await _until(lambda: not any(_connected(group)))

    _run(tmp_path, outage, outage_and_change)


def test_a_change_told_while_redis_hangs_is_not_read_back_old_from_the_shared_cache(tmp_path: Path) -> None:
    """The shared cache holds the first body; Redis hangs and the replica, polling alone, tells the change. Once
    Redis is back, and before any poll for the cluster (held upstream), reading it must give the new body: the
    change's forget was owed to the shared cache, and is done before it is read again (the old body was served,
    after the `updated`, until the lease holder's next poll forgot it)."""
    with on_private_redis(tmp_path, 1) as (upstream, redis, (replica,)):
        async def main() -> None:
            async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
                heard = await stack.enter_async_context(listening(replica, tg))
                client = await stack.enter_async_context(Client(replica.url, mode="auto", cache=None))
                await _until(lambda: replica.health()["cluster"]["connected"])
                assert (await client.read_resource(URI)).contents[0].text == upstream.body
                assert metric_sum(replica.metrics(), "aggregator_shared_cache_total", result="store") >= 1

                redis.freeze()
                await _until(lambda: not replica.health()["cluster"]["connected"])
                upstream.etag, upstream.body = '"v2"', "# A\n\nchanged while Redis hung\n"
                await _until(lambda: heard.updated() == (1, 1))  # its own poll alone
                upstream.holding = {POLL}
                upstream.answering.clear()
                redis.thaw()
                await _until(lambda: replica.health()["cluster"]["connected"])
                assert (await client.read_resource(URI)).contents[0].text == upstream.body

                upstream.answering.set()
                await anyio.sleep(INTERVAL * 8)  # the holder's poll for the cluster tells nothing more
                assert heard.updated() == (1, 1)
                tg.cancel_scope.cancel()

        anyio.run(main)


def _run(tmp_path: Path, outage: str, outage_and_change: Any) -> None:
    """Two replicas with listeners; `outage_and_change` takes Redis out and changes the upstream; Redis comes back
    while the upstream holds every poll, which it answers once each listener listens again. Then every listener
    must have heard that change exactly once, and the next change exactly once too."""
    with on_private_redis(tmp_path, 2) as (upstream, redis, group):
        async def main() -> None:
            async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
                heard = [await stack.enter_async_context(listening(r, tg)) for r in group]
                await _until(lambda: all(_connected(group)))
                await _until(lambda: sum(r.health()["cluster"]["leases"] for r in group) == 1)
                # The holder's poll of what every replica wants began and ended (the next one began): it kept
                # the versions, in Redis and as what its listeners were told. Each replica's subscriptions took
                # the version of what they name too (at most one request per subscription, four here), so the
                # count covers those and two polls.
                polls = upstream.hits[POLL]
                await _until(lambda: upstream.hits[POLL] >= polls + 6)
                await outage_and_change(group, heard, redis, upstream)

                # A poll that ends before a listener listens again tells it nothing (it heard its stream
                # end): the upstream answers the polls once every client is back.
                upstream.answering.clear()
                _resume(redis, outage)
                await _until(lambda: all(_connected(group)))
                await _until(lambda: all(h.streams == 2 for h in heard))  # ended, listened again
                await _until(lambda: all(("list_changed", None) in h.legacy.events for h in heard))
                upstream.answering.set()
                # A lease holder polls again (the duplicate came 0.5-4 s after Redis was back).
                await _until(lambda: sum(r.health()["cluster"]["leases"] for r in group) == 1)
                await _until(lambda: all(h.updated() == (1, 1) for h in heard))
                await anyio.sleep(INTERVAL * 8)
                assert [h.updated() for h in heard] == [(1, 1)] * 2

                upstream.etag, upstream.body = '"v3"', "# A\n\nchanged after\n"
                await _until(lambda: all(h.updated() == (2, 2) for h in heard))
                await anyio.sleep(INTERVAL * 5)
                assert [h.updated() for h in heard] == [(2, 2)] * 2
                tg.cancel_scope.cancel()

        anyio.run(main)


def _interrupt(redis: RedisServer, outage: str) -> None:
    if outage == "hangs":
        redis.freeze()
    else:
        redis.cli("SAVE")  # what a Redis with persistence holds when it restarts: the versions kept before
        redis.stop()


def _resume(redis: RedisServer, outage: str) -> None:
    if outage == "hangs":
        redis.thaw()
    else:
        redis.start()
