"""The live catalog in one process: polling remote sources, subscription caps and cleanup, renders and templates
updated (manifest reloads: test_live_manifest.py)."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from aggregator.service import ResourceService
from aggregator.supervisor import Supervisor
from aggregator.notify import Notifier
from aggregator.server import build_server
from tests.conftest import write_manifest
from tests.http_server import serve
from tests.test_live import BASE


@asynccontextmanager
async def running(manifest: Path, max_subscriptions: int = 1000) -> AsyncIterator[tuple[Any, Supervisor]]:
    """An ResourceService with its Supervisor watching, and the MCP server for in-process clients."""
    service = await ResourceService.open(manifest)
    notifier = Notifier(max_subscriptions=max_subscriptions)
    live = Supervisor(service, notifier)
    async with anyio.create_task_group() as tg:
        tg.start_soon(live.run)
        await anyio.sleep(0.2)  # watchers up
        try:
            yield build_server(service, notifier), live
        finally:
            live.stop()
            tg.cancel_scope.cancel()
    await service.aclose()


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    for name in ("a.md", "b.md"):
        (tmp_path / "docs" / name).write_text(f"# {name}\n")
    return write_manifest(tmp_path, BASE)


def test_remote_poll_sends_updated_for_subscribed_uris(tmp_path: Path) -> None:
    with serve() as upstream:
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: poll}}
            sources:
              api: {{url: "http://127.0.0.1:{upstream.port}/base", allowPrivateNetwork: true, poll: 200ms}}
            resources:
              - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
            """)

        async def main() -> None:
            async with running(manifest) as (server, live):
                async with Client(server, mode="auto", cache=None) as client:
                    assert (await client.read_resource("api://a")).contents[0].text == upstream.body
                    async with client.listen(resource_subscriptions=["api://a"]) as sub:
                        await anyio.sleep(0.5)  # one poll records the version
                        upstream.etag, upstream.body = '"v2"', "# A\n\nchanged upstream\n"
                        with anyio.fail_after(5):
                            event = await sub.__anext__()
                        assert event == ResourceUpdated(uri="api://a")
                    assert (await client.read_resource("api://a")).contents[0].text == upstream.body

        anyio.run(main)


def test_subscription_cap_and_cleanup_on_close(docs: Path) -> None:
    async def main() -> None:
        async with running(docs, max_subscriptions=2) as (server, live):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                async with Client(server, mode="legacy", cache=None) as client:
                    await client.subscribe_resource("docs://a.md")
                    await client.subscribe_resource("docs://b.md")
                    await client.subscribe_resource("docs://a.md")  # again: still two
                    with pytest.raises(MCPError) as err:
                        await client.subscribe_resource("docs://c.md")
                    assert err.value.code in (-32002, -32602)  # unknown URI: not found
                    (docs.parent / "docs" / "c.md").write_text("c")
                    await anyio.sleep(0.5)
                    with pytest.raises(MCPError) as err:
                        await client.subscribe_resource("docs://c.md")
                    assert "limit" in err.value.message
                    assert live.notifier.legacy_sessions == 1 and live.notifier.subscribed_uris()
            await anyio.sleep(0.1)
            assert live.notifier.legacy_sessions == 0 and not live.notifier.subscribed_uris()
            async with Client(server, mode="auto", cache=None) as client:
                with pytest.raises(MCPError):
                    async with client.listen(resource_subscriptions=["docs://a.md", "docs://b.md", "docs://c.md"]):
                        pass
                async with client.listen(resource_subscriptions=["docs://a.md"]):
                    assert live.notifier.subscribed_uris() == {"docs://a.md"}
            await anyio.sleep(0.1)
            assert not live.notifier.subscribed_uris()

    anyio.run(main)


def test_reload_reuses_remote_listing_within_its_ttl(tmp_path: Path) -> None:
    """Source listings are cached with the source's ttl: a reload inside it lists nothing again."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe({"/ttl-test/a.md": b"a"})
    text = """
        version: 1
        server: {name: ttl}
        sources:
          mem: {url: "memory://ttl-test", ttl: %s}
        collections:
          - {source: mem, glob: "*.md", uri: "mem://{path}"}
        resources:
          - {uri: "note://v", name: v, text: "%s"}
        """

    async def main() -> None:
        manifest = write_manifest(tmp_path, text % ("1h", "one"))
        agg = await ResourceService.open(manifest)
        fs.pipe({"/ttl-test/b.md": b"b"})
        write_manifest(tmp_path, text % ("1h", "two"))
        await agg.reload()
        assert [e.uri for e in agg.catalog.entries if e.uri.startswith("mem")] == ["mem://a.md"]  # cached listing
        write_manifest(tmp_path, text % ("0s", "three"))  # the source changed: listed again
        await agg.reload()
        assert [e.uri for e in agg.catalog.entries if e.uri.startswith("mem")] == ["mem://a.md", "mem://b.md"]

    anyio.run(main)


def test_template_uris_get_updated_too(docs: Path) -> None:
    write_manifest(docs.parent, BASE + 'templates:\n  - {uriTemplate: "raw://{+path}", name: raw, source: docs, path: "{path}"}\n')

    async def main() -> None:
        async with running(docs) as (server, live):
            async with Client(server, mode="auto", cache=None) as client:
                assert (await client.read_resource("raw://a.md")).contents[0].text == "# a.md\n"
                async with client.listen(resource_subscriptions=["raw://a.md"]) as sub:
                    await anyio.sleep(0.2)
                    (docs.parent / "docs" / "a.md").write_text("# a, changed\n")
                    with anyio.fail_after(5):
                        assert await sub.__anext__() == ResourceUpdated(uri="raw://a.md")
                assert (await client.read_resource("raw://a.md")).contents[0].text == "# a, changed\n"

    anyio.run(main)


def test_rendered_resources_get_updated_when_what_they_read_changes(tmp_path: Path) -> None:
    """A render that read a file is `updated` when the file changes; one that listed resources, when the listing
    changes; a render reading a render follows; a render that read nothing that changed stays quiet."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: renders}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}"}
        resources:
          - {uri: "digest://a", name: a, render: "{{ read('docs://a.md') }}"}
          - {uri: "digest://twice", name: twice, render: "{{ read('digest://a') }}{{ read('digest://a') }}"}
          - {uri: "digest://count", name: count, render: "{{ resources('docs://') | length }} docs"}
          - {uri: "digest://b", name: b, render: "{{ read('docs://b.md') }}"}
        """)

    async def main() -> None:
        async with running(manifest) as (server, live):
            async with Client(server, mode="auto", cache=None) as client:
                watched = ["digest://a", "digest://twice", "digest://count", "digest://b"]
                for uri in watched:
                    await client.read_resource(uri)
                async with client.listen(resource_subscriptions=watched) as sub:
                    await anyio.sleep(0.3)

                    async def events(n: int) -> set[str]:
                        got = set()
                        with anyio.fail_after(5):
                            while len(got) < n:
                                event = await sub.__anext__()
                                if isinstance(event, ResourceUpdated):
                                    got.add(event.uri)
                        return got

                    (tmp_path / "docs" / "a.md").write_text("# A, changed\n")
                    assert await events(2) == {"digest://a", "digest://twice"}
                    assert (await client.read_resource("digest://twice")).contents[0].text == "# A, changed\n" * 2
                    (tmp_path / "docs" / "c.md").write_text("# C\n")
                    assert await events(1) == {"digest://count"}
                    assert (await client.read_resource("digest://count")).contents[0].text == "3 docs"

    anyio.run(main)
