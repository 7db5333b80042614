"""Two replicas in one process on the shared Redis (unique prefix): query data and listings of a polled SQLite
source travel the bus; local folders are watched by each replica and never published."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from aggregator.cluster.bus import ChangeBus
from aggregator.cluster.link import RedisLink, source_fingerprint
from aggregator.notify import Notifier
from aggregator.server import build_server
from aggregator.service import ResourceService
from aggregator.supervisor import Supervisor
from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
from tests.conftest import write_manifest

sqlalchemy = pytest.importorskip("sqlalchemy")


@asynccontextmanager
async def replica(manifest: Path, name: str) -> AsyncIterator[tuple[Any, Supervisor]]:
    service = await ResourceService.open(manifest)
    assert service.manifest.server.cluster is not None
    link = RedisLink(service.manifest.server.cluster, name)
    notifier = Notifier()
    live = Supervisor(service, notifier, cluster=ChangeBus(link))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(live.run)
            try:
                yield build_server(service, notifier), live
            finally:
                live.stop()
                tg.cancel_scope.cancel()
    finally:
        await service.aclose()
        await link.aclose()


async def _until(condition: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


def _customers(tmp_path: Path) -> tuple[str, Any]:
    """A SQLite database with one customer, its URL and engine."""
    db = f"sqlite:///{tmp_path / 'live.db'}"
    engine = sqlalchemy.create_engine(db)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)"))
        conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (1, 'Ada')"))
    return db, engine


def test_query_data_and_listing_changes_travel_and_local_folders_stay_local(tmp_path: Path) -> None:
    url = require_shared()
    prefix = unique_prefix()
    db, engine = _customers(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: cluster-live
          cluster: {{redis: "{url}", prefix: {prefix}}}
        sources:
          crm: {{url: "{db}", poll: 200ms, checksum: "SELECT count(*), max(id) FROM customers"}}
          docs: {{url: ./docs}}
        collections:
          - {{source: crm, glob: "*", uri: "db://crm/{{path}}/schema"}}
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: c, source: crm,
              query: "SELECT * FROM customers WHERE id = :id"}}
        """)

    async def main() -> None:
        async with replica(manifest, "a") as (_, a):
            await _until(lambda: (a.cluster_health() or {}).get("leases") == 1)  # a polls for both
            async with replica(manifest, "b") as (server_b, b), \
                    Client(server_b, mode="auto", cache=None) as client:
                assert b.cluster is not None and a.cluster is not None
                await _until(lambda: b.cluster is not None and b.cluster.connected)
                assert json.loads((await client.read_resource("db://crm/customers/2")).contents[0].text)["rows"] == []
                events: list[Any] = []
                async with client.listen(resources_list_changed=True, resource_subscriptions=[
                        "db://crm/customers/2", "docs://a.md"]) as sub:
                    async def collect() -> None:
                        async for event in sub:
                            events.append(event)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(collect)
                        await anyio.sleep(1.0)  # b's interests written, a's poll recorded the checksum
                        with engine.begin() as conn:
                            conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (2, 'Grace')"))
                            conn.execute(sqlalchemy.text("CREATE TABLE notes (id INTEGER PRIMARY KEY)"))
                        await _until(lambda: len(events) >= 2)
                        await anyio.sleep(1.0)  # nothing more comes
                        assert sorted(map(repr, events)) == sorted(map(repr, [
                            ResourceUpdated(uri="db://crm/customers/2"), ResourcesListChanged()]))
                        assert b.cluster.received >= 2 and b.cluster.published == 0
                        published = a.cluster.published

                        (tmp_path / "docs" / "a.md").write_text("# A2\n")  # each replica sees its own copy
                        await _until(lambda: len(events) >= 3)
                        assert events[-1] == ResourceUpdated(uri="docs://a.md")
                        await anyio.sleep(0.5)
                        assert a.cluster.published == published and b.cluster.published == 0
                        tg.cancel_scope.cancel()
                rows = json.loads((await client.read_resource("db://crm/customers/2")).contents[0].text)["rows"]
                assert rows and rows[0]["name"] == "Grace"  # b's cached empty result was dropped
                assert "db://crm/notes/schema" in [r.uri for r in (await client.list_resources()).resources]

    try:
        anyio.run(main)
    finally:
        engine.dispose()
        delete_prefix(url, prefix)


def test_serve_without_redis_installed_names_the_extra(tmp_path: Path) -> None:
    """server.cluster set, redis-py missing: `serve` exits 2 with one line naming the extra, before serving."""
    import os
    import subprocess
    import sys

    manifest = write_manifest(tmp_path, """
        version: 1
        server:
          name: no-redis
          cluster: {redis: "redis://:hunter2@127.0.0.1:6379/0"}
        resources:
          - {uri: "note://a", name: a, text: hi}
        """)
    code = ("import sys; sys.modules['redis'] = sys.modules['redis.asyncio'] = None; "
            "from aggregator.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "serve", str(manifest), "--http", "0"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 2, done.stderr
    assert "pip install 'mcp-aggregator[cluster]'" in done.stderr
    assert "hunter2" not in done.stderr


def test_without_server_cluster_nothing_changes(tmp_path: Path) -> None:
    """No `server.cluster`: no cluster state in /healthz, no cluster metrics, no Redis touched."""
    from aggregator.metrics import Metrics

    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: alone}
        resources:
          - {uri: "note://a", name: a, text: hi}
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            live = Supervisor(service, Notifier())
            assert live.cluster is None and live.cluster_health() is None
            body, _ = Metrics(live).render()
            assert b"aggregator_cluster" not in body and b"aggregator_catalog_resources" in body
        finally:
            await service.aclose()

    anyio.run(main)


def test_an_inbound_backlog_overflow_recovers_as_a_reconnect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """More events than the backlog holds arrive at once: the extra ones are dropped, so once the backlog is handled
    the replica starts over as after a reconnect (list_changed to legacy sessions, streams ended), logged once."""
    import aggregator.live.replicas
    from aggregator.cluster.bus import ChangeEvent

    monkeypatch.setattr(aggregator.live.replicas, "INBOUND_EVENTS", 2)
    url = require_shared()
    prefix = unique_prefix()
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: backlog
          cluster: {{redis: "{url}", prefix: {prefix}}}
        resources:
          - {{uri: "note://a", name: a, text: hi}}
        """)

    async def main() -> None:
        async with replica(manifest, "a") as (_, live):
            assert live.cluster is not None
            await _until(lambda: live.cluster is not None and live.cluster.connected)
            assert live.notifier.sent_list_changed == 0  # joining is not a recovery
            for listener in live.cluster.listeners:
                for i in range(6):  # no await between them: the handler task cannot drain the backlog
                    listener(ChangeEvent("other", "d", "no-such-source", (f"{i}.md",)))
            await _until(lambda: live.notifier.sent_list_changed == 1)
            await anyio.sleep(0.3)
            assert live.notifier.sent_list_changed == 1

    try:
        anyio.run(main)
    finally:
        delete_prefix(url, prefix)
    assert caplog.text.count("change events wait to be handled") == 1


def test_a_cluster_reconnect_ends_listen_streams_but_keeps_the_console_live(tmp_path: Path) -> None:
    """Back on the bus, the replica ends its listen streams (clients listen again) and tells list_changed; the
    console's event hub, which shares the notifier's shutdown, must still take streams afterwards and hear it."""
    from aggregator.console.app import Console
    from aggregator.manifest.model import ClusterSettings

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: rejoin, console: true}
        sources: {docs: {url: ./docs}}
        collections: [{source: docs, glob: "*.md", uri: "docs://{path}"}]
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        link = RedisLink(ClusterSettings(redis="redis://127.0.0.1:1/0", prefix=unique_prefix()), "r")
        try:
            live = Supervisor(service, Notifier(), cluster=ChangeBus(link))
            console = Console(live)
            before = console.events.stream(lambda uri: True, lambda: 1)
            assert (await before.__anext__()).startswith("event: hello")
            assert live.cluster is not None
            for rejoined in live.cluster.on_reconnect:  # what the bus runs when Redis is back
                await rejoined()
            after = console.events.stream(lambda uri: True, lambda: 1)
            assert (await after.__anext__()).startswith("event: hello")  # still taking streams
            await live.notifier.list_changed()
            with anyio.fail_after(5):
                assert "event: catalog" in await after.__anext__()
            await before.aclose()
            await after.aclose()
        finally:
            await link.aclose()
            await service.aclose()

    anyio.run(main)


def test_a_change_between_subscribing_and_the_holders_next_poll_is_heard(tmp_path: Path) -> None:
    """A subscription on a replica that does not hold the poll lease records its interest and the version of what
    it names at once: the holder's next poll, which may be an interval away, compares with it and publishes the
    change. (`poll: 1h`: the test runs the holder's poll.)"""
    url = require_shared()
    prefix = unique_prefix()
    db, engine = _customers(tmp_path)
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: cluster-subscribe
          cluster: {{redis: "{url}", prefix: {prefix}}}
        sources:
          crm: {{url: "{db}", poll: 1h, checksum: "SELECT count(*), max(id) FROM customers"}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: c, source: crm,
              query: "SELECT * FROM customers WHERE id = :id"}}
        """)

    async def main() -> None:
        async with replica(manifest, "a") as (_, a), replica(manifest, "b") as (server_b, b), \
                Client(server_b, mode="auto", cache=None) as client:
            assert a._replica is not None and b.cluster is not None
            await _until(lambda: b.cluster is not None and b.cluster.connected)
            fingerprint = source_fingerprint(a.service.manifest.sources["crm"])
            events: list[Any] = []
            async with client.listen(resource_subscriptions=["db://crm/customers/2"]) as sub:
                async def collect() -> None:
                    async for event in sub:
                        events.append(event)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect)
                    with anyio.fail_after(10):  # b's version of what its subscriber wants is kept in Redis
                        while None not in await a._replica.leases.seen(fingerprint):
                            await anyio.sleep(0.05)
                    with engine.begin() as conn:
                        conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (2, 'Grace')"))
                    assert await a._replica.poll_for_cluster("crm", 3600.0, {})  # a takes the lease and polls
                    await _until(lambda: len(events) >= 1)
                    assert events == [ResourceUpdated(uri="db://crm/customers/2")]
                    tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        engine.dispose()
        delete_prefix(url, prefix)
