"""The `mcp` source kind: another MCP server's resources in the catalog (`mcp+stdio:` with `command`, or
`mcp+https://host/mcp`), end to end through the official client on both wires: collections over upstream URIs under
`prefix`, reads forwarded, upstream errors kept from clients, one child per source across reloads, manifests read
from URLs refused what would run commands or reach private networks, aggregator serving aggregator."""

from __future__ import annotations

import sys
from pathlib import Path
from subprocess import CompletedProcess

import anyio
import pytest
from mcp import Client, StdioServerParameters

from aggregator.manifest import ManifestError, load_manifest
from aggregator.sources import kind_for_url
from tests.conftest import MODES, write_manifest
from tests.test_live import BASE
from tests.test_manifest_compose import _errors, web  # noqa: F401 - a fixture
from tests.test_upstream import ENV, HERE, free_port, start_http, stop
from tests.command import aggregator

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]


def serve(manifest: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", str(manifest)], env=ENV)


@pytest.mark.parametrize(("url", "protocol"), [("mcp+stdio:", "mcp"), ("mcp+stdio:./sub", "mcp"),
                                               ("mcp+https://example.com/mcp", "mcp"), ("MCP+HTTP://h/mcp", "mcp")])
def test_the_url_picks_the_mcp_kind(tmp_path: Path, url: str, protocol: str) -> None:
    (tmp_path / "sub").mkdir()
    m = load_manifest(write_manifest(tmp_path, f"version: 1\nserver: {{name: s}}\n"
                                               f"sources: {{s: {{url: '{url}', command: [x]}}}}\n"))
    spec = m.sources["s"]
    assert (spec.kind, spec.protocol, kind_for_url(url).name) == ("mcp", protocol, "mcp")
    if url.startswith("mcp+stdio"):  # the child's folder: the manifest's, or the one written after the colon
        assert spec.url == "mcp+stdio:" + str((tmp_path / url.split(":", 1)[1]).resolve())
    assert spec.settings == {"command": ("x",), "env": {}, "headers": {}, "oauth": None, "allowPrivateNetwork": False,
                             "prefix": "",
                             "namespace": None, "maxEntries": 1_000_000, "maxMessageBytes": 64 * 1024 * 1024}
    assert kind_for_url("https://example.com/mcp").name == "http"  # plain https stays the http kind's


def test_settings_of_the_other_wire_are_refused(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: s}
        sources:
          a: {url: "mcp+stdio:", command: [x], headers: {A: b}}
        collections:
          - {source: a, glob: "*", uri: "a://{path}"}
        """)

    private = write_manifest(tmp_path, """
        version: 1
        server: {name: s}
        sources:
          a: {url: "mcp+http://127.0.0.1:9/mcp"}
        """, "private.yaml")

    async def main() -> None:
        from aggregator.service import ResourceService

        with pytest.raises(ManifestError, match="headers, oauth and allowPrivateNetwork are for mcp\\+https"):
            await ResourceService.open(path)
        # The SSRF guard of HTTP sources: loopback is refused unless allowPrivateNetwork says otherwise.
        with pytest.raises(ManifestError, match="private.yaml:4:3: sources.a.url: refused: .*allowPrivateNetwork"):
            await ResourceService.open(private)

    anyio.run(main)


def test_a_url_manifest_may_not_run_commands_or_reach_private_networks(tmp_path: Path,
                                                                      web: tuple[str, Path]) -> None:  # noqa: F811
    base, folder = web
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources:\n  u: {url: 'mcp+stdio:', command: [sh, -c, id], "
                           "env: {A: b}}\n", name="stdio.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources:\n  u: {url: 'mcp+http://10.0.0.1/mcp', "
                           "allowPrivateNetwork: true}\n", name="net.yaml")
    write_manifest(folder, "version: 1\nserver: {name: s}\nsources:\n  u: {url: 'mcp+https://example.com/mcp', "
                           "headers: {Authorization: Bearer x}}\n", name="fine.yaml")

    def including(name: str) -> Path:
        return write_manifest(tmp_path, f'version: 1\nserver: {{name: x}}\ninclude: [{{url: "{base}/{name}"}}]\n',
                              name=f"inc-{name}")

    refused = _errors(including("stdio.yaml"))
    assert refused.count("may not run commands on this machine (mcp+stdio)") == 3  # url, command, env
    assert "may not open private networks to MCP upstreams" in _errors(including("net.yaml"))
    assert load_manifest(including("fine.yaml")).sources["u"].kind == "mcp"


def test_mcp_source_behind_the_read_path(tmp_path: Path) -> None:
    """Collections over an upstream's URIs under `prefix`, reads, not-found and failures as clients see them (no
    upstream text); an unchanged source keeps its child across reloads, a changed one gets a new one."""
    from aggregator.errors import ResourceNotFound, ResourceUnavailable
    from aggregator.service import ResourceService

    def text(tag: str) -> str:
        return f"""
            version: 1
            server: {{name: outer}}
            defaults: {{ttl: 0s}}
            sources:
              up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r},
                    env: {{PYTHONPATH: "{ENV['PYTHONPATH']}", UPSTREAM_TAG: {tag}}}}}
            collections:
              - {{source: up, glob: "static-*", uri: "wiki://{{path}}"}}
              - {{source: up, glob: "boom", uri: "wiki://{{path}}"}}
              - {{source: up, glob: "tag/*", uri: "tag://{{name}}"}}
            """

    manifest = write_manifest(tmp_path, text("one"))

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            assert sorted(e.uri for e in service.catalog.entries) == [
                "tag://one", "wiki://boom", "wiki://static-binary", "wiki://static-text"]
            assert (await service.read("wiki://static-text")).content.text == "Hello from one"
            assert (await service.read("wiki://static-binary")).content.blob is not None
            with pytest.raises(ResourceUnavailable) as failed:
                await service.read("wiki://boom")
            assert failed.value.message == "Resource wiki://boom could not be read right now"
            assert "SECRET" not in failed.value.message
            with pytest.raises(ResourceNotFound):
                await service.read("wiki://nope")
            upstream = service.sources["up"].upstream  # type: ignore[attr-defined]
            manifest.write_text(manifest.read_text() + "resources:\n  - {uri: 'note://x', name: x, text: x}\n")
            await service.reload()
            assert service.sources["up"].upstream is upstream and upstream.status.state == "connected"
            assert upstream.status.reconnects == 0
            manifest.write_text(text("two"))
            await service.reload()
            assert service.sources["up"].upstream is not upstream
            assert "tag://two" in {e.uri for e in service.catalog.entries}
            assert (await service.read("wiki://static-text")).content.text == "Hello from two"
        finally:
            await service.aclose()
        assert upstream.status.state == "closed"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_aggregator_serving_aggregator(mode: str, tmp_path: Path) -> None:
    """Two levels through the official client: `hop://...` from an aggregator whose source is another aggregator's
    `docs://...` over stdio (its folder watched: a change reaches the outer client once the inner cache lets go)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    (docs / "b.md").write_text("# B\n")
    inner = write_manifest(tmp_path, BASE, "inner.yaml")
    command = [sys.executable, "-m", "aggregator", "serve", str(inner)]
    outer = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        defaults: {{ttl: 0s}}
        sources:
          inner: {{url: "mcp+stdio:", prefix: "docs://", command: {command!r}, env: {ENV!r}}}
        collections:
          - {{source: inner, glob: "*.md", uri: "hop://{{path}}"}}
        """, "outer.yaml")

    async def main() -> None:
        async with Client(serve(outer), mode=mode, cache=None) as client:
            assert sorted(r.uri for r in (await client.list_resources()).resources) == ["hop://a.md", "hop://b.md"]
            assert (await client.read_resource("hop://b.md")).contents[0].text == "# B\n"
            (docs / "b.md").write_text("# B again\n")
            with anyio.fail_after(8):
                while (await client.read_resource("hop://b.md")).contents[0].text != "# B again\n":
                    await anyio.sleep(0.1)

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_http_upstream_with_a_static_bearer(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mcp+http://` to a Streamable HTTP upstream on loopback (allowPrivateNetwork), the manifest's header (from
    ${ENV}) sent upstream, served to the official client over stdio."""
    port = free_port()
    process = start_http([sys.executable, str(HERE / "upstream_server.py"), "http", str(port)], port)
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+http://127.0.0.1:{port}/mcp", prefix: "test://", allowPrivateNetwork: ["127.0.0.0/8"],
                headers: {{Authorization: "Bearer ${{UPSTREAM_TOKEN}}"}}}}
        collections:
          - {{source: up, glob: "static-text", uri: "wiki://{{path}}"}}
        resources:
          - {{uri: "wiki://auth", name: auth, source: up, path: "header/authorization"}}
        """)

    async def main() -> None:
        async with Client(StdioServerParameters(command=sys.executable,
                                                args=["-m", "aggregator", "serve", str(manifest)],
                                                env={**ENV, "UPSTREAM_TOKEN": "s3cret"}), mode=mode,
                          cache=None) as client:
            assert (await client.read_resource("wiki://static-text")).contents[0].text == "Hello from one"
            assert (await client.read_resource("wiki://auth")).contents[0].text == "Bearer s3cret"

    try:
        anyio.run(main)
    finally:
        stop(process)


@pytest.mark.parametrize("mode", MODES)
def test_live_through_one_hop(mode: str, tmp_path: Path) -> None:
    """The outer aggregator (Streamable HTTP) over an inner one (mcp+stdio): the inner's `updated` for a subscribed
    URI reaches the outer client; the inner's list_changed makes the outer relist and send its own list_changed
    exactly once, and none when the change is outside what the outer lists; a killed inner child is reconnected,
    and /healthz and /metrics show it."""
    import itertools
    import os
    import signal
    import warnings

    import httpx2 as httpx
    import psutil

    from tests.test_live import QUIET, Inbox, save

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    inner = write_manifest(tmp_path, BASE, "inner.yaml")
    command = [sys.executable, "-m", "aggregator", "serve", str(inner)]
    outer = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          inner: {{url: "mcp+stdio:", prefix: "docs://", command: {command!r}, env: {ENV!r}}}
        collections:
          - {{source: inner, glob: "*.md", uri: "hop://{{path}}"}}
        """, "outer.yaml")
    port = free_port()
    process = start_http([sys.executable, "-m", "aggregator", "serve", str(outer), "--http", str(port)], port)
    base = f"http://127.0.0.1:{port}"
    inbox = Inbox()
    events: list[tuple[str, str | None]] = []

    async def until(condition: object, timeout: float = 10.0) -> None:
        with anyio.fail_after(timeout):
            while not condition():  # type: ignore[operator]
                await anyio.sleep(0.05)

    async def exercise(client: Client, next_event: object) -> None:
        got = next_event  # an async function: the next notification, or None after a wait
        assert sorted(r.uri for r in (await client.list_resources()).resources) == ["hop://a.md"]
        # Written until its `updated` comes: the inner's watcher and the outer's upstream subscription come up at
        # their own pace (a fixed wait failed under load), and a write before them is told only as a changed size.
        with anyio.fail_after(20):
            for attempt in itertools.count():
                (docs / "a.md").write_text(f"# A changed {attempt}\n")
                event = await got(1.5)  # type: ignore[operator]
                while event == ("list_changed", None):
                    event = await got(1.5)  # type: ignore[operator]
                if event is not None:
                    assert event == ("updated", "hop://a.md")
                    break
        while await got(QUIET) is not None:  # type: ignore[operator]
            pass  # what the last write told besides
        assert (await client.read_resource("hop://a.md")).contents[0].text == f"# A changed {attempt}\n"
        (docs / "c.md").write_text("# C\n")
        assert await got(8) == ("list_changed", None)  # type: ignore[operator]
        assert await got(QUIET) is None  # type: ignore[operator]  # exactly once
        assert "hop://c.md" in {r.uri for r in (await client.list_resources()).resources}
        # The inner's listing changes outside what the outer lists: the outer says nothing.
        save(inner, BASE + 'resources:\n  - {uri: "note://h", name: h, text: hi}\n')
        assert await got(2.5) is None  # type: ignore[operator]
        health = httpx.get(base + "/healthz").json()
        assert health["upstreams"] == {"total": 1, "connected": 1, "reconnects": 0}
        # The inner child dies: it is started again, and the subscription with it.
        child = next(p for p in psutil.Process(process.pid).children() if "inner.yaml" in " ".join(p.cmdline()))
        os.kill(child.pid, signal.SIGKILL)
        await until(lambda: httpx.get(base + "/healthz").json()["upstreams"] == {
            "total": 1, "connected": 1, "reconnects": 1})
        metrics = httpx.get(base + "/metrics").text
        assert 'aggregator_upstream_connected{source="inner"} 1.0' in metrics
        assert 'aggregator_upstream_reconnects_total{source="inner"} 1.0' in metrics
        while await got(1.5) is not None:  # type: ignore[operator]
            pass  # a reconnect may have told of changes missed meanwhile
        (docs / "a.md").write_text("# A after the restart\n")
        assert await got(10) == ("updated", "hop://a.md")  # type: ignore[operator]
        assert (await client.read_resource("hop://a.md")).contents[0].text == "# A after the restart\n"

    async def main() -> None:
        if mode == "legacy":
            async with Client(base + "/mcp", mode="legacy", cache=None, message_handler=inbox) as client:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await client.subscribe_resource("hop://a.md")
                await exercise(client, inbox.next)
            return
        async with Client(base + "/mcp", mode="auto", cache=None) as client:
            async with client.listen(resources_list_changed=True, resource_subscriptions=["hop://a.md"]) as sub:
                arrived = anyio.Event()

                async def collect() -> None:
                    async for event in sub:
                        events.append(("list_changed", None) if type(event).__name__ == "ResourcesListChanged"
                                      else ("updated", event.uri))
                        arrived.set()

                async def next_event(timeout: float) -> tuple[str, str | None] | None:
                    nonlocal arrived
                    with anyio.move_on_after(timeout):
                        while not events:
                            arrived = anyio.Event()
                            await arrived.wait()
                        return events.pop(0)
                    return None

                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect)
                    await exercise(client, next_event)
                    tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        stop(process)


def test_the_gateway_sample(tmp_path: Path) -> None:
    """sample-configs/gateway.yaml serves two aggregators (stdio children) and a folder as one searchable catalog."""
    import os
    import shutil

    from tests.test_search import structured

    samples = tmp_path / "sample-configs"
    shutil.copytree(HERE.parent / "sample-configs", samples)  # the index and children stay out of the checkout
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # `python` is ours
    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve",
                                                                 str(samples / "gateway.yaml")],
                                   env={**ENV, "PATH": path})

    async def main() -> None:
        async with Client(params, mode="auto", cache=None) as client:
            listed = sorted(r.uri for r in (await client.list_resources()).resources)
            assert "gateway://handbook/README.md" in listed and "gateway://runbooks/onboarding.md" in listed
            assert "gateway://reference/glossary.md" in listed
            onboarding = (await client.read_resource("gateway://runbooks/onboarding.md")).contents[0].text
            assert onboarding == (samples / "docs" / "guides" / "onboarding.md").read_text()
            with anyio.fail_after(20):  # the index is built in the background
                while not (found := structured(await client.call_tool("search_resources", {"query": "onboarding"}))
                           ["results"]):
                    await anyio.sleep(0.2)
            assert any(r["uri"].startswith("gateway://") for r in found)

    anyio.run(main)


@pytest.mark.parametrize(("hint", "misses", "ttl", "private"), [
    ("", 3, 0.0, True),                    # the SDK's default hint: immediately stale, private
    ("public:600000", 1, 300.0, False),    # a longer ttlMs: the source's ttl
    ("public:60000", 1, 60.0, False),      # a shorter ttlMs wins
    ("public:0", 2, 0.0, False),           # immediately stale: not kept (two reads at once still share one load)
    ("private:60000", 3, 60.0, True),      # private: never kept, never shared, and said so to our client
])
def test_upstream_caching_hints(tmp_path: Path, hint: str, misses: int, ttl: float, private: bool) -> None:
    from aggregator.service import ResourceService

    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        defaults: {{ttl: 5m}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r},
                env: {{PYTHONPATH: "{ENV['PYTHONPATH']}", UPSTREAM_CACHE: "{hint}"}}}}
        collections:
          - {{source: up, glob: "static-text", uri: "wiki://{{path}}"}}
        """)

    async def main() -> None:
        service = await ResourceService.open(manifest)
        try:
            before = service.cache.misses
            async with anyio.create_task_group() as tg:  # at once: a private load is not shared with followers
                for _ in range(2):
                    tg.start_soon(service.read, "wiki://static-text")
            served = await service.read("wiki://static-text")
            assert served.content.text == "Hello from one"
            assert (served.ttl, served.private) == (ttl, private)
            assert service.cache.misses - before == misses
        finally:
            await service.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_upstream_templates_read_and_complete_through_ours(mode: str, tmp_path: Path) -> None:
    """A template of ours over the source's path `template/{id}/data` (under `prefix` test://, the upstream's own
    template): reads are forwarded, completion is the upstream's; a template over listed paths completes from the
    listing as for any source."""
    from mcp_types import ResourceTemplateReference

    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r}, env: {ENV!r}}}
        templates:
          - {{uriTemplate: "wiki://template/{{id}}/data", name: data, source: up, path: "template/{{id}}/data"}}
          - {{uriTemplate: "wiki://static/{{name}}", name: static, source: up, path: "static-{{name}}"}}
        """)

    async def main() -> None:
        async with Client(serve(manifest), mode=mode, cache=None) as client:
            read = await client.read_resource("wiki://template/42/data")
            assert (read.contents[0].text, read.contents[0].mime_type) == ('{"id": "42"}', "application/json")
            done = await client.complete(ResourceTemplateReference(type="ref/resource",
                                                                   uri="wiki://template/{id}/data"),
                                         {"name": "id", "value": "al"})
            assert done.completion.values == ["alpha", "alpine"]
            listed = await client.complete(ResourceTemplateReference(type="ref/resource", uri="wiki://static/{name}"),
                                           {"name": "name", "value": "t"})
            assert listed.completion.values == ["text"]
            assert (await client.read_resource("wiki://static/text")).contents[0].text == "Hello from one"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_the_namespace_form(mode: str, tmp_path: Path) -> None:
    """`namespace: up`: every upstream resource and template listed as `up+<uri>`, described as upstream does;
    reads (listed and templated) and completion forwarded; errors still kept from clients."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import ResourceTemplateReference

    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, env: {ENV!r}}}
        """)

    async def main() -> None:
        async with Client(serve(manifest), mode=mode, cache=None) as client:
            listed = {r.uri: r for r in (await client.list_resources()).resources}
            assert {"up+test://static-text", "up+test://static-binary", "up+test://tag/one"} <= set(listed)
            assert (listed["up+test://static-text"].name, listed["up+test://static-text"].mime_type) == (
                "static_text", "text/plain")
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"up+test://template/{id}/data", "up+test://header/{name}"}
            assert (await client.read_resource("up+test://static-text")).contents[0].text == "Hello from one"
            assert (await client.read_resource("up+test://template/7/data")).contents[0].text == '{"id": "7"}'
            done = await client.complete(ResourceTemplateReference(type="ref/resource",
                                                                   uri="up+test://template/{id}/data"),
                                         {"name": "id", "value": "al"})
            assert done.completion.values == ["alpha", "alpine"]
            with pytest.raises(MCPError) as failed:
                await client.read_resource("up+test://boom")
            assert "SECRET" not in str(failed.value)

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_namespaces_nest_through_two_hops(mode: str, tmp_path: Path) -> None:
    """outer (namespace out) -> middle (namespace mid) -> inner (a folder): `out+mid+docs://a.md`, and a change
    in the folder reaches the outer client's listing through both hops."""
    from tests.test_live import _until_listed

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    inner = write_manifest(tmp_path, BASE, "inner.yaml")
    middle = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: middle}}
        sources:
          inner: {{url: "mcp+stdio:", namespace: mid, command: {[sys.executable, "-m", "aggregator", "serve",
                                                                 str(inner)]!r}, env: {ENV!r}}}
        """, "middle.yaml")
    outer = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          middle: {{url: "mcp+stdio:", namespace: out, command: {[sys.executable, "-m", "aggregator", "serve",
                                                                  str(middle)]!r}, env: {ENV!r}}}
        """, "outer.yaml")

    async def main() -> None:
        async with Client(serve(outer), mode=mode, cache=None) as client:
            assert [r.uri for r in (await client.list_resources()).resources] == ["out+mid+docs://a.md"]
            assert (await client.read_resource("out+mid+docs://a.md")).contents[0].text == "# A\n"
            await anyio.sleep(0.8)
            (docs / "b.md").write_text("# B\n")
            await _until_listed(client, "out+mid+docs://b.md", timeout=15)
            assert (await client.read_resource("out+mid+docs://b.md")).contents[0].text == "# B\n"

    anyio.run(main)


def test_an_upstream_down_at_start_and_gone_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway serves while an upstream is down (its entries come when it does, with list_changed); when it
    goes away, what it listed is kept for staleIfError (`keep`, whose content is then served stale) or dropped
    (`drop`)."""
    monkeypatch.setenv("UPSTREAM_CACHE", "public:600000")  # content the gateway may keep
    from tests.test_live import Inbox

    port = free_port()
    url = f"mcp+http://127.0.0.1:{port}/mcp"
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          keep: {{url: "{url}", namespace: k, allowPrivateNetwork: true, staleIfError: 1h, ttl: 1s, timeout: 3s}}
          drop: {{url: "{url}", namespace: d, allowPrivateNetwork: true, timeout: 3s}}
        resources:
          - {{uri: "note://n", name: n, text: here}}
        """)
    inbox = Inbox()

    async def listed(client: Client) -> set[str]:
        return {r.uri for r in (await client.list_resources()).resources}

    async def main() -> None:
        async with Client(serve(manifest), mode="legacy", cache=None, message_handler=inbox) as client:
            assert await listed(client) == {"note://n"}
            process = await anyio.to_thread.run_sync(
                start_http, [sys.executable, str(HERE / "upstream_server.py"), "http", str(port)], port)
            try:
                with anyio.fail_after(20):
                    while not {"k+test://static-text", "d+test://static-text"} <= await listed(client):
                        await anyio.sleep(0.2)
                assert ("list_changed", None) in inbox.events
                assert (await client.read_resource("d+test://static-text")).contents[0].text == "Hello from one"
                assert (await client.read_resource("k+test://static-text")).contents[0].text == "Hello from one"
            finally:
                stop(process)
            with anyio.fail_after(20):
                while "d+test://static-text" in await listed(client):
                    await anyio.sleep(0.2)
            assert "k+test://static-text" in await listed(client)
            await anyio.sleep(1.1)  # past the ttl: the upstream is asked, fails, and the stale copy is served
            assert (await client.read_resource("k+test://static-text")).contents[0].text == "Hello from one"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_access_scopes_and_no_confused_deputy(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served over HTTP with bearer auth: `access: {scopes}` on the mcp source hides and refuses its entries to
    callers without the scope, and the caller's own token never reaches the upstream (it sees no Authorization)."""
    from mcp.shared.exceptions import MCPError

    from tests.test_auth import _client

    port = free_port()
    alice, bob = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: outer
          auth:
            resource: "http://127.0.0.1:{port}/mcp"
            tokens:
              - {{name: alice, token: "${{ALICE}}", scopes: [wiki]}}
              - {{name: bob, token: "${{BOB}}", scopes: [other]}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r}, env: {ENV!r}, access: {{scopes: [wiki]}}}}
        collections:
          - {{source: up, glob: "static-text", uri: "wiki://{{path}}"}}
        resources:
          - {{uri: "wiki://auth", name: auth, source: up, path: "header/authorization"}}
          - {{uri: "note://open", name: open, text: open}}
        """)
    monkeypatch.setenv("ALICE", alice)
    monkeypatch.setenv("BOB", bob)
    process = start_http([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port)], port)
    url = f"http://127.0.0.1:{port}/mcp"

    async def main() -> None:
        async with _client(url, alice, mode) as client:
            assert {r.uri for r in (await client.list_resources()).resources} == {
                "wiki://static-text", "wiki://auth", "note://open"}
            assert (await client.read_resource("wiki://static-text")).contents[0].text == "Hello from one"
            assert (await client.read_resource("wiki://auth")).contents[0].text == "-"  # nothing forwarded
        async with _client(url, bob, mode) as client:
            assert {r.uri for r in (await client.list_resources()).resources} == {"note://open"}
            with pytest.raises(MCPError):
                await client.read_resource("wiki://static-text")

    try:
        anyio.run(main)
    finally:
        stop(process)


def test_oauth_client_credentials(tmp_path: Path) -> None:
    """An upstream aggregator that asks for a JWT (server.auth.jwt): the gateway gets one from the authorization
    server the upstream names (client_credentials, the secret from ${ENV}), through the SSRF guard."""
    import json
    import threading
    from base64 import b64decode
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from typing import Any
    from urllib.parse import parse_qs

    from tests.test_auth import Keys

    keys = Keys()
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    granted: list[str] = []

    class AuthorizationServer(BaseHTTPRequestHandler):
        def reply(self, body: dict[str, Any], status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/jwks":
                self.reply(keys.jwks)
            elif self.path.startswith("/.well-known/oauth-authorization-server"):
                self.reply({"issuer": issuer, "token_endpoint": f"{issuer}/token",
                            "authorization_endpoint": f"{issuer}/authorize", "response_types_supported": ["code"],
                            "grant_types_supported": ["client_credentials"],
                            "token_endpoint_auth_methods_supported": ["client_secret_basic"]})
            else:
                self.reply({"error": "not_found"}, 404)

        def do_POST(self) -> None:  # noqa: N802
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            basic = b64decode(self.headers.get("Authorization", "Basic ").split(" ", 1)[1] or b"").decode()
            if form.get("grant_type") != ["client_credentials"] or basic != "gateway:s3cret":
                self.reply({"error": "invalid_client"}, 401)
                return
            granted.append(basic)
            self.reply({"access_token": keys.token(resource, "docs", issuer=issuer), "token_type": "Bearer",
                        "expires_in": 300})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), AuthorizationServer)
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    inner = write_manifest(tmp_path, f"""
        version: 1
        server:
          name: inner
          auth: {{resource: "{resource}", jwt: {{issuer: "{issuer}", jwksUrl: "{issuer}/jwks"}}}}
        sources:
          docs: {{url: ./docs}}
        collections:
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        """, "inner.yaml")
    outer = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          inner: {{url: "mcp+{resource}", namespace: in, allowPrivateNetwork: ["127.0.0.0/8"],
                   oauth: {{clientId: gateway, clientSecret: "${{GATEWAY_SECRET}}", issuer: "{issuer}"}}}}
        """, "outer.yaml")
    process = start_http([sys.executable, "-m", "aggregator", "serve", str(inner), "--http", str(port)], port)

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", str(outer)],
                                       env={**ENV, "GATEWAY_SECRET": "s3cret"})
        async with Client(params, mode="auto", cache=None) as client:
            assert [r.uri for r in (await client.list_resources()).resources] == ["in+docs://a.md"]
            assert (await client.read_resource("in+docs://a.md")).contents[0].text == "# A\n"

    try:
        anyio.run(main)
    finally:
        stop(process)
        server.shutdown()
    assert granted  # the token came from the authorization server


def _validate(manifest: Path, *flags: str) -> CompletedProcess[str]:
    """`aggregator validate` in this process (tests/command.py); the upstreams it opens are processes."""
    return aggregator("validate", *flags, str(manifest), env=ENV)


def test_a_namespaced_source_is_used(tmp_path: Path) -> None:
    """A source with `namespace:` serves its upstream's resources and templates itself: validate (online or
    offline) does not call it unused."""
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, env: {ENV!r}}}
        """)
    for flags in ((), ("--offline",)):
        checked = _validate(manifest, *flags)
        assert checked.returncode == 0 and "warning" not in checked.stderr + checked.stdout, checked.stderr
        assert flags or "(1 sources, 6 resources, 2 templates)" in checked.stdout


@pytest.mark.parametrize(("source", "entry", "key", "says"), [
    ("", '{source: up, glob: "test://static-*", uri: "wiki://{path}"}', "collections[0].glob",
     "glob 'test://static-*' spells the upstream's URI; paths of source 'up' are what follows its prefix, and it "
     "has none: set prefix: \"test://\" on the source and write glob: \"static-*\""),
    ('prefix: "test://", ', '{source: up, glob: "test://static-*", uri: "wiki://{path}"}', "collections[0].glob",
     "glob 'test://static-*' repeats the prefix of source 'up' ('test://'): paths are what follows it; write "
     "glob: \"static-*\""),
    ('prefix: "test://", ', '{source: up, glob: "*", exclude: ["test://b*"], uri: "wiki://{path}"}',
     "collections[0].exclude[0]", "repeats the prefix of source 'up'"),
    ("", '{uriTemplate: "wiki://t/{id}", name: t, source: up, path: "test://template/{id}/data"}',
     "templates[0].path", "path 'test://template/{id}/data' spells the upstream's URI; paths of source 'up' are "
     "what follows its prefix, and it has none: set prefix: \"test://\" on the source and write path: "
     "\"template/{id}/data\""),
    ('prefix: "test://", namespace: up, ', '{uriTemplate: "wiki://t/{id}", name: t, source: up, '
     'path: "test://template/{id}/data"}', "templates[0].path", "repeats the prefix of source 'up'"),
    ('prefix: "test://", ', '{uri: "wiki://a", name: a, source: up, path: "test://static-text"}',
     "resources[0].path", "path 'test://static-text' repeats the prefix of source 'up' ('test://'): paths are what "
     "follows it; write path: \"static-text\""),
])
def test_a_path_that_spells_the_upstream_uri_is_refused_where_it_is(tmp_path: Path, source: str, entry: str,
                                                                    key: str, says: str) -> None:
    """A glob or path of an mcp source is what follows its `prefix`: one that spells the upstream's scheme again
    could never list or read anything, so `validate` (and serve) refuse it at load, located, with the fix."""
    import re

    section = key.split("[", 1)[0]
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", {source}command: {UPSTREAM!r}, env: {ENV!r}}}
        {section}:
          - {entry}
        """)
    checked = _validate(manifest)
    assert checked.returncode == 1, checked.stderr
    assert re.search(rf"{re.escape(str(manifest))}:6:\d+: {re.escape(key)}: .*{re.escape(says)}", checked.stderr), \
        checked.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_namespaced_source_without_prefix_reads_templates_by_full_uri(mode: str, tmp_path: Path) -> None:
    """Without a prefix, a namespaced source's paths are whole upstream URIs (its own templates are published that
    way), so a template of ours may spell one: it reads, and validate finds nothing to say."""
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, env: {ENV!r}}}
        templates:
          - {{uriTemplate: "wiki://t/{{id}}", name: t, source: up, path: "test://template/{{id}}/data"}}
        """)

    async def main() -> None:
        async with Client(serve(manifest), mode=mode, cache=None) as client:
            assert (await client.read_resource("wiki://t/42")).contents[0].text == '{"id": "42"}'

    anyio.run(main)
    checked = _validate(manifest)
    assert checked.returncode == 0 and "warning" not in checked.stderr, checked.stderr


def test_a_collection_over_whole_uris_says_to_set_a_prefix(tmp_path: Path) -> None:
    """A collection over an mcp source without a prefix matches whole upstream URIs, which are no relative paths:
    the warning says so and what prefix to set, not that the names hold control characters."""
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", command: {UPSTREAM!r}, env: {ENV!r}}}
        collections:
          - {{source: up, glob: "**", uri: "wiki://{{path}}"}}
        """)
    checked = _validate(manifest)
    assert checked.returncode == 0, checked.stderr
    assert "control characters" not in checked.stderr
    assert "are whole URIs" in checked.stderr and 'prefix: "test://"' in checked.stderr, checked.stderr
    assert "matches no file" not in checked.stderr, checked.stderr  # it matched: the whole-URIs warning says why
