"""The cluster's shared content cache against the real Redis on 127.0.0.1:6379 (a unique key prefix per test) and
a local HTTP server counting GETs: several ResourceService instances in one process play the replicas, each with its
own sources and its own local cache, as separate processes would have."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from aggregator.cluster import shared_cache
from aggregator.cluster.link import RedisLink
from aggregator.cluster.shared_cache import MAGIC, SharedContent
from aggregator.content import Content
from aggregator.service import ResourceService
from tests.conftest import write_manifest
from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
from tests.http_server import Upstream, serve
from tests.replicas import RedisServer, free_port, redis_server
from tests.replicas import replicas as serve_replicas

TOKEN = "tok-s3cr3t-123"


@pytest.fixture
def redis_url() -> str:
    """The shared Redis (skip saying why without it)."""
    return require_shared()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; every key this test's replicas wrote under it is deleted afterwards."""
    name = unique_prefix()
    yield name
    delete_prefix(redis_url, name)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serve() as server:
        yield server


def manifest(folder: Path, upstream: Upstream, redis_url: str, prefix: str, *, cluster: str = "",
             headers: str = f"Authorization: 'Bearer {TOKEN}'", source_id: str = "api", timeout: str = "5s") -> Path:
    """A replica's manifest: the HTTP upstream as a remote source, `server.cluster` on Redis under `prefix`. Its
    Redis calls may take `timeout` (5 s: a test that counts upstream calls must not see a call to the local Redis
    given up under the suite's load; the tests of a slow Redis give their own)."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_manifest(folder, f"""
        version: 1
        server:
          name: replica
          cluster: {{redis: "{redis_url}", prefix: "{prefix}", timeout: {timeout}{cluster}}}
        sources:
          {source_id}:
            url: "http://127.0.0.1:{upstream.port}/base"
            allowPrivateNetwork: ["127.0.0.1/32"]
            headers: {{{headers}}}
            timeout: 5s
            ttl: 5m
        resources:
          - {{uri: "api://a", name: a, source: {source_id}, path: docs/a.md}}
          - {{uri: "api://blob", name: blob, source: {source_id}, path: blob}}
        templates:
          - {{uriTemplate: "api://raw/{{+path}}", name: raw, source: {source_id}, path: "{{path}}"}}
        """)


@asynccontextmanager
async def replicas(*manifests: Path) -> AsyncIterator[list[ResourceService]]:
    """One ResourceService per manifest, each with its own link to Redis and its shared cache."""
    services: list[ResourceService] = []
    links: list[RedisLink] = []
    try:
        for path in manifests:
            service = await ResourceService.open(path)
            services.append(service)
            settings = service.manifest.server.cluster
            assert settings is not None
            links.append(link := RedisLink(settings))
            service.shared = SharedContent(link)
        yield services
    finally:
        for service in services:
            await service.aclose()
        for link in links:
            await link.aclose()


def shared(service: ResourceService) -> SharedContent:
    assert service.shared is not None
    return service.shared


def three(tmp_path: Path, upstream: Upstream, redis_url: str, prefix: str, cluster: str = "",
          timeout: str = "5s") -> list[Path]:
    return [manifest(tmp_path / f"r{n}", upstream, redis_url, prefix, cluster=cluster, timeout=timeout)
            for n in range(3)]


def test_a_body_one_replica_read_is_served_to_the_others_without_upstream_calls(
        tmp_path: Path, upstream: Upstream, redis_url: str, prefix: str) -> None:
    async def main() -> None:
        async with replicas(*three(tmp_path, upstream, redis_url, prefix)) as (a, b, c):
            first = (await a.read("api://a")).content
            assert first.text == upstream.body and first.mime_type == "text/markdown"
            for other in (b, c):
                content = (await other.read("api://a")).content
                assert (content.text, content.mime_type) == (first.text, first.mime_type)
            binary = (await a.read("api://blob")).content
            assert (await b.read("api://blob")).content.blob == binary.blob
            assert shared(b).hits == 2 and shared(c).hits == 1 and shared(a).stores == 2

    anyio.run(main)
    assert upstream.hits["GET docs/a.md"] == 1
    assert upstream.hits["GET blob"] == 1


@pytest.mark.parametrize("single_flight", [True, False])
def test_a_cold_herd_across_replicas_costs_one_upstream_get_with_single_flight(
        tmp_path: Path, upstream: Upstream, redis_url: str, prefix: str, single_flight: bool) -> None:
    """50 concurrent cold reads over 3 replicas: each replica's own cache lets one through, and the Redis lock makes
    those three one upstream GET; without it, every replica goes upstream (docs/a.md answers after 50 ms, so the
    three loads overlap)."""
    paths = three(tmp_path, upstream, redis_url, prefix, cluster=f", singleFlight: {str(single_flight).lower()}")

    async def main() -> None:
        async with replicas(*paths) as services:
            texts: list[str | None] = []

            async def read(n: int) -> None:
                texts.append((await services[n % 3].read("api://a")).content.text)

            async with anyio.create_task_group() as tg:
                for n in range(50):
                    tg.start_soon(read, n)
            assert texts == [upstream.body] * 50
            if single_flight:  # one replica loaded, the two others waited for the lock and read its copy
                assert [sum(shared(s).misses for s in services), sum(shared(s).hits for s in services)] == [1, 2]

    anyio.run(main)
    if single_flight:
        assert upstream.hits["GET docs/a.md"] == 1
    else:
        assert upstream.hits["GET docs/a.md"] > 1


def test_forget_sends_the_next_read_upstream(tmp_path: Path, upstream: Upstream, redis_url: str,
                                             prefix: str) -> None:
    async def main() -> None:
        async with replicas(*three(tmp_path, upstream, redis_url, prefix)) as (a, b, c):
            await a.read("api://a")
            await b.read("api://a")
            assert upstream.hits["GET docs/a.md"] == 1
            upstream.body, upstream.etag = "# A\n\nsecond version\n", '"v2"'
            await a.forget_shared("api", ["docs/a.md"])
            assert (await c.read("api://a")).content.text == upstream.body  # c had no local copy
            assert upstream.hits["GET docs/a.md"] == 2
            a.invalidate("api", ["docs/a.md"])  # what a change event does to each replica's own cache
            assert (await a.read("api://a")).content.text == upstream.body
            assert upstream.hits["GET docs/a.md"] == 2  # c stored the new body

    anyio.run(main)


def test_a_load_under_way_when_forgotten_does_not_store_the_old_body(tmp_path: Path, upstream: Upstream,
                                                                   redis_url: str, prefix: str) -> None:
    """`gated` answers only when the test says: the forget lands while a's read is in flight."""
    async def main() -> None:
        async with replicas(*three(tmp_path, upstream, redis_url, prefix)[:2]) as (a, b):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.read, "api://raw/gated")
                with anyio.fail_after(10):
                    while upstream.hits["GET gated"] == 0:
                        await anyio.sleep(0.01)
                await b.forget_shared("api", ["gated"])
                upstream.gate.set()
            assert shared(a).stores == 0 and shared(a).skipped == 1
            await b.read("api://raw/gated")
            assert upstream.hits["GET gated"] == 2

    anyio.run(main)


def test_a_cancelled_leader_frees_the_single_flight_lock(tmp_path: Path, upstream: Upstream, redis_url: str,
                                                        prefix: str) -> None:
    """Cancelled mid-load (a client gone, a shutdown), the leader still deletes its lock: the others need not wait
    for it to expire."""
    import redis

    async def main() -> None:
        async with replicas(manifest(tmp_path, upstream, redis_url, prefix)) as (a,):
            client = redis.Redis.from_url(redis_url)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(a.read, "api://raw/gated")
                    with anyio.fail_after(10):
                        while upstream.hits["GET gated"] == 0:
                            await anyio.sleep(0.01)
                    assert len(list(client.scan_iter(match=f"{prefix}:lock:*"))) == 1
                    tg.cancel_scope.cancel()
                assert list(client.scan_iter(match=f"{prefix}:lock:*")) == []
            finally:
                upstream.gate.set()
                client.close()

    anyio.run(main)


def test_too_large_and_private_bodies_are_not_stored(tmp_path: Path, upstream: Upstream, redis_url: str,
                                                     prefix: str) -> None:
    paths = three(tmp_path, upstream, redis_url, prefix, cluster=", sharedCacheMaxBytes: 100")

    async def main() -> None:
        async with replicas(*paths[:2]) as (a, b):
            await a.read("api://blob")  # 1024 bytes
            await b.read("api://blob")
            assert shared(a).skipped == 1 and shared(a).stores == 0
            # Private content (an MCP upstream's cacheScope private) depends on who asked: never shared.
            cluster = shared(a)
            item = cluster.file_item(a.manifest.sources["api"], "private.md", None, False, 1000, 60)
            calls = 0

            async def load() -> tuple[Content, str | None]:
                nonlocal calls
                calls += 1
                return Content("text/plain", text="for one caller", private=True), None

            for service in (a, b):
                content, _ = await shared(service).load(item, load)
                assert content.text == "for one caller" and content.private
            assert calls == 2 and shared(b).skipped == 2  # the blob, then this

    anyio.run(main)
    assert upstream.hits["GET blob"] == 2


def test_replicas_share_by_source_settings_never_by_source_id(tmp_path: Path, upstream: Upstream, redis_url: str,
                                                               prefix: str) -> None:
    """Other headers (another token): another backend view, nothing shared. Same settings under another id: shared."""
    same = manifest(tmp_path / "a", upstream, redis_url, prefix)
    other_token = manifest(tmp_path / "b", upstream, redis_url, prefix, headers="Authorization: 'Bearer other'")
    other_id = manifest(tmp_path / "c", upstream, redis_url, prefix, source_id="docs")

    async def main() -> None:
        async with replicas(same, other_token, other_id) as (a, b, c):
            await a.read("api://a")
            await b.read("api://a")
            assert upstream.hits["GET docs/a.md"] == 2 and shared(b).misses == 1
            await c.read("api://a")
            assert upstream.hits["GET docs/a.md"] == 2 and shared(c).hits == 1

    anyio.run(main)


def test_a_corrupt_or_foreign_value_is_ignored_deleted_and_counted(tmp_path: Path, upstream: Upstream,
                                                                   redis_url: str, prefix: str) -> None:
    import redis

    async def main() -> None:
        async with replicas(*three(tmp_path, upstream, redis_url, prefix)[:2]) as (a, b):
            await a.read("api://a")
            client = redis.Redis.from_url(redis_url)
            try:
                [key] = [k for k in client.scan_iter(match=f"{prefix}:content:*") if not k.endswith(b":gen")]
                [field] = client.hkeys(key)
                for bad in (b"not ours at all", MAGIC + b'{"mime":"text/plain"}\n' + b"x",
                            MAGIC + b'{"mime":"text/plain","text":true,"version":null,"maxAge":null,'
                                    b'"expires":9e99,"size":9}\nshort',
                            MAGIC + b'{"mime":"text/plain","text":true,"version":null,"maxAge":null,'
                                    b'"expires":9e99,"size":2}\n\xff\xfe',
                            MAGIC + b"[" * 100_000 + b"\nx"):  # nested past the parser's recursion limit
                    client.hset(key, field, bad)
                    b.cache.clear()
                    assert (await b.read("api://a")).content.text == upstream.body
                    assert client.hget(key, field).startswith(MAGIC + b'{"mime":"text/markdown"')  # b stored it
            finally:
                client.close()
            assert shared(b).rejected == 5

    anyio.run(main)
    assert upstream.hits["GET docs/a.md"] == 6


def test_key_names_and_values_hold_no_url_path_or_secret(tmp_path: Path, upstream: Upstream, redis_url: str,
                                                         prefix: str) -> None:
    import redis

    async def main() -> None:
        async with replicas(manifest(tmp_path, upstream, redis_url, prefix)) as (a,):
            await a.read("api://a")
            await a.read("api://raw/weather")
            await a.forget_shared("api", ["blob"])

    anyio.run(main)
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        assert len(keys) == 3  # two files and the forget counter
        names = b" ".join(keys) + b" ".join(f for k in keys if client.type(k) == b"hash" for f in client.hkeys(k))
        for secret in (b"127.0.0.1", str(upstream.port).encode(), b"base", b"docs", b"a.md", b"weather",
                       b"blob", TOKEN.encode(), b"api"):
            assert secret not in names, (secret, keys)
        values = b"".join(v for k in keys if client.type(k) == b"hash" for v in client.hvals(k))
        assert TOKEN.encode() not in values
    finally:
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server on a free port (the test kills and restarts it: never the shared one)."""
    with redis_server(tmp_path) as server:
        yield server


def test_redis_down_reads_still_work_errors_counted_outage_logged_once(
        tmp_path: Path, upstream: Upstream, own_redis: RedisServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_cache, "RETRY_AFTER", 0.2)
    port = own_redis.port
    paths = three(tmp_path, upstream, f"redis://127.0.0.1:{port}/0", "test")
    caplog.set_level(logging.INFO, logger="aggregator.cluster.shared_cache")

    def outage_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "aggregator.cluster.shared_cache"]

    async def main() -> None:
        async with replicas(*paths[:2]) as (a, b):
            await a.read("api://a")
            assert shared(a).stores == 1
            own_redis.kill()
            for _ in range(5):  # over several retry windows: each retry fails again, the outage is logged once
                b.cache.clear()
                assert (await b.read("api://a")).content.text == upstream.body
                await anyio.sleep(0.25)
            assert shared(b).errors >= 2 and not shared(b).available
            assert len(outage_lines()) == 1 and f"127.0.0.1:{port}" in outage_lines()[0]
            assert "redis://" not in outage_lines()[0]
            own_redis.start()  # back, empty
            # A connection Redis dropped may fail the first call after the restart; the next retry reconnects.
            for service, done in ((b, lambda: shared(b).stores == 1), (a, lambda: shared(a).hits == 1)):
                with anyio.fail_after(10):
                    while not done():
                        await anyio.sleep(0.25)
                        service.cache.clear()
                        assert (await service.read("api://a")).content.text == upstream.body
                assert shared(service).available
            lines = outage_lines()
            assert "back" in lines[-1] and all("back" in line or "failed" in line for line in lines)

    anyio.run(main)


def test_forgets_owed_past_the_cap_become_one_forget_of_the_whole_source(
        tmp_path: Path, upstream: Upstream, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis stalls while a busy source changes: the forgets it cannot take are owed, at most MAX_OWED_KEYS keys a
    source; past that the source owes one forget of everything it stored, done when Redis is back (a body of
    a file never named is dropped too; none is served stale)."""
    monkeypatch.setattr(shared_cache, "MAX_OWED_KEYS", 5)
    monkeypatch.setattr(shared_cache, "RETRY_AFTER", 0.2)
    paths = three(tmp_path, upstream, f"redis://127.0.0.1:{own_redis.port}/0", "test", timeout="0.3s")

    async def main() -> None:
        async with replicas(*paths[:2]) as (a, b):
            await a.read("api://a")
            await a.read("api://blob")
            assert shared(a).stores == 2 and upstream.hits["GET blob"] == 1
            await anyio.to_thread.run_sync(own_redis.pause, 1500)
            started = anyio.current_time()
            upstream.body, upstream.etag = "# A\n\nchanged while Redis stalled\n", '"v2"'
            for batch in range(4):
                await a.forget_shared("api", [f"docs/n{batch}-{i}.md" for i in range(3)] + ["docs/a.md"])
            assert shared(a).owed() == (0, 1)  # no keys kept: the whole source is owed
            await anyio.sleep(max(0.0, started + 1.6 - anyio.current_time()))
            await shared(a).settle()
            assert shared(a).owed() == (0, 0)
            assert (await b.read("api://a")).content.text == upstream.body
            await b.read("api://blob")
            assert upstream.hits["GET blob"] == 2  # dropped with the rest of the source

    anyio.run(main)


def test_no_redis_at_all_reads_work_and_wait_for_nothing(tmp_path: Path, upstream: Upstream,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A port nothing listens on: every read loads by itself; later reads within the retry window skip Redis."""
    path = manifest(tmp_path, upstream, f"redis://:hunter2@127.0.0.1:{free_port()}/0", "test")
    caplog.set_level(logging.INFO, logger="aggregator.cluster.shared_cache")

    async def main() -> None:
        async with replicas(path) as (a,):
            for _ in range(3):
                a.cache.clear()
                assert (await a.read("api://a")).content.text == upstream.body
            assert shared(a).errors == 1  # the first failure opened the retry window

    anyio.run(main)
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.cluster.shared_cache"]
    assert len(lines) == 1 and "hunter2" not in lines[0]


def test_three_serve_replicas_answer_a_cold_herd_of_50_reads_with_one_upstream_get(
        tmp_path: Path, upstream: Upstream, redis_url: str, prefix: str) -> None:
    """End to end: three `serve --http` processes on one Redis, 50 concurrent reads spread over them through the
    official client (one replica on the legacy wire, two on the modern one)."""
    from mcp import Client

    path = manifest(tmp_path, upstream, redis_url, prefix)
    with serve_replicas(path, 3, tmp_path) as group:
        async def main() -> None:
            async with (Client(group[0].url, mode="legacy", cache=None) as one,
                        Client(group[1].url, mode="auto", cache=None) as two,
                        Client(group[2].url, mode="auto", cache=None) as three):
                clients = (one, two, three)
                texts: list[str] = []

                async def read(n: int) -> None:
                    result = await clients[n % 3].read_resource("api://a")
                    texts.append(getattr(result.contents[0], "text", ""))

                async with anyio.create_task_group() as tg:
                    for n in range(50):
                        tg.start_soon(read, n)
                assert texts == [upstream.body] * 50

        anyio.run(main)
        scraped = [replica.metrics() for replica in group]
        assert all('aggregator_shared_cache_total{result="hit"}' in text for text in scraped)
        assert sum('aggregator_shared_cache_total{result="store"} 1.0' in text for text in scraped) == 1
    assert upstream.hits["GET docs/a.md"] == 1


def test_query_results_are_shared_per_parameters_and_forgotten_with_the_data(
        tmp_path: Path, redis_url: str, prefix: str) -> None:
    """A changed row proves where b's answer came from: the shared copy until the source's data is forgotten."""
    import sqlalchemy

    url = f"sqlite:///{tmp_path / 'crm.db'}"
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR(100))"))
        conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (1, 'Ada'), (2, 'Grace')"))
    paths = [write_manifest(tmp_path / f"r{n}", f"""
        version: 1
        server:
          name: replica
          cluster: {{redis: "{redis_url}", prefix: "{prefix}"}}
        sources:
          crm: {{url: "{url}", tables: ["customers"]}}
        templates:
          - {{uriTemplate: "db://crm/customers/{{id}}", name: customer, source: crm,
             query: "SELECT id, name FROM customers WHERE id = :id"}}
        """) for n in range(2) if (tmp_path / f"r{n}").mkdir() is None]

    async def main() -> None:
        async with replicas(*paths) as (a, b):
            assert "Ada" in ((await a.read("db://crm/customers/1")).content.text or "")
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text("UPDATE customers SET name = 'Ada L.' WHERE id = 1"))
            assert "Ada L." not in ((await b.read("db://crm/customers/1")).content.text or "")
            assert "Grace" in ((await b.read("db://crm/customers/2")).content.text or "")  # its own parameters
            assert shared(b).hits == 1 and shared(b).misses == 1
            await a.forget_shared("crm", [], data=True)
            b.cache.clear()
            assert "Ada L." in ((await b.read("db://crm/customers/1")).content.text or "")

    try:
        anyio.run(main)
    finally:
        engine.dispose()


def test_local_folders_are_never_shared(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """Each replica has its own copy of a local folder (a ConfigMap, a git-sync volume): nothing goes to Redis."""
    import redis

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    path = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: replica
          cluster: {{redis: "{redis_url}", prefix: "{prefix}"}}
        sources:
          docs: {{url: "./docs"}}
        resources:
          - {{uri: "docs://a", name: a, source: docs, path: a.md}}
        """)

    async def main() -> None:
        async with replicas(path) as (a,):
            assert (await a.read("docs://a")).content.text == "# A\n"
            assert shared(a).counts() == dict.fromkeys(shared(a).counts(), 0)

    anyio.run(main)
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
    finally:
        client.close()


def test_a_paused_redis_delays_reads_by_its_timeout_and_never_fails_them(
        tmp_path: Path, upstream: Upstream, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`CLIENT PAUSE`: Redis accepts but does not answer; each call gives up after `timeout` and the read goes on."""
    paths = three(tmp_path, upstream, own_redis.url, "test", timeout="200ms")
    own_redis.pause(5000)

    async def main() -> None:
        async with replicas(*paths[:2]) as (a, b):
            with anyio.fail_after(30):
                for service in (a, b):
                    assert (await service.read("api://a")).content.text == upstream.body
            assert shared(a).errors >= 1 and not shared(a).available

    anyio.run(main)
    assert upstream.hits["GET docs/a.md"] == 2


def test_an_s3_object_one_replica_read_is_served_to_the_other_from_redis(tmp_path: Path, redis_url: str,
                                                                          prefix: str) -> None:
    """moto's S3 server: the object changes after a's read; b serves a's copy until the file is forgotten. No key
    name holds the bucket, the object key or the credentials."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import redis

    from tests.test_sources_s3 import start_store

    store = start_store()
    store.client.create_bucket(Bucket="shared-tests")
    store.client.put_object(Bucket="shared-tests", Key="latest/r1.md", Body=b"# Report 1\n")
    paths = [write_manifest(tmp_path / f"r{n}", f"""
        version: 1
        server:
          name: replica
          cluster: {{redis: "{redis_url}", prefix: "{prefix}"}}
        sources:
          reports:
            url: "s3://shared-tests/latest"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{store.endpoint}"}}
            ttl: 1m
        resources:
          - {{uri: "reports://r1", name: r1, source: reports, path: r1.md}}
        """) for n in range(2) if (tmp_path / f"r{n}").mkdir() is None]

    async def main() -> None:
        async with replicas(*paths) as (a, b):
            assert (await a.read("reports://r1")).content.text == "# Report 1\n"
            store.client.put_object(Bucket="shared-tests", Key="latest/r1.md", Body=b"# Report 1, edited\n")
            assert (await b.read("reports://r1")).content.text == "# Report 1\n"
            assert shared(b).hits == 1
            await a.forget_shared("reports", ["r1.md"])
            b.cache.clear()
            assert (await b.read("reports://r1")).content.text == "# Report 1, edited\n"

    try:
        anyio.run(main)
        client = redis.Redis.from_url(redis_url)
        try:
            names = b" ".join(client.scan_iter(match=f"{prefix}:*"))
        finally:
            client.close()
        for secret in (b"shared-tests", b"latest", b"r1", b"test-key", b"test-secret-value", b"reports"):
            assert secret not in names
    finally:
        store.stop()
