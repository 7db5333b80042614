"""Replicas on one Redis (`server.cluster`), end to end: 2-3 `serve --http` subprocesses, a polled HTTP source
(tests/http_server.py, counting requests), listeners on every replica on both wires (the official client)."""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.subscriptions import ResourceUpdated

from aggregator.cluster.leases import LEASE_INTERVALS, LEASE_MARGIN
from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
from tests.conftest import write_manifest
from tests.http_server import Upstream, serve
from tests.replicas import RedisServer, Replica, metric_sum, redis_server, replicas
from tests.test_live import Inbox

INTERVAL = 0.3  # the source's poll interval, seconds
URI = "api://a"


def _manifest(folder: Path, upstream: Upstream, redis: str, prefix: str, timeout: str = "5s") -> Path:
    """A replica's manifest: the counting upstream polled every INTERVAL, `server.cluster` on `redis` under `prefix`.
    Its Redis calls may take `timeout` (5 s: a call to the local Redis given up under the suite's load lets a
    replica poll or read upstream itself, and a count the test asserts doubles; the slow-Redis test gives its own)."""
    return write_manifest(folder, f"""
        version: 1
        server:
          name: replicas
          cluster: {{redis: "{redis}", prefix: {prefix}, timeout: {timeout}}}
        sources:
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, poll: {int(INTERVAL * 1000)}ms}}
        resources:
          - {{uri: "{URI}", name: a, source: api, path: docs/a.md}}
        """)


@dataclass
class Fleet:
    upstream: Upstream
    manifest: Path
    replicas: list[Replica]
    redis: str
    prefix: str


@contextmanager
def polled_fleet(folder: Path, count: int) -> Iterator[Fleet]:
    """`count` replicas of `_manifest` on the shared Redis, under a key prefix of their own (deleted afterwards),
    polling a counting upstream."""
    url = require_shared()
    prefix = unique_prefix()
    with serve() as upstream:
        manifest = _manifest(folder, upstream, url, prefix)
        try:
            with replicas(manifest, count, folder) as group:
                yield Fleet(upstream, manifest, group, url, prefix)
        finally:
            delete_prefix(url, prefix)


@contextmanager
def on_private_redis(tmp_path: Path, count: int) -> Iterator[tuple[Upstream, RedisServer, list[Replica]]]:
    """An upstream, a redis-server of the test's own (to pause, hang or restart) and `count` replicas on them. Their
    Redis calls time out after 500 ms: a paused Redis (CLIENT PAUSE, 4 s) must be seen as unavailable meanwhile."""
    with serve() as upstream, redis_server(tmp_path) as redis:
        manifest = _manifest(tmp_path, upstream, redis.url, unique_prefix(), timeout="500ms")
        with replicas(manifest, count, tmp_path) as group:
            yield upstream, redis, group


class Listeners:
    """On one replica: a modern listen stream and a legacy subscription to URI, and what each heard."""

    def __init__(self) -> None:
        self.modern: list[Any] = []
        self.legacy = Inbox()
        self.modern_ended = anyio.Event()
        self.modern_lost = False

    def updated(self) -> tuple[int, int]:
        return (sum(e == ResourceUpdated(uri=URI) for e in self.modern),
                sum(e == ("updated", URI) for e in self.legacy.events))


async def clients(stack: AsyncExitStack, replica: Replica, heard: Listeners) -> Client:
    """On `replica`: a legacy session subscribed to URI, telling `heard.legacy`, and a modern client (returned), both
    closed with `stack`."""
    legacy = await stack.enter_async_context(Client(replica.url, mode="legacy", cache=None,
                                                    message_handler=heard.legacy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await legacy.subscribe_resource(URI)
    return await stack.enter_async_context(Client(replica.url, mode="auto", cache=None))


@asynccontextmanager
async def listening(replica: Replica, tg: Any) -> AsyncIterator[Listeners]:
    heard = Listeners()
    stack = AsyncExitStack()
    try:
        modern = await clients(stack, replica, heard)
        sub = await stack.enter_async_context(modern.listen(resource_subscriptions=[URI]))

        async def collect() -> None:
            try:
                async for event in sub:
                    heard.modern.append(event)
                heard.modern_ended.set()  # the server closed the stream gracefully
            except SubscriptionLost:  # its replica was killed
                heard.modern_lost = True

        tg.start_soon(collect)
        yield heard
    finally:
        try:
            await stack.aclose()
        except Exception:
            if replica.process.poll() is None:  # closing a client of a killed replica fails, as it should
                raise


async def _until(condition: Any, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


def _holder(group: list[Replica]) -> Replica:
    held = [r for r in group if r.process.poll() is None and r.health()["cluster"]["leases"] == 1]
    assert len(held) == 1, [r.health() for r in group if r.process.poll() is None]
    return held[0]


def test_a_polled_change_reaches_every_replica_once_and_one_replica_polls(tmp_path: Path) -> None:
    with polled_fleet(tmp_path, 3) as fleet:
        upstream, group = fleet.upstream, fleet.replicas

        async def main() -> None:
            async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
                heard = [await stack.enter_async_context(listening(r, tg)) for r in group]
                await _until(lambda: all(r.health()["cluster"]["connected"] for r in group))
                await anyio.sleep(INTERVAL * 4)  # interests written, the holder's first poll recorded
                # Upstream calls for the poll: one replica polls, whatever the replica count.
                before = upstream.hits["HEAD docs/a.md"]
                await anyio.sleep(INTERVAL * 10)
                polls = upstream.hits["HEAD docs/a.md"] - before
                # 10 intervals: ~10 on a quiet machine, never ~30 (each replica polling). Fewer on a loaded one,
                # where a poll starts an interval after the last one ended (4 were seen at load 15): the lower bound
                # is only that polling goes on; that one replica does it is the lease, held by exactly one.
                assert 1 <= polls <= 13, polls
                holder = _holder(group)

                upstream.etag, upstream.body = '"v2"', "# A\n\nchanged upstream\n"
                await _until(lambda: all(h.updated() == (1, 1) for h in heard))
                await anyio.sleep(INTERVAL * 5)  # no second copy arrives
                assert [h.updated() for h in heard] == [(1, 1)] * 3
                for r in group:
                    async with Client(r.url, mode="auto", cache=None) as client:
                        assert (await client.read_resource(URI)).contents[0].text == upstream.body
                figures = holder.metrics()
                assert 'aggregator_cluster_events_total{direction="published"} 1.0' in figures
                assert "aggregator_cluster_connected 1.0" in figures
                assert "aggregator_cluster_leases_held 1.0" in figures
                other = next(r for r in group if r is not holder)
                assert 'aggregator_cluster_events_total{direction="received"} 1.0' in other.metrics()

                # The lease holder dies: another takes the lease and the next change still arrives, once.
                holder.kill()
                killed = time.monotonic()
                survivors = [(r, h) for r, h in zip(group, heard) if r is not holder]
                # Takes over once the dead holder's lease lapses (about 2 intervals on a quiet machine), not at some
                # later timer: the bound is the lease's life plus generous slack for a loaded machine, where a
                # replica's event loop and our health polls run late (1.6 s was once missed at load 10+).
                await _until(lambda: any(r.health()["cluster"]["leases"] for r, _ in survivors))
                assert time.monotonic() - killed < INTERVAL * LEASE_INTERVALS + LEASE_MARGIN + 2 * INTERVAL + 5.0
                upstream.etag, upstream.body = '"v3"', "# A\n\nchanged again\n"
                await _until(lambda: all(h.updated() == (2, 2) for _, h in survivors))
                await anyio.sleep(INTERVAL * 5)
                assert [h.updated() for _, h in survivors] == [(2, 2)] * 2
                assert _holder([r for r, _ in survivors]) is not holder
                tg.cancel_scope.cancel()

        anyio.run(main)


def test_redis_paused_or_killed_keeps_serving_then_streams_close_and_recover(tmp_path: Path) -> None:
    """A private redis-server: CLIENT PAUSE, then kill: reads keep working, /healthz says disconnected; when it is
    back the replica reconnects, closes its listen streams (clients re-listen) and tells legacy sessions."""
    with on_private_redis(tmp_path, 1) as (upstream, redis, (replica,)):
        async def main() -> None:
            async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
                heard = await stack.enter_async_context(listening(replica, tg))
                await _until(lambda: replica.health()["cluster"]["connected"])
                async with Client(replica.url, mode="auto", cache=None) as client:
                    assert (await client.read_resource(URI)).contents[0].text == upstream.body

                    await anyio.to_thread.run_sync(redis.pause, 4000)
                    await _until(lambda: not replica.health()["cluster"]["connected"])
                    # Alone, the replica polls for its own subscribers: a change still arrives.
                    upstream.etag, upstream.body = '"v2"', "# A\n\nwhile paused\n"
                    await _until(lambda: heard.updated() == (1, 1))
                    assert (await client.read_resource(URI)).contents[0].text == upstream.body

                    await _until(lambda: replica.health()["cluster"]["connected"])  # the pause ends
                    await _until(lambda: heard.modern_ended.is_set())  # its stream was closed
                    await _until(lambda: ("list_changed", None) in heard.legacy.events)

                    redis.stop()
                    await _until(lambda: not replica.health()["cluster"]["connected"])
                    assert (await client.read_resource(URI)).contents[0].text == upstream.body
                    assert "aggregator_cluster_connected 0.0" in replica.metrics()
                    redis.start()
                    await _until(lambda: replica.health()["cluster"]["connected"])
                    # Clients listen again and hear the next change (through the lease holder's poll).
                    async with listening(replica, tg) as again:
                        await anyio.sleep(INTERVAL * 4)
                        upstream.etag, upstream.body = '"v3"', "# A\n\nafter the restart\n"
                        await _until(lambda: again.updated() == (1, 1))
                    assert (await client.read_resource(URI)).contents[0].text == upstream.body
                    restarts = [line for line in replica.metrics().splitlines()
                                if line.startswith("aggregator_cluster_subscriber_restarts_total")]
                    assert restarts and float(restarts[0].split()[-1]) >= 1
                tg.cancel_scope.cancel()

        anyio.run(main)
    log = (tmp_path / "replica0.log").read_text(errors="replace")
    assert log.count("unavailable") <= 4 and "is back" in log


def test_events_from_another_replica_reach_only_listeners_whose_token_sees_the_uri(tmp_path: Path) -> None:
    """2 replicas with bearer auth: a change the lease holder saw reaches, on the OTHER replica (over the bus), a
    listen stream of a token holding the scope of a hidden URI and one without it, both listening to it; only the
    first hears the hidden URI's `updated` (the server keeps it out of the second stream)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    url = require_shared()
    prefix = unique_prefix()
    hidden = "api://secret"
    with serve() as upstream:
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server:
              name: scoped-replicas
              cluster: {{redis: "{url}", prefix: {prefix}, timeout: 5s}}
              auth:
                tokens:
                  - {{name: admin, token: "${{ADMIN_TOKEN}}", scopes: [secret]}}
                  - {{name: reader, token: "${{READER_TOKEN}}"}}
            sources:
              api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true,
                     poll: {int(INTERVAL * 1000)}ms}}
            resources:
              - {{uri: "{URI}", name: a, source: api, path: docs/a.md}}
              - {{uri: "{hidden}", name: s, source: api, path: docs/a.md, access: {{scopes: [secret]}}}}
            """)
        env = {"ADMIN_TOKEN": "admin-token-0123456789", "READER_TOKEN": "reader-token-0123456789"}

        def client(replica: Replica, token: str) -> Client:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            return Client(streamable_http_client(replica.url, http_client=http), mode="auto", cache=None)

        try:
            with replicas(manifest, 2, tmp_path, env=env) as group:
                async def main() -> None:
                    heard: dict[str, list[Any]] = {"admin": [], "reader": []}
                    async with anyio.create_task_group() as tg, AsyncExitStack() as stack:
                        await _until(lambda: all(r.health()["cluster"]["connected"] for r in group))
                        await _until(lambda: sum(r.health()["cluster"]["leases"] for r in group) == 1)
                        holder = _holder(group)
                        other = next(r for r in group if r is not holder)
                        for name, token in (("admin", env["ADMIN_TOKEN"]), ("reader", env["READER_TOKEN"])):
                            session = await stack.enter_async_context(client(other, token))
                            sub = await stack.enter_async_context(
                                session.listen(resource_subscriptions=[URI, hidden]))

                            async def collect(sub: Any = sub, into: list[Any] = heard[name]) -> None:
                                async for event in sub:
                                    into.append(event)

                            tg.start_soon(collect)
                        await anyio.sleep(INTERVAL * 4)  # interests written, the holder's first poll recorded
                        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged upstream\n"
                        await _until(lambda: len(heard["admin"]) >= 2 and len(heard["reader"]) >= 1)
                        await anyio.sleep(INTERVAL * 5)  # nothing else arrives
                        assert sorted(map(repr, heard["admin"])) == sorted(map(repr, [
                            ResourceUpdated(uri=URI), ResourceUpdated(uri=hidden)]))
                        assert heard["reader"] == [ResourceUpdated(uri=URI)]
                        assert 'direction="received"} 1.0' in other.metrics()  # it came over the bus
                        tg.cancel_scope.cancel()

                anyio.run(main)
        finally:
            delete_prefix(url, prefix)


def _lease_keys(redis: str, prefix: str) -> list[bytes]:
    import redis as redis_py

    client = redis_py.Redis.from_url(redis, socket_timeout=5)
    try:
        return sorted(client.scan_iter(match=f"{prefix}:lease:*", count=500))
    finally:
        client.close()


def test_a_reload_that_changes_a_polled_sources_settings_moves_its_lease(tmp_path: Path) -> None:
    """Issue 24 item 10: a reload changes the polled source's settings (its fingerprint) but not its `poll:`. The
    lease of the old fingerprint is given back, not kept counted: across the replicas /healthz and
    aggregator_cluster_leases_held add up to the 1 lease Redis holds, and one replica polls."""
    with polled_fleet(tmp_path, 2) as fleet:
        manifest, group, url, prefix = fleet.manifest, fleet.replicas, fleet.redis, fleet.prefix

        async def main() -> None:
            await _until(lambda: all(r.health()["cluster"]["connected"] for r in group))
            await _until(lambda: sum(r.health()["cluster"]["leases"] for r in group) == 1)
            assert len(_lease_keys(url, prefix)) == 1
            text = manifest.read_text().replace("allowPrivateNetwork: true,",
                                                "allowPrivateNetwork: true, maxBytes: 2MiB,")
            assert "maxBytes: 2MiB" in text
            manifest.write_text(text)
            await _until(lambda: all(r.health()["reloads"] == 1 for r in group))
            old = _lease_keys(url, prefix)
            # The old lease expires in 1.5 intervals anyway; counts must agree with Redis after that.
            await _until(lambda: _lease_keys(url, prefix) != old)
            await anyio.sleep(INTERVAL * 4)
            leases = [r.health()["cluster"]["leases"] for r in group]
            held = [metric_sum(r.metrics(), "aggregator_cluster_leases_held") for r in group]
            assert sorted(leases) == [0, 1] and sorted(held) == [0.0, 1.0], (leases, held)
            assert len(_lease_keys(url, prefix)) == 1

        anyio.run(main)
