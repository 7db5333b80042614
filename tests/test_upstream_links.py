"""The gateway's link to an upstream MCP server, through `aggregator serve` and the official client on both wires,
against real upstream processes (tests/upstream_server.py with its options, and @modelcontextprotocol/server-everything
when installed): caching hints only when the upstream sent them, reads that resume at once after an HTTP upstream
restarts, and no change notification lost between the upstream's stream and our relisting."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.conftest import MODES, write_manifest
from tests.test_live import uris
from tests.test_mcp_kind import serve
from tests.served import answers, wait_until
from tests.test_upstream import ENV, HERE, _kill_listener, free_port, start_http, stop

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py")]
EVERYTHING = HERE / ".node" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
EVERYTHING_MISSING = (f"@modelcontextprotocol/server-everything is not installed ({EVERYTHING.relative_to(HERE.parent)}"
                      " missing; .ci/run installs it with npm) or node is not on PATH")


def _everything_argv() -> list[str] | None:
    node = shutil.which("node")
    return [node, str(EVERYTHING), "streamableHttp"] if node and EVERYTHING.is_file() else None


@contextlib.contextmanager
def http_upstream(argv: list[str], port: int, **env: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """An HTTP upstream on `port` (started again by `restart(...)`), every process stopped at the end."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        processes = [start_http(argv, port)]
        try:
            yield processes
        finally:
            for process in processes:
                stop(process)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def restart(processes: list[subprocess.Popen[bytes]], argv: list[str], port: int) -> None:
    """Kill the upstream listening on `port`, start it again, and return once it answers HTTP."""
    _kill_listener(port)
    processes.append(start_http(argv, port))
    wait_until(answers(f"http://127.0.0.1:{port}/mcp", None), "the upstream back", process=processes[-1])


def gateway(tmp_path: Path, sources: str, more: str = "") -> Path:
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
        {sources}
        {more}
        """)


@contextlib.asynccontextmanager
async def listening(client: Client, mode: str, uri: str) -> AsyncIterator[None]:
    """Subscribe the outer client to `uri` on its wire (the gateway then subscribes upstream)."""
    if mode == "legacy":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.subscribe_resource(uri)
        yield
        return
    async with client.listen(resources_list_changed=True, resource_subscriptions=[uri]):
        yield


async def until_listed(client: Client, uri: str, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while uri not in await uris(client):
            await anyio.sleep(0.1)


# ---- item 3: caching hints count only when the upstream sent them ----------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_a_legacy_upstream_is_kept_for_the_source_ttl(mode: str, tmp_path: Path) -> None:
    """An upstream on the 2025-11-25 wire sends no ttlMs/cacheScope (the SDK's defaults, 0 and private, are not its
    word): reads are kept for the source's `ttl`, clients are told that ttl and `public`, and within `staleIfError`
    the kept copy is served while the upstream is down."""
    port = free_port()
    url = f"mcp+http://127.0.0.1:{port}/mcp"
    manifest = gateway(tmp_path, f"""
          up: {{url: "{url}", prefix: "test://", allowPrivateNetwork: true, ttl: 1m}}
          keep: {{url: "{url}", prefix: "test://", allowPrivateNetwork: true, ttl: 1s, staleIfError: 1h, timeout: 3s}}
        """, """
        resources:
          - {uri: "c://main", name: main, source: up, path: counter}
          - {uri: "c://keep", name: keep, source: keep, path: counter}
        """)

    with http_upstream([*UPSTREAM, "http", str(port)], port, UPSTREAM_WIRE="legacy", UPSTREAM_CHANGES="1") as procs:
        async def main() -> None:
            async with Client(serve(manifest), mode=mode, cache=None) as client:
                first = await client.read_resource("c://main")
                texts = {first.contents[0].text}
                for _ in range(5):
                    texts.add((await client.read_resource("c://main")).contents[0].text)
                assert texts == {first.contents[0].text}  # the upstream was asked once
                if mode != "legacy":
                    assert (first.ttl_ms, first.cache_scope) == (60_000, "public")
                kept = (await client.read_resource("c://keep")).contents[0].text
                stop(procs[0])
                await anyio.sleep(1.2)  # past the ttl: the upstream is asked, fails, and the kept copy is served
                assert (await client.read_resource("c://keep")).contents[0].text == kept

        anyio.run(main)


# ---- item 6: reads resume at once after an HTTP upstream restarts ----------------------------------------------------

UPSTREAMS = ["python-404", "python-400", "server-everything"]


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("mode", MODES)
def test_reads_resume_at_once_after_an_http_upstream_restarts(mode: str, upstream: str, tmp_path: Path) -> None:
    """The upstream restarts and forgets our session: the first read after it is back succeeds, whether it answers
    404 for the unknown session (the SDK) or 400 naming it (server-everything, and our copy with UPSTREAM_SESSION_400);
    nothing waits for the next health ping."""
    port = free_port()
    env: dict[str, str] = {}
    if upstream == "server-everything":
        argv = _everything_argv()
        if argv is None:
            pytest.skip(EVERYTHING_MISSING)
        env["PORT"] = str(port)
        uri = "ev+demo://resource/dynamic/text/1"
        expected = "Resource 1: "
    else:
        argv = [*UPSTREAM, "http", str(port)]
        env["UPSTREAM_WIRE"] = "legacy"
        if upstream == "python-400":
            env["UPSTREAM_SESSION_400"] = "1"
        uri = "ev+test://static-text"
        expected = "Hello from one"
    manifest = gateway(tmp_path, f"""
          ev: {{url: "mcp+http://127.0.0.1:{port}/mcp", namespace: ev, allowPrivateNetwork: true, ttl: 0s, staleIfError: 1h}}
          hint: {{url: "mcp+http://127.0.0.1:{port}/mcp", namespace: hint, allowPrivateNetwork: true, ttl: 1m}}
        """)

    with http_upstream(argv, port, **env) as processes:
        async def main() -> None:
            async with Client(serve(manifest), mode=mode, cache=None) as client:
                assert (await client.read_resource(uri)).contents[0].text.startswith(expected)
                hinted = await client.read_resource(uri.replace("ev+", "hint+", 1))
                if mode != "legacy":  # the upstream is on the legacy wire: it sent no hints, the source's ttl is told
                    assert (hinted.ttl_ms, hinted.cache_scope) == (60_000, "public")
                for _ in range(2):
                    await anyio.to_thread.run_sync(restart, processes, argv, port)
                    assert (await client.read_resource(uri)).contents[0].text.startswith(expected)

        anyio.run(main)


def test_a_read_while_the_upstream_is_down_waits_for_one_attempt_at_most() -> None:
    """After a loss, a read that finds the upstream down brings the next attempt forward and fails with it
    ("unavailable"), instead of waiting through attempt after attempt until its own timeout."""
    from aggregator.sources.base import SourceError
    from aggregator.upstream import HttpTarget, Upstream

    port = free_port()
    with http_upstream([*UPSTREAM, "http", str(port)], port) as processes:
        async def main() -> None:
            up = Upstream("t", HttpTarget(f"http://127.0.0.1:{port}/mcp", allow_private_network=True), timeout=20.0,
                          connect_timeout=5.0, backoff=(0.1, 30.0))
            try:
                assert (await up.read("test://static-text", 100)).first.data == b"Hello from one"
                stop(processes[0])
                for _ in range(3):
                    with pytest.raises(SourceError, match="unavailable"):
                        await up.read("test://static-text", 100)
            finally:
                await up.aclose()

        anyio.run(main)


def test_an_attempt_brought_forward_late_in_a_long_wait() -> None:
    """`Backoff.hurry()` more than `first` after the wait began starts the attempt at once (the runner used to die on
    a negative sleep there, and the upstream was never tried again)."""
    from aggregator.upstream.backoff import Backoff

    async def main() -> None:
        backoff = Backoff(0.01, 100.0)
        backoff.reset(recovering=True)
        for _ in range(8):  # scheduled waits: 0.01 s doubling to 2.56 s
            await backoff.wait()
        async with anyio.create_task_group() as tg:
            waited = anyio.Event()

            async def wait() -> None:
                await backoff.wait()
                waited.set()

            tg.start_soon(wait)
            await anyio.sleep(0.1)  # past `first`, well before the scheduled attempt (>= 2 s)
            assert backoff.hurry()
            with anyio.fail_after(1):
                await waited.wait()

    anyio.run(main)


# ---- item 8: no change notification lost between the upstream's stream and our relisting ------------------------------

@contextlib.contextmanager
def upstream_source(link: str, **env: str) -> Iterator[str]:
    """The manifest entry of source `up` (namespace up) for tests/upstream_server.py reached over `link`: `stdio`
    (the 2026-07-28 wire) or `http-legacy` (the 2025-11-25 wire: a session, notifications on its GET stream)."""
    if link == "stdio":
        yield f'{{url: "mcp+stdio:", namespace: up, command: {[*UPSTREAM, "stdio"]!r}, env: {({**ENV, **env})!r}}}'
        return
    port = free_port()
    with http_upstream([*UPSTREAM, "http", str(port)], port, UPSTREAM_WIRE="legacy", **env):
        yield f'{{url: "mcp+http://127.0.0.1:{port}/mcp", namespace: up, allowPrivateNetwork: true}}'


def up_gateway(tmp_path: Path, source: str) -> Path:
    return gateway(tmp_path, f"""
          up: {source}
        """)


@pytest.mark.parametrize("link", ["stdio", "http-legacy"])
@pytest.mark.parametrize("mode", MODES)
def test_a_change_told_while_we_relist_is_not_lost(mode: str, link: str, tmp_path: Path) -> None:
    """The upstream changes its list again while it answers the relisting its first change caused, and tells so
    before it answers with the list as it was: the listing under way is not kept, the gateway lists once more, and
    its clients see the second change too."""
    with upstream_source(link, UPSTREAM_CHANGES="1") as source:
        manifest = up_gateway(tmp_path, source)

        async def main() -> None:
            async with Client(serve(manifest), mode=mode, cache=None) as client:
                assert (await client.read_resource("up+test://race/r")).contents[0].text == "armed"
                await until_listed(client, "up+test://added/r-1")
                await until_listed(client, "up+test://added/r-2")

        anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_change_made_before_the_session_stream_opened_is_heard(mode: str, tmp_path: Path) -> None:
    """A 2025-11-25 HTTP upstream changes its list while our session has no event stream open yet (it holds the GET
    until then), so its list_changed goes nowhere: the gateway lists again once the stream opens."""
    with upstream_source("http-legacy", UPSTREAM_CHANGES="1", UPSTREAM_HOLD_GET="1") as source:
        manifest = up_gateway(tmp_path, source)

        async def main() -> None:
            async with Client(serve(manifest), mode=mode, cache=None) as client:
                assert "up+test://static-text" in await uris(client)
                assert (await client.read_resource("up+test://add/g")).contents[0].text == "added"
                await until_listed(client, "up+test://added/g")

        anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_no_event_falls_between_two_listen_streams(mode: str, tmp_path: Path) -> None:
    """A 2026-07-28 upstream: our client subscribes, so the gateway asks for a listen stream with the new filter; the
    upstream changes its list just as it opens that stream, telling only the streams already open: the gateway
    still hears it on the stream being replaced."""
    with upstream_source("stdio", UPSTREAM_CHANGES="1") as source:
        manifest = up_gateway(tmp_path, source)

        async def main() -> None:
            async with Client(serve(manifest), mode=mode, cache=None) as client:
                assert "up+test://static-text" in await uris(client)
                async with listening(client, mode, "up+test://static-text"):
                    with anyio.fail_after(15):
                        while not any(u.startswith("up+test://added/listen-") for u in await uris(client)):
                            await anyio.sleep(0.1)

        anyio.run(main)
