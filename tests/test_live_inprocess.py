"""The live catalog in one process: polling remote sources, subscription caps, cleanup, ConfigMap swaps, a soak."""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
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
from tests.test_live import BASE, save


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


def test_configmap_symlink_swap_reloads(tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as m.yaml -> ..data/m.yaml, ..data -> ..<timestamp>; updates swap ..data."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("a")
    mount = tmp_path / "config"
    first = mount / "..2026_01"
    first.mkdir(parents=True)
    (first / "m.yaml").write_text(BASE.replace("./docs", str(tmp_path / "docs")))
    os.symlink("..2026_01", mount / "..data")
    os.symlink("..data/m.yaml", mount / "m.yaml")

    async def main() -> None:
        async with running(mount / "m.yaml") as (server, live):
            second = mount / "..2026_02"
            second.mkdir()
            (second / "m.yaml").write_text(BASE.replace("./docs", str(tmp_path / "docs")) +
                                           'resources:\n  - {uri: "note://cm", name: cm, text: swapped}\n')
            os.symlink("..2026_02", mount / "..data_tmp")
            os.replace(mount / "..data_tmp", mount / "..data")
            with anyio.fail_after(5):
                while live.service.catalog.get("note://cm") is None:
                    await anyio.sleep(0.02)
            assert live.reloads == 1

    anyio.run(main)


def test_soak_200_saves_bounded_notifications_no_leaks(docs: Path) -> None:
    async def main() -> None:
        async with running(docs) as (server, live):
            async with Client(server, mode="legacy", cache=None) as client:
                await client.list_resources()
                gc.collect()
                tasks_before = len(asyncio.all_tasks())
                tracemalloc.start()
                base_memory = tracemalloc.get_traced_memory()[0]
                for i in range(200):
                    save(docs, BASE + f'resources:\n  - {{uri: "note://n{i % 7}", name: n, text: "{i}"}}\n')
                    await anyio.sleep(0.002)
                with anyio.fail_after(10):  # the saves settle, then one reload serves the last
                    while live.service.catalog.get("note://n3") is None:
                        await anyio.sleep(0.05)
                await anyio.sleep(0.5)
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - base_memory
                tracemalloc.stop()
                sent = live.notifier.sent_list_changed
                print(f"200 saves -> {sent} list_changed, {live.reloads} reloads, {grown} bytes grown")
                assert 1 <= sent <= 60, sent  # debounced and folded: far fewer than 200
                assert live.reload_errors == 0
                assert len(asyncio.all_tasks()) <= tasks_before
                assert grown < 5_000_000, grown
                final = [r.uri for r in (await client.list_resources()).resources]
                assert "note://n3" in final  # the last save (199 % 7 == 3) is what serves

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


def test_settings_fixed_at_start_are_named_on_reload(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A reload that changes server.tools or server.auth applies the rest and says which settings wait for a
    restart."""
    async def main() -> None:
        async with running(docs) as (server, live):
            save(docs, BASE.replace("server: {name: live}", "server: {name: live, tools: true}") +
                 'resources:\n  - {uri: "note://n", name: n, text: "n"}\n')
            with anyio.fail_after(5):
                while live.service.catalog.get("note://n") is None:
                    await anyio.sleep(0.02)

    with caplog.at_level("WARNING", logger="aggregator.supervisor"):
        anyio.run(main)
    assert "server.tools changed: it applies when the server restarts" in caplog.text


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


def _write_in_place(path: Path, chunks: list[str]) -> Any:
    """Rewrite `path` in place, as a shell redirect or a plain editor save does, one chunk per call of `next()`."""
    with path.open("r+") as handle:
        handle.truncate(0)
        for chunk in chunks:
            handle.write(chunk)
            handle.flush()
            yield


def test_reload_waits_until_the_manifest_settles(docs: Path) -> None:
    """A save written in five chunks 0.1 s apart (prefixes valid or not) is read once, whole, when it settled."""
    write_manifest(docs.parent, BASE.replace("{name: live}", "{name: live, reloadSettle: 1s}"))
    new = BASE.replace("{name: live}", "{name: live, reloadSettle: 1s}") + \
        'resources:\n  - {uri: "note://n", name: n, text: hello}\n'
    step = len(new) // 5 + 1

    async def main() -> None:
        async with running(docs) as (server, live):
            assert live.service.manifest.server.reload_settle == 1.0
            for _ in _write_in_place(docs, [new[i:i + step] for i in range(0, len(new), step)]):
                await anyio.sleep(0.1)
            with anyio.fail_after(10):
                while live.service.catalog.get("note://n") is None:
                    await anyio.sleep(0.02)
            assert (live.reloads, live.reload_errors, live.suspicious_reloads) == (1, 0, 0)
            assert live.service.catalog.get("docs://a.md") is not None

    anyio.run(main)


def test_suspicious_reload_waits_and_the_rest_of_the_save_wins(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A settled first half that declares the source but lists nothing is held one more window; the rest of the
    save arriving meanwhile is what gets loaded, and the resource in both versions never goes away."""
    head = BASE.replace("{name: live}", "{name: live, reloadSettle: 300ms}")
    write_manifest(docs.parent, head)
    new = head + 'resources:\n  - {uri: "note://n", name: n, text: hello}\n'
    cut = new.index("collections:")
    missing = 0

    async def main() -> None:
        nonlocal missing
        async with running(docs) as (server, live):
            done = anyio.Event()

            async def watch_catalog() -> None:
                nonlocal missing
                while not done.is_set():
                    missing += live.service.catalog.get("docs://a.md") is None
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_catalog)
                writer = _write_in_place(docs, [new[:cut], new[cut:]])
                next(writer)
                with anyio.fail_after(5):
                    while live.suspicious_reloads == 0:
                        await anyio.sleep(0.01)
                next(writer, None)
                with anyio.fail_after(5):
                    while live.service.catalog.get("note://n") is None:
                        await anyio.sleep(0.02)
                done.set()
            assert (live.reloads, live.reload_errors, live.suspicious_reloads) == (1, 0, 1)

    with caplog.at_level("INFO", logger="aggregator.supervisor"):
        anyio.run(main)
    assert missing == 0
    assert "would remove every resource of source(s) 'docs'" in caplog.text
    assert "changed again: reloading its new content instead" in caplog.text


def test_deliberate_emptying_applies_after_one_more_window(docs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Dropping every collection over a source that stays declared is held one settle window, then applied and
    told to clients; emptying a catalog of inline resources is held the same way."""
    head = BASE.replace("{name: live}", "{name: live, reloadSettle: 200ms}")
    write_manifest(docs.parent, head)

    async def main() -> None:
        async with running(docs) as (server, live):
            async with Client(server, mode="auto", cache=None) as client:
                async with client.listen(resources_list_changed=True) as sub:
                    await anyio.sleep(0.2)
                    save(docs, head[:head.index("collections:")] +
                         'resources:\n  - {uri: "note://only", name: only, text: hi}\n')
                    with anyio.fail_after(5):
                        while live.suspicious_reloads == 0:
                            await anyio.sleep(0.01)
                    assert live.service.catalog.get("docs://a.md") is not None  # held back
                    with anyio.fail_after(5):
                        await sub.__anext__()  # list_changed once applied
                    assert [r.uri for r in (await client.list_resources()).resources] == ["note://only"]
                    assert (live.reloads, live.suspicious_reloads) == (1, 1)

                    save(docs, "version: 1\nserver: {name: live, reloadSettle: 200ms}\n")  # nothing at all
                    with anyio.fail_after(5):
                        await sub.__anext__()
                    assert (await client.list_resources()).resources == []
                    assert (live.reloads, live.suspicious_reloads) == (2, 2)

    with caplog.at_level("WARNING", logger="aggregator.supervisor"):
        anyio.run(main)
    assert "would remove every resource of source(s) 'docs'" in caplog.text
    assert "would remove every resource of the catalog" in caplog.text
    assert caplog.text.count("stayed unchanged: applying the reload") == 2


def test_reload_settle_is_a_located_duration(tmp_path: Path) -> None:
    from aggregator.manifest import load_manifest
    from aggregator.manifest.model import ManifestError

    ok = write_manifest(tmp_path, "version: 1\nserver: {name: s, reloadSettle: 250ms}\n")
    assert load_manifest(ok).server.reload_settle == 0.25
    assert load_manifest(write_manifest(tmp_path, "version: 1\nserver: {name: s}\n")).server.reload_settle == 0.5
    bad = write_manifest(tmp_path, "version: 1\nserver: {name: s, reloadSettle: soon}\n")
    with pytest.raises(ManifestError) as err:
        load_manifest(bad)
    assert "reloadSettle" in str(err.value) and "manifest.yaml:2" in str(err.value)


def test_a_fifo_put_where_the_manifest_was_is_never_waited_on(docs: Path) -> None:
    """The digest check used to read the manifest whole on the event loop: a FIFO in its place froze the server
    (no writer ever comes). Now it is refused unread, the catalog keeps serving, and a real file after it reloads."""
    fifo = docs.parent / "fifo"
    os.mkfifo(fifo)

    async def main() -> None:
        async with running(docs) as (server, live):
            os.replace(fifo, docs)
            async with Client(server, cache=None) as client:
                for _ in range(3):  # past a digest check (every 2 s) and a settle window
                    with anyio.fail_after(5):
                        assert (await client.read_resource("docs://a.md")).contents[0].text == "# a.md\n"
                    await anyio.sleep(1)
                tmp = docs.parent / "next.yaml"
                tmp.write_text(BASE + 'resources:\n  - {uri: "note://back", name: back, text: back}\n')
                os.replace(tmp, docs)
                with anyio.fail_after(10):
                    while live.service.catalog.get("note://back") is None:
                        await anyio.sleep(0.05)

    anyio.run(main)
