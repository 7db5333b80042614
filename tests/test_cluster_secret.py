"""`server.cluster.secret` (issue 24 item 12): what replicas write to Redis is sealed with an HMAC, so whoever can
write the Redis database but lacks the secret cannot make a replica serve content of their choosing or tell
listeners of changes that never happened. Real replicas (`serve --http` subprocesses) on the shared Redis (a unique
prefix per test), a private redis-server for the ACL example, the official client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from aggregator.cluster.bus import ChangeBus, ChangeEvent
from aggregator.cluster.leases import PollLeases
from aggregator.cluster.link import RedisLink
from aggregator.cluster.seal import SEALED, Seal, Unsealed
from aggregator.cluster.shared_cache import MAGIC
from aggregator.manifest import ManifestError, parse_manifest
from aggregator.manifest.model import ClusterSettings
from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
from tests.conftest import write_manifest
from tests.http_server import Upstream, serve
from tests.replicas import metric_sum, redis_server, replicas

SECRET = "s3cret-" + "0123456789abcdef" * 3
URI = "api://a"
INTERVAL = 0.3


def _manifest(folder: Path, upstream: Upstream, redis: str, prefix: str, secret: bool) -> Path:
    sealed = ', secret: "${CLUSTER_SECRET}"' if secret else ""
    return write_manifest(folder, f"""
        version: 1
        server:
          name: sealed
          cluster: {{redis: "{redis}", prefix: {prefix}{sealed}}}
        sources:
          api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, poll: {int(INTERVAL * 1000)}ms,
                 ttl: 10m}}
        resources:
          - {{uri: "{URI}", name: a, source: api, path: docs/a.md}}
        """)


def _sync_redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


async def _until(condition: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


def _forge(url: str, prefix: str, body: bytes) -> str:
    """What anyone who can write Redis can do: put a well-formed value, holding `body`, in every field of the
    shared cache's file hashes, and publish an `updated` for that file. Returns the source fingerprint."""
    client = _sync_redis(url)
    try:
        keys = [k.decode() for k in client.scan_iter(match=f"{prefix}:content:*:f:*", count=500)]
        assert keys, "nothing was stored in the shared cache"
        header = {"mime": "text/markdown", "text": True, "version": '"forged"', "maxAge": None,
                  "expires": time.time() + 600, "size": len(body)}
        value = MAGIC + json.dumps(header).encode() + b"\n" + body
        for key in keys:
            for field in client.hkeys(key):
                client.hset(key, field, value)
        fingerprint = keys[0].split("{", 1)[1].split("}", 1)[0]
        event = ChangeEvent("intruder", "d", fingerprint, ("docs/a.md",), versions={"docs/a.md": '"forged"'})
        client.publish(f"{prefix}:changes", event.encode())
        return fingerprint
    finally:
        client.close()


@pytest.mark.parametrize("secret", [False, True], ids=["no secret: Redis is trusted", "secret"])
def test_a_redis_writer_without_the_secret_cannot_change_what_replicas_serve_or_tell(tmp_path: Path,
                                                                                     secret: bool) -> None:
    """Replica A reads (the body goes to the shared cache); a Redis writer replaces the stored value with a
    well-formed one and publishes an `updated`. Without a secret, B (cold) serves the forged body and A's listener
    hears the forged change: Redis is inside the trust boundary. With `secret`, both are refused (counted in
    aggregator_cluster_unauthenticated_total and deleted), B serves the upstream's body, A's listener hears only
    the next real change."""
    url = require_shared()
    prefix = unique_prefix()
    forged = b"# forged by whoever writes Redis\n"
    with serve() as upstream:
        manifest = _manifest(tmp_path, upstream, url, prefix, secret)
        try:
            with replicas(manifest, 2, tmp_path, env={"CLUSTER_SECRET": SECRET}) as (a, b):
                async def main() -> None:
                    heard: list[Any] = []
                    async with Client(a.url, mode="auto", cache=None) as client_a, \
                            Client(b.url, mode="auto", cache=None) as client_b, \
                            client_a.listen(resource_subscriptions=[URI]) as sub, anyio.create_task_group() as tg:
                        async def collect() -> None:
                            async for event in sub:
                                heard.append(event)

                        tg.start_soon(collect)
                        await _until(lambda: a.health()["cluster"]["connected"] and b.health()["cluster"]["connected"])
                        assert (await client_a.read_resource(URI)).contents[0].text == upstream.body
                        await anyio.sleep(INTERVAL * 4)  # interests written, the holder's first poll kept
                        _forge(url, prefix, forged)
                        await anyio.sleep(INTERVAL * 4)  # the forged event is handled (or refused)
                        text = (await client_b.read_resource(URI)).contents[0].text
                        if not secret:
                            assert text == forged.decode() and heard == [ResourceUpdated(uri=URI)]
                            tg.cancel_scope.cancel()
                            return
                        assert text == upstream.body
                        # The refused value was deleted and B stored the upstream's, sealed.
                        client = _sync_redis(url)
                        try:
                            stored = [v for k in client.scan_iter(match=f"{prefix}:content:*:f:*")
                                      for v in client.hvals(k)]
                        finally:
                            client.close()
                        assert stored and all(v.startswith(SEALED) and forged not in v for v in stored)
                        figures_a, figures_b = a.metrics(), b.metrics()
                        for figures in (figures_a, figures_b):
                            assert metric_sum(figures, "aggregator_cluster_unauthenticated_total", kind="event") == 1
                        assert metric_sum(figures_b, "aggregator_cluster_unauthenticated_total", kind="content") >= 1
                        assert metric_sum(figures_b, "aggregator_shared_cache_total", result="rejected") >= 1
                        # A real change still arrives, once, and is the first thing A's listener hears.
                        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged upstream\n"
                        await _until(lambda: heard)
                        await anyio.sleep(INTERVAL * 3)
                        assert heard == [ResourceUpdated(uri=URI)]
                        assert (await client_b.read_resource(URI)).contents[0].text == upstream.body
                        tg.cancel_scope.cancel()

                anyio.run(main)
            logs = (tmp_path / "replica0.log").read_text() + (tmp_path / "replica1.log").read_text()
            assert SECRET not in logs
            if secret:
                assert "not sealed, and server.cluster.secret is set" in logs
        finally:
            delete_prefix(url, prefix)


@pytest.fixture
def shared() -> Iterator[tuple[str, str]]:
    url = require_shared()
    prefix = unique_prefix()
    yield url, prefix
    delete_prefix(url, prefix)


def test_replicas_with_another_secret_or_none_hear_nothing_of_each_other(shared: tuple[str, str]) -> None:
    url, prefix = shared

    async def main() -> None:
        links = {name: RedisLink(ClusterSettings(redis=url, prefix=prefix, secret=secret), name)
                 for name, secret in (("a", SECRET), ("same", SECRET), ("other", SECRET[::-1]), ("none", None))}
        buses = {name: ChangeBus(link) for name, link in links.items()}
        got: dict[str, list[ChangeEvent]] = {name: [] for name in links}
        for name, bus in buses.items():
            bus.listeners.append(got[name].append)
        try:
            async with anyio.create_task_group() as tg:
                for bus in buses.values():
                    tg.start_soon(bus.run)
                await _until(lambda: all(bus.connected for bus in buses.values()))
                event = ChangeEvent("a", "d", "fp", ("a.md",), versions={"a.md": "v1"})
                assert await buses["a"].publish(event)
                await _until(lambda: buses["other"].rejected and buses["none"].rejected and got["same"])
                assert got["same"] == [event] and got["other"] == got["none"] == []
                assert links["other"].seal.refused == {"event": 1} and links["none"].seal.refused == {"event": 1}
                for bus in buses.values():
                    bus.stop()
        finally:
            for link in links.values():
                await link.aclose()

    anyio.run(main)


def test_kept_poll_versions_are_sealed_and_forged_ones_ignored(shared: tuple[str, str]) -> None:
    url, prefix = shared

    async def main() -> None:
        a = PollLeases(RedisLink(ClusterSettings(redis=url, prefix=prefix, secret=SECRET), "a"))
        b = PollLeases(RedisLink(ClusterSettings(redis=url, prefix=prefix, secret=SECRET), "b"))
        try:
            await a.record("fp", {"x.md": '"v1"', None: "rows-7"})
            assert await b.seen("fp") == {"x.md": '"v1"', None: "rows-7"}
            key = a.link.key("versions", "fp")
            stolen = await a.link.client.hget(key, "x.md")
            await a.link.client.hset(key, mapping={"y.md": json.dumps('"forged"'), "z.md": stolen})
            assert await b.seen("fp") == {"x.md": '"v1"', None: "rows-7"}  # unsealed, or sealed for another field
            assert b.link.seal.refused == {"versions": 2}
        finally:
            await a.link.aclose()
            await b.link.aclose()

    anyio.run(main)


def test_a_seal_binds_the_value_to_where_it_lives() -> None:
    seal, other = Seal(SECRET), Seal(SECRET[::-1])
    sealed = seal.close("k\0f", b"body")
    assert sealed.startswith(SEALED) and seal.open("k\0f", sealed, "content") == b"body"
    for where, raw, opener in (("k\0g", sealed, seal), ("k\0f", sealed[:-1] + b"!", seal), ("k\0f", b"body", seal),
                               ("k\0f", sealed[:30], seal), ("k\0f", sealed, other), ("k\0f", sealed, Seal(None))):
        with pytest.raises(Unsealed):
            opener.open(where, raw, "content")
    assert Seal(None).close("k\0f", b"body") == b"body" == Seal(None).open("k\0f", b"body", "content")
    assert seal.refused == {"content": 4} and SECRET not in repr(ClusterSettings(redis="r", secret=SECRET))


def _parse(text: str, env: dict[str, str]) -> Any:
    return parse_manifest(text, "m.yaml", Path("/srv"), env=env)


def test_the_secret_comes_from_the_environment_and_is_never_shown() -> None:
    head = "version: 1\nserver:\n  name: t\n  cluster: {redis: 'redis://r:6379/0', secret: %s}\n"
    with pytest.raises(ManifestError) as err:
        _parse(head % f'"{SECRET}"', {})
    ((issue),) = err.value.issues
    assert (issue.key, issue.line) == ("server.cluster.secret", 4)
    assert "may not be written into the manifest" in issue.message and SECRET not in str(err.value)
    with pytest.raises(ManifestError) as err:
        _parse(head % '"${CLUSTER_SECRET}"', {"CLUSTER_SECRET": "short-secret"})
    assert err.value.issues[0].key == "server.cluster.secret" and "short-secret" not in str(err.value)
    manifest = _parse((head % '"${CLUSTER_SECRET}"').replace("redis://r", "redis://:hunter2@r"),
                      {"CLUSTER_SECRET": SECRET})
    assert manifest.server.cluster.secret == SECRET and SECRET not in repr(manifest) and "hunter2" not in repr(manifest)


def test_the_documented_redis_acl_is_all_a_replica_needs(tmp_path: Path) -> None:
    """README, Safety: a Redis user limited to the deployment's prefix (keys and channels) and the commands the
    replicas use; a replica on it joins the bus, holds the lease, shares content and publishes a change."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = re.search(r"^ *ACL SETUSER aggregator (.+)$", readme, re.M)
    assert found, "README: the ACL SETUSER example is missing"
    rules = found.group(1).replace("docs", "acl-test").replace("PASSWORD", "pw-0123456789").split()
    with serve() as upstream, redis_server(tmp_path) as redis:
        assert redis.cli("ACL", "SETUSER", "aggregator", *rules).strip() == "OK"  # redis-cli exits 0 on errors
        # The default user keeps a password of its own (the test reads the ACL log with it); replicas never use it.
        assert redis.cli("ACL", "SETUSER", "default", ">admin-0123456789").strip() == "OK"
        user_url = redis.url.replace("redis://", "redis://aggregator:pw-0123456789@")
        manifest = _manifest(tmp_path, upstream, user_url, "acl-test", secret=True)
        with replicas(manifest, 1, tmp_path, env={"CLUSTER_SECRET": SECRET}) as (replica,):
            async def main() -> None:
                async with Client(replica.url, mode="auto", cache=None) as client, \
                        client.listen(resource_subscriptions=[URI]) as sub:
                    await _until(lambda: replica.health()["cluster"]["leases"] == 1)
                    assert (await client.read_resource(URI)).contents[0].text == upstream.body
                    await anyio.sleep(INTERVAL * 3)
                    upstream.etag, upstream.body = '"v2"', "# A\n\nchanged\n"
                    with anyio.fail_after(20):
                        assert await sub.__anext__() == ResourceUpdated(uri=URI)
                    figures = replica.metrics()
                    assert metric_sum(figures, "aggregator_shared_cache_total", result="store") >= 1
                    assert metric_sum(figures, "aggregator_shared_cache_total", result="error") == 0
                    assert metric_sum(figures, "aggregator_cluster_events_total", direction="published") == 1

            anyio.run(main)
            refused = redis.cli("-a", "admin-0123456789", "--no-auth-warning", "ACL", "LOG")
            assert refused.strip() == "", refused  # no command or key the replica used was refused
        assert "NOPERM" not in replica.output() and "unavailable" not in replica.output()
