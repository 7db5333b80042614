"""A remote source's poll costs the change, not the catalog (issue 26): S3 (moto's threaded server on loopback) and
HTTP (tests/http_server.py) sources polled beside a local folder, the official client in process on both wires. An
object that changed sends `updated` to its subscribers only; one that came or went updates the listing in place and
sends list_changed; no poll lists the catalog again (the folder's walks and the full relists are counted)."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.sources.progress import LISTINGS
from tests.conftest import MODES, write_manifest
from tests.http_server import serve
from tests.test_live import QUIET, SOON, Inbox, uris
from tests.test_live_inprocess import running

pytest.importorskip("moto.server", reason="moto[server] is not installed")
from tests.test_sources_s3 import Store, start_store  # noqa: E402

OBJECTS = 300
POLL = "200ms"


@pytest.fixture
def store() -> Iterator[Store]:
    store = start_store()
    yield store
    store.stop()


@asynccontextmanager
async def heard(server: Any, mode: str, subscribed: str) -> AsyncIterator[tuple[Client, Inbox]]:
    """A client and what it hears: list_changed and `updated` of `subscribed`, on the legacy or the modern wire."""
    inbox = Inbox()
    if mode == "legacy":
        async with Client(server, mode="legacy", cache=None, message_handler=inbox) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource(subscribed)
            yield client, inbox
        return
    async with Client(server, mode="auto", cache=None) as client, client.listen(
            resources_list_changed=True, resource_subscriptions=[subscribed]) as sub:

        async def collect() -> None:
            async for event in sub:
                if isinstance(event, ResourcesListChanged):
                    inbox.events.append(("list_changed", None))
                elif isinstance(event, ResourceUpdated):
                    inbox.events.append(("updated", event.uri))
                inbox.arrived.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            yield client, inbox
            tg.cancel_scope.cancel()


POLL_FOUND = 30.0
"""Seconds to wait for what a poll finds (an upper bound, not a timing: the wait ends when the event comes)."""


def _folder(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")


@pytest.mark.parametrize("mode", MODES)
def test_an_s3_poll_updates_the_entries_that_changed_and_lists_nothing_else(tmp_path: Path, store: Store,
                                                                            mode: str) -> None:
    s3, bucket = store.client, f"polled-{mode}"  # moto's buckets are shared by the whole process
    s3.create_bucket(Bucket=bucket)
    for i in range(OBJECTS):
        s3.put_object(Bucket=bucket, Key=f"d/obj-{i:04}.md", Body=b"# v1\n")
    _folder(tmp_path)
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: s3-poll}}
        sources:
          store:
            url: "s3://{bucket}/d"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{store.endpoint}"}}
            poll: {POLL}
          docs: {{url: ./docs}}
        collections:
          - {{source: store, glob: "**/*.md", uri: "s3://{{path}}"}}
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        """)

    async def main() -> None:
        async with running(manifest) as (server, live):
            async with heard(server, mode, "s3://obj-0001.md") as (client, inbox):
                assert len(await uris(client)) == OBJECTS + 1
                await anyio.sleep(0.6)  # polls ran: nothing changed, nothing said
                assert await inbox.next(0.1) is None
                walks, relists = LISTINGS["docs"], live.file_changes["relist"]
                polls = LISTINGS["store"]

                s3.put_object(Bucket=bucket, Key="d/obj-0001.md", Body=b"# v2, longer\n")
                # A poll lists 300 objects from moto, served by this test process: on a loaded machine that takes
                # longer than SOON, so the waits for what a poll finds are generous (they end at the event).
                assert await inbox.next(POLL_FOUND) == ("updated", "s3://obj-0001.md")
                assert await inbox.next(QUIET) is None  # a changed object is no listing change
                with anyio.fail_after(SOON):  # the entry follows once the poll's listing is in
                    while {r.uri: r.size for r in (await client.list_resources()).resources}[
                            "s3://obj-0001.md"] != len(b"# v2, longer\n"):
                        await anyio.sleep(0.05)
                assert (await client.read_resource("s3://obj-0001.md")).contents[0].text == "# v2, longer\n"

                s3.put_object(Bucket=bucket, Key="d/new.md", Body=b"# new\n")
                assert await inbox.next(POLL_FOUND) == ("list_changed", None)
                s3.delete_object(Bucket=bucket, Key="d/obj-0002.md")
                assert await inbox.next(POLL_FOUND) == ("list_changed", None)
                listed = await uris(client)
                assert "s3://new.md" in listed and "s3://obj-0002.md" not in listed
                assert len(listed) == OBJECTS + 1

                assert LISTINGS["store"] > polls  # the store was polled by listing it ...
                assert LISTINGS["docs"] == walks  # ... and the folder beside it was never walked again
                assert live.file_changes["relist"] == relists == 0
                assert live.file_changes["incremental"] >= 3
            fresh = await ResourceService.open(manifest)
            try:
                assert list(fresh.catalog.entries) == list(live.service.catalog.entries)
            finally:
                await fresh.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_change_between_subscribing_and_the_next_poll_is_heard(tmp_path: Path, store: Store, mode: str) -> None:
    """The first poll after a subscription has no version of its own to compare with: what the catalog listed is the
    baseline, so an object changed before that poll is told, once (with `poll: 1h` the test runs the polls)."""
    s3, bucket = store.client, f"first-poll-{mode}"
    s3.create_bucket(Bucket=bucket)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"d/obj-{i}.md", Body=b"# v1\n")
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: first-poll}}
        sources:
          store:
            url: "s3://{bucket}/d"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{store.endpoint}"}}
            poll: 1h
        collections:
          - {{source: store, glob: "**/*.md", uri: "s3://{{path}}"}}
        """)

    async def main() -> None:
        async with running(manifest) as (server, live):
            async with heard(server, mode, "s3://obj-1.md") as (client, inbox):
                pollers, seen = live._pollers, {}
                await pollers.poll_once("store", seen)  # subscribed before the change: nothing to tell yet
                assert await inbox.next(QUIET) is None
                seen.clear()  # a subscription newer than the last poll: the poll has no version of it yet
                s3.put_object(Bucket=bucket, Key="d/obj-1.md", Body=b"# v2, longer\n")
                await pollers.poll_once("store", seen)
                assert await inbox.next(SOON) == ("updated", "s3://obj-1.md")
                await pollers.poll_once("store", seen)  # told once: the next poll has nothing new
                assert await inbox.next(QUIET) is None
                assert (await client.read_resource("s3://obj-1.md")).contents[0].text == "# v2, longer\n"

                s3.put_object(Bucket=bucket, Key="d/obj-1.md", Body=b"# v3, longer still\n")
                await pollers.poll_once("store", seen)  # a poll that has a version of it tells it as ever ...
                assert await inbox.next(SOON) == ("updated", "s3://obj-1.md")
                await pollers.poll_once("store", seen)
                assert await inbox.next(QUIET) is None  # ... once

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_http_poll_sends_updated_for_the_changed_object_only(tmp_path: Path, mode: str) -> None:
    _folder(tmp_path)
    with serve() as upstream:
        upstream.files = {f"r/{i}.md": b"# v1\n" for i in range(50)}
        resources = "".join(f'  - {{uri: "api://{i}", name: r{i}, source: api, path: r/{i}.md, mimeType: text/markdown}}\n'
                            for i in range(50))
        manifest = write_manifest(tmp_path, f"""
version: 1
server: {{name: http-poll}}
sources:
  api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, poll: {POLL}}}
  docs: {{url: ./docs}}
collections:
  - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
resources:
{resources}""")

        async def main() -> None:
            async with running(manifest) as (server, live):
                async with heard(server, mode, "api://7") as (client, inbox):
                    assert (await client.read_resource("api://7")).contents[0].text == "# v1\n"
                    await anyio.sleep(0.6)
                    walks = LISTINGS["docs"]
                    upstream.files["r/7.md"] = b"# v2\n"
                    upstream.files["r/8.md"] = b"# v2\n"  # not subscribed: nobody is told
                    assert await inbox.next(SOON) == ("updated", "api://7")
                    assert await inbox.next(QUIET) is None
                    assert (await client.read_resource("api://7")).contents[0].text == "# v2\n"
                    assert LISTINGS["docs"] == walks and live.file_changes["relist"] == 0

        anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_resource_changed_after_subscribing_is_told_by_the_next_poll(tmp_path: Path, mode: str) -> None:
    """A subscription takes the resource's version at once (not at the next poll, which may be an interval away):
    a change made between the two is told by that poll. `poll: 1h`: the test runs the poll."""
    with serve() as upstream:
        upstream.files = {"r/1.md": b"# v1\n", "r/2.md": b"# v1\n"}
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: subscribe-poll}}
            sources:
              api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, poll: 1h}}
            resources:
              - {{uri: "api://1", name: r1, source: api, path: r/1.md}}
              - {{uri: "api://2", name: r2, source: api, path: r/2.md}}
            """)

        async def main() -> None:
            async with running(manifest) as (server, live):
                stats = upstream.hits["HEAD r/1.md"]  # the listing's
                async with heard(server, mode, "api://1") as (client, inbox):
                    with anyio.fail_after(SOON):  # the subscription's version is taken, not a poll's
                        while upstream.hits["HEAD r/1.md"] == stats:
                            await anyio.sleep(0.02)
                    upstream.files["r/1.md"] = b"# v2\n"
                    upstream.files["r/2.md"] = b"# v2\n"  # not subscribed: nobody is told
                    await live._pollers.poll_once("api", live._pollers.seen["api"])
                    assert await inbox.next(SOON) == ("updated", "api://1")
                    assert await inbox.next(QUIET) is None

        anyio.run(main)


@pytest.mark.parametrize("seed", range(3))
def test_random_changes_applied_by_polls_equal_a_fresh_listing(tmp_path: Path, seed: int) -> None:
    """Objects added, rewritten and deleted at random between polls (an fsspec memory store, two overlapping
    collections and a resource over it): after every poll the catalog equals a fresh load, with no full relist."""
    import random

    import fsspec

    rng, root = random.Random(seed), f"/poll-random-{seed}"
    fs = fsspec.filesystem("memory")
    names = [f"{folder}/{i}.{ext}" for folder in ("a", "a/b", "c") for i in range(6) for ext in ("md", "txt")]
    fs.pipe({f"{root}/{name}": b"x" * rng.randrange(1, 9) for name in rng.sample(names, 12)})
    fs.pipe_file(f"{root}/a/0.md", b"kept")
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: random-polls}}
        sources:
          mem: {{url: "memory://{root}"}}
        collections:
          - {{source: mem, glob: "**/*.md", uri: "md://{{path}}", annotations: {{lastModified: file}}}}
          - {{source: mem, glob: "a/**", uri: "a://{{path}}", access: {{scopes: [staff]}}}}
        resources:
          - {{uri: "one://a0", name: a0, source: mem, path: a/0.md}}
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        updates = CatalogUpdates(service, Notifier())
        try:
            for _ in range(15):
                for name in rng.sample(names, 4):
                    if rng.random() < 0.4 and fs.exists(f"{root}/{name}"):
                        fs.rm_file(f"{root}/{name}")
                    else:
                        fs.pipe_file(f"{root}/{name}", b"y" * rng.randrange(1, 9))
                await updates.source_polled("mem")
                fresh = await ResourceService.open(manifest)
                try:
                    assert list(service.catalog.entries) == list(fresh.catalog.entries)
                finally:
                    await fresh.aclose()
            assert updates.full_relists == 0 and updates.incremental_relists > 0
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_store_that_cannot_be_listed_keeps_its_last_listing(tmp_path: Path, store: Store,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Polls during an outage change nothing and say so once: an optional source too keeps its last listing (a
    reload, not a poll, would list it empty)."""
    store.client.create_bucket(Bucket="outage")
    store.client.put_object(Bucket="outage", Key="d/a.md", Body=b"# a\n")
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: s3-outage}}
        sources:
          store:
            url: "s3://outage/d"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{store.endpoint}",
                       config_kwargs: {{retries: {{max_attempts: 1}}}}}}
            timeout: 1s
            optional: true
        collections:
          - {{source: store, glob: "**/*.md", uri: "s3://{{path}}"}}
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        updates = CatalogUpdates(service, Notifier())
        try:
            listed = service.catalog
            store.stop()
            for _ in range(2):
                assert await updates.source_polled("store") is None
            assert service.catalog is listed and [e.uri for e in listed.entries] == ["s3://a.md"]
            assert caplog.text.count("cannot be listed") == 1
        finally:
            await service.aclose()

    anyio.run(main)


def test_replicas_follow_a_polled_listing_by_listing_that_source_alone(tmp_path: Path, store: Store) -> None:
    """Two replicas on one Redis: the lease holder's poll sees an object come and go and publishes a listing event;
    the other lists that source itself. Both tell their sessions list_changed and list what the store holds, and
    neither compiles its catalog again (the folder beside the store is walked once, at start)."""
    from tests.cluster_redis import delete_prefix, require_shared, unique_prefix
    from tests.replicas import metric_sum, replicas

    url, prefix = require_shared(), unique_prefix()
    store.client.create_bucket(Bucket="replicated")
    store.client.put_object(Bucket="replicated", Key="d/a.md", Body=b"# a\n")
    _folder(tmp_path)
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: replicas
          cluster: {{redis: "{url}", prefix: {prefix}, timeout: 500ms}}
        sources:
          store:
            url: "s3://replicated/d"
            options: {{key: test-key, secret: test-secret-value, endpoint_url: "{store.endpoint}"}}
            poll: 300ms
          docs: {{url: ./docs}}
        collections:
          - {{source: store, glob: "**/*.md", uri: "s3://{{path}}"}}
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        """)
    try:
        with replicas(manifest, 2, tmp_path) as group:
            async def main() -> None:
                inboxes = [Inbox() for _ in group]
                async with AsyncExitStack() as stack:
                    clients = [await stack.enter_async_context(Client(r.url, mode="legacy", cache=None,
                                                                       message_handler=inbox))
                               for r, inbox in zip(group, inboxes, strict=True)]
                    with anyio.fail_after(15):
                        while not all(r.health()["cluster"]["connected"] for r in group):
                            await anyio.sleep(0.1)
                    await anyio.sleep(1.5)  # the lease taken, the first polls in
                    for change, listed in [(lambda: store.client.put_object(Bucket="replicated", Key="d/b.md",
                                                                            Body=b"# b\n"), ["s3://a.md", "s3://b.md"]),
                                           (lambda: store.client.delete_object(Bucket="replicated", Key="d/a.md"),
                                            ["s3://b.md"])]:
                        change()
                        for client, inbox in zip(clients, inboxes, strict=True):
                            assert await inbox.next(SOON) == ("list_changed", None)
                            assert [u for u in await uris(client) if u.startswith("s3://")] == listed
                    for replica in group:
                        figures = replica.metrics()
                        assert metric_sum(figures, "aggregator_file_changes_total", how="relist") == 0
                        assert metric_sum(figures, "aggregator_source_listings_total", source="docs") == 1
                    assert sum(metric_sum(r.metrics(), "aggregator_cluster_events_total", direction="published")
                               for r in group) >= 2

            anyio.run(main)
    finally:
        delete_prefix(url, prefix)
