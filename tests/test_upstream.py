"""aggregator.upstream and the McpSource over real upstreams started here: a small MCPServer (tests/upstream_server.py)
over stdio and Streamable HTTP, aggregator itself (`serve` over stdio and `--http`), and a hostile stdio server;
the official client negotiates either wire (mode "legacy" or "auto")."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aggregator.sources.base import SourceError, SourceNotFound, SourceTooLarge
from aggregator.sources.mcp import McpBlob, McpSource
from aggregator.upstream import HttpTarget, ListChanged, StdioTarget, Updated, Upstream, UpstreamEvent
from tests.conftest import MODES, PNG_BYTES, write_manifest
from tests.isolation import free_port
from tests.served import start_listening
from tests.test_live import BASE, save

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENV = {"PYTHONPATH": str(ROOT)}
PNG = bytes.fromhex("89504e470d0a1a0a") + bytes(range(256))
FAST = {"timeout": 30.0, "connect_timeout": 30.0, "backoff": (0.05, 0.3)}
"""Short backoff; generous timeouts, none of which these tests wait out: a stdio child still importing on a loaded
machine took more than 5 s (a handshake is bounded by connect_timeout: tests/test_upstream_scale.py)."""


def mcpserver(**env: str) -> StdioTarget:
    return StdioTarget([sys.executable, str(HERE / "upstream_server.py"), "stdio"], env={**ENV, **env})


def aggregator(manifest: Path) -> StdioTarget:
    return StdioTarget([sys.executable, "-m", "aggregator", "serve", str(manifest)], env=ENV)


def start_http(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    """A server process, once it accepts connections on `port` (failing with its stderr if it does not)."""
    return start_listening(argv, port, env=ENV)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait(10)


@pytest.fixture
def http_upstream() -> Iterator[tuple[str, list[str], int]]:
    port = free_port()
    argv = [sys.executable, str(HERE / "upstream_server.py"), "http", str(port)]
    process = start_http(argv, port)
    try:
        yield f"http://127.0.0.1:{port}/mcp", argv, port
    finally:
        stop(process)


async def exercise(up: Upstream) -> None:
    """What every upstream of tests/upstream_server.py must answer, whatever the transport and wire."""
    listing = await up.list_resources()
    assert {"test://static-text", "test://static-binary", "test://tag/one"} <= {str(r.uri) for r in listing.items}
    assert not listing.truncated
    templates = {t.uri_template for t in (await up.list_templates()).items}
    assert templates == {"test://template/{id}/data", "test://header/{name}"}
    text = await up.read("test://static-text", 1000)
    assert (text.first.data, text.first.is_text, text.first.mime_type) == (b"Hello from one", True, "text/plain")
    blob = await up.read("test://static-binary", 1000)
    assert (blob.first.data, blob.first.is_text, blob.first.mime_type) == (PNG, False, "image/png")
    templated = await up.read("test://template/42/data", 1000)
    assert templated.first.data == b'{"id": "42"}'
    assert list((await up.complete("test://template/{id}/data", "id", "al")).values) == ["alpha", "alpine"]
    with pytest.raises(SourceNotFound):
        await up.read("test://nope", 1000)
    with pytest.raises(SourceTooLarge):
        await up.read("test://big", 1000)
    with pytest.raises(SourceError) as failed:
        await up.read("test://boom", 1000)
    # The upstream's text is operator detail (the read path maps SourceError to a fixed client message).
    assert type(failed.value) is SourceError
    assert up.status.state == "connected"


@pytest.mark.parametrize("mode", MODES)
def test_stdio_mcpserver(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "aggregator.upstream")

    async def main() -> None:
        up = Upstream("t", mcpserver(), mode=mode, **FAST)
        try:
            await exercise(up)
            assert up.status.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        finally:
            await up.aclose()
        assert up.status.state == "closed"
        with pytest.raises(SourceError):
            await up.read("test://static-text", 1000)

    anyio.run(main)
    # The child's stderr went to our log, a line at a time, and not to our own stderr.
    assert any("stderr: upstream starting on stdio" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", MODES)
def test_http_mcpserver(mode: str, http_upstream: tuple[str, list[str], int]) -> None:
    url, _, _ = http_upstream

    async def main() -> None:
        target = HttpTarget(url, headers={"Authorization": "Bearer s3cret"}, allow_private_network=True)
        up = Upstream("t", target, mode=mode, **FAST)
        try:
            await exercise(up)
            # The manifest's static headers go upstream (a caller's token never does: there is none to pass).
            assert (await up.read("test://header/authorization", 100)).first.data == b"Bearer s3cret"
            assert "s3cret" not in target.describe() and "s3cret" not in repr(target)
        finally:
            await up.aclose()

    anyio.run(main)


def test_stalled_upstream_times_out_and_the_cap_holds() -> None:
    async def main() -> None:
        up = Upstream("t", mcpserver(), timeout=1.0, connect_timeout=15.0, max_concurrency=2, backoff=(0.05, 0.3))
        try:
            await up.connect()
            started = time.monotonic()
            failures: list[Exception] = []

            async def hang() -> None:
                try:
                    await up.read("test://hang", 1000)
                except SourceError as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(hang)
            # Two at a time, each given one second: the last two time out waiting for a slot.
            assert len(failures) == 4 and all("no answer" in str(f) for f in failures)
            assert 0.9 < time.monotonic() - started < 3
            assert (await up.read("test://static-text", 1000)).first.data == b"Hello from one"
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_reads_share_the_pipe_with_the_sdk_and_given_up_ones_are_cancelled(mode: str) -> None:
    """Reads over stdio take the lean lane (aggregator/upstream/lane.py) beside the SDK's session on the same pipe:
    many at once, mixed with listings and completions, each gets its own answer; a read given up (its timeout) is
    cancelled upstream, as the SDK's client does."""
    async def main() -> None:
        up = Upstream("t", mcpserver(UPSTREAM_HANGING="1"), mode=mode, timeout=1.0, connect_timeout=30.0,
                      backoff=(0.05, 0.3))
        try:
            await up.connect()
            assert up._conn is not None and up._conn.lane is not None and up._conn.lane.ready
            seen: dict[str, bytes] = {}

            async def read(uri: str) -> None:
                seen[uri] = (await up.read(uri, 1000)).first.data

            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(read, f"test://template/{i}/data")
                    if i % 10 == 0:
                        tg.start_soon(up.list_resources)
                        tg.start_soon(up.complete, "test://template/{id}/data", "id", "al")
            assert seen == {f"test://template/{i}/data": f'{{"id": "{i}"}}'.encode() for i in range(40)}
            with pytest.raises(SourceError, match="no answer"):
                await up.read("test://hang", 1000)
            with anyio.fail_after(10):
                while (await up.read("test://hanging", 100)).first.data != b"0":
                    await anyio.sleep(0.05)
        finally:
            await up.aclose()

    anyio.run(main)


def test_ssrf_guard() -> None:
    with pytest.raises(SourceError, match="refused"):
        HttpTarget("http://127.0.0.1:1/mcp")
    with pytest.raises(SourceError, match="refused"):
        HttpTarget("http://[::ffff:10.0.0.1]/mcp")
    with pytest.raises(SourceError):
        HttpTarget("http://user:pw@example.com/mcp")

    async def main() -> None:
        # A name is resolved by the guard: localhost reaches only loopback, which is refused.
        for allow in (False, ["10.0.0.0/8"]):
            up = Upstream("t", HttpTarget("http://localhost:9/mcp", allow_private_network=allow), **FAST)
            try:
                with pytest.raises(SourceError, match="unavailable"):
                    await up.connect()
                assert up.status.state == "failed" and "refused" in (up.status.last_error or "")
            finally:
                await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_aggregator_upstream_stdio(mode: str, docs_manifest: Path) -> None:
    async def main() -> None:
        up = Upstream("agg", aggregator(docs_manifest), mode=mode, **FAST)
        source = McpSource("agg", up)
        try:
            listing = await up.list_resources()  # pageSize 5: four pages
            assert len(listing.items) == 17 and not listing.truncated
            listed = {str(r.uri) for r in listing.items}
            assert len(listed) == 17 and "docs://readme" in listed
            templates = {t.uri_template for t in (await source.templates()).items}
            assert {"file://docs/{+path}", "page://{name}"} <= templates
            guides = await source.list("docs://guides/*.md")
            assert len(guides) == 6 and all(i.path.startswith("docs://guides/") for i in guides)
            logo = await source.read("img://logo", 4096)
            assert isinstance(logo, McpBlob) and logo.data == PNG_BYTES and logo.mime_type == "image/png"
            if mode == "auto":
                assert logo.ttl_ms == 90_000 and logo.cache_scope in ("public", "private")
            assert (await source.stat("docs://readme")).path == "docs://readme"
            # A templated URI is not listed; it exists because it reads.
            assert (await source.stat("page://page01")).size == len(b"# Page 1\n\nBody 1.\n")
            with pytest.raises(SourceNotFound):
                await source.stat("page://nope")
            assert await source.version("docs://readme") == await source.version("docs://readme") is not None
            # A read carries no version: one would cost a hash of every read, and revalidating reads it all again.
            assert (await source.read("docs://readme", 4096)).version is None
            assert (await source.stat("page://page01")).version == await source.version("page://page01") is not None
            assert await source.version("page://nope") is None
            with pytest.raises(SourceTooLarge):
                await source.read("file://docs/data.json", 4)
            completed = await source.complete("page://{name}", "name", "page0")
            assert completed and all(v.startswith("page0") for v in completed)
            # A cap on pages keeps a prefix and says so.
            capped = Upstream("capped", up.target, mode=mode, max_pages=2, **FAST)
            try:
                listing = await capped.list_resources()
            finally:
                await capped.aclose()
            assert listing.truncated and len(listing.items) == 10
        finally:
            await source.aclose()

    anyio.run(main)


def test_hostile_upstream() -> None:
    async def main() -> None:
        up = Upstream("h", StdioTarget([sys.executable, str(HERE / "hostile_upstream.py")]), mode="legacy",
                      timeout=1.0, connect_timeout=15.0, max_pages=50, max_message_bytes=1024 * 1024,
                      backoff=(0.05, 0.3))
        try:
            with pytest.raises(SourceError, match="malformed|error"):
                await up.list_resources()
            looped = await up.list_templates()  # the cursor repeats: one more page, then it stops
            assert looped.truncated and len(looped.items) == 2
            # A message past max_message_bytes is skipped, never buffered: the call it answered fails, whether its
            # id comes last (the line read to its end) or first (failed at once, though the line never ends), and
            # the connection is kept.
            with pytest.raises(SourceError, match="maxMessageBytes"):
                await up.read("x://huge-tail", 1000)
            assert up.status.reconnects == 0 and up.status.state == "connected"
            # A message whose call cannot be told (a notification) ends the connection: nothing waits in vain.
            with pytest.raises(SourceError, match="maxMessageBytes"):
                await up.read("x://huge-note", 1000)
            with anyio.fail_after(10):
                while up.status.reconnects < 1 or up.status.state != "connected":
                    await anyio.sleep(0.05)
            started = time.monotonic()
            with pytest.raises(SourceError, match="maxMessageBytes"):
                await up.read("x://huge", 1000)
            assert time.monotonic() - started < 0.9  # not the call's 1 s timeout
            assert up.status.reconnects == 1
            started = time.monotonic()
            with pytest.raises(SourceError, match="no answer"):
                await up.read("x://a", 1000)  # half a line, then silence
            assert time.monotonic() - started < 2.5
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_stdio_reconnects_after_the_child_is_killed(mode: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    async def main() -> None:
        events: list[UpstreamEvent] = []

        async def record(event: UpstreamEvent) -> None:
            events.append(event)

        up = Upstream("t", mcpserver(UPSTREAM_PIDFILE=str(pidfile)), mode=mode, **FAST)
        up.on_change(record)
        up.subscribe(["test://static-text"])
        try:
            await up.connect()
            first = int(pidfile.read_text())
            os.kill(first, signal.SIGKILL)
            with anyio.fail_after(10):
                while up.status.reconnects < 1 or up.status.state != "connected":
                    await anyio.sleep(0.05)
            assert int(pidfile.read_text()) != first
            assert (await up.read("test://static-text", 1000)).first.data == b"Hello from one"
            # Changes may have been missed while down: the listener is told to look again.
            with anyio.fail_after(5):
                while Updated("test://static-text") not in events:
                    await anyio.sleep(0.05)
            assert ListChanged() in events
        finally:
            await up.aclose()
        assert up.status.reconnects == 1
        # Closing stopped the child (and reaped it).
        import psutil

        second = int(pidfile.read_text())
        assert not psutil.pid_exists(second) or psutil.Process(second).status() == psutil.STATUS_ZOMBIE

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_http_upstream_restarts(mode: str, http_upstream: tuple[str, list[str], int]) -> None:
    url, argv, port = http_upstream

    async def read_soon() -> bytes:
        with anyio.fail_after(10):
            while True:
                try:
                    return (await up.read("test://static-text", 1000)).first.data
                except SourceError:
                    await anyio.sleep(0.1)

    up = Upstream("t", HttpTarget(url, allow_private_network=True), mode=mode, **FAST)

    async def main() -> None:
        servers: list[subprocess.Popen[bytes]] = []
        try:
            assert (await up.read("test://static-text", 1000)).first.data == b"Hello from one"
            # Down: reads fail (no waiting for it), then it comes back on the same port.
            _kill_listener(port)
            with pytest.raises(SourceError):
                await up.read("test://static-text", 1000)
            servers.append(await anyio.to_thread.run_sync(start_http, argv, port))
            assert await read_soon() == b"Hello from one"
            assert up.status.state == "connected" and up.status.reconnects >= 1
        finally:
            for server in servers:
                stop(server)
            await up.aclose()

    anyio.run(main)


def _kill_listener(port: int) -> None:
    import psutil

    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            os.kill(conn.pid, signal.SIGKILL)
            while psutil.pid_exists(conn.pid) and psutil.Process(conn.pid).status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.02)
            return
    raise AssertionError(f"nothing listens on {port}")


@pytest.mark.parametrize("mode", MODES)
def test_list_changed_and_updated_from_aggregator(mode: str, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, BASE)

    async def main() -> None:
        events: list[UpstreamEvent] = []
        arrived = anyio.Event()

        async def record(event: UpstreamEvent) -> None:
            events.append(event)
            arrived.set()

        async def expect(event: UpstreamEvent) -> None:
            with anyio.fail_after(8):
                while event not in events:
                    await anyio.sleep(0.05)
            events.clear()

        source = McpSource("agg", Upstream("agg", aggregator(manifest), mode=mode, **FAST))
        source.watch(record)
        source.subscribe(["docs://a.md"])
        try:
            assert [i.path for i in await source.list("**")] == ["docs://a.md"]
            await anyio.sleep(0.8)  # the upstream's watchers and our subscription are up
            save(manifest, BASE + 'resources:\n  - {uri: "note://h", name: h, text: hi}\n')
            await expect(ListChanged())
            assert "note://h" in [str(r.uri) for r in (await source.listing(fresh=True)).items]
            (docs / "a.md").write_text("# A changed\n")
            await expect(Updated("docs://a.md"))
            assert (await source.read("docs://a.md", 100)).data == b"# A changed\n"
        finally:
            await source.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_aggregator_upstream_http(mode: str, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n")
    manifest = write_manifest(tmp_path, BASE)
    port = free_port()
    process = start_http([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port)], port)

    async def main() -> None:
        events: list[UpstreamEvent] = []

        async def record(event: UpstreamEvent) -> None:
            events.append(event)

        source = McpSource("agg", Upstream("agg", HttpTarget(f"http://127.0.0.1:{port}/mcp",
                                                             allow_private_network=["127.0.0.0/8"]), mode=mode, **FAST))
        source.watch(record)
        source.subscribe(["docs://a.md"])
        try:
            assert [i.path for i in await source.list("docs://*")] == ["docs://a.md"]
            assert (await source.read("docs://a.md", 100)).data == b"# A\n"
            await anyio.sleep(0.8)
            (docs / "a.md").write_text("# A over HTTP\n")
            with anyio.fail_after(8):
                while Updated("docs://a.md") not in events:
                    await anyio.sleep(0.05)
        finally:
            await source.aclose()

    try:
        anyio.run(main)
    finally:
        stop(process)


def test_stderr_lines_are_cut() -> None:
    """The child's stderr a line at a time: a line over the limit is cut there, the rest of it skipped."""
    from aggregator.upstream.stdio import _lines

    async def main() -> None:
        assert await collect(_lines, [b"a\nb", b"c\n", b"\nd"], 10) == [b"a", b"bc", b"", b"d"]
        assert await collect(_lines, [b"12345", b"67890", b"1\nnext\n", b"x" * 30], 10) == [
            b"1234567890", b"next", b"xxxxxxxxxx"]

    anyio.run(main)


async def collect(lines: Any, chunks: list[bytes], limit: int) -> list[Any]:
    """What `lines(stream, limit)` yields for a stream giving `chunks`."""
    send, receive = anyio.create_memory_object_stream[bytes](len(chunks))
    for chunk in chunks:
        send.send_nowait(chunk)
    send.close()

    class Stream:
        async def receive(self) -> bytes:
            return await receive.receive()

    return [line async for line in lines(Stream(), limit)]


def test_unreachable_stdio_upstreams() -> None:
    with pytest.raises(SourceError):
        StdioTarget([])

    async def main() -> None:
        missing = Upstream("m", StdioTarget(["/nonexistent/upstream"]), **FAST)
        silent = Upstream("s", StdioTarget(["sleep", "30"]), mode="legacy",
                          timeout=5.0, connect_timeout=1.0, backoff=(5.0, 5.0))
        try:
            with pytest.raises(SourceError, match="unavailable"):
                await missing.connect()
            assert missing.status.state == "failed" and "FileNotFoundError" in (missing.status.last_error or "")
            started = time.monotonic()
            with pytest.raises(SourceError, match="unavailable"):
                await silent.read("x://a", 10)
            assert time.monotonic() - started < 4
            assert "no connection within 1s" in (silent.status.last_error or "")
        finally:
            await missing.aclose()
            await silent.aclose()

    anyio.run(main)



def test_a_connection_task_that_dies_says_so(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception that ends the connection's (detached) task is logged, naming the source, and calls
    fail at once instead of waiting for a task that is gone."""
    from aggregator.upstream.backoff import Backoff

    async def broken(self: Backoff) -> None:
        raise RuntimeError("a bug between two attempts")

    monkeypatch.setattr(Backoff, "wait", broken)  # the one fault injected: our own code failing outside a session
    caplog.set_level(logging.INFO, "aggregator.upstream")

    async def main() -> None:
        up = Upstream("dying", StdioTarget(["/nonexistent/upstream"]), **FAST)
        try:
            with pytest.raises(SourceError, match="unavailable"):
                await up.connect()
            await anyio.sleep(0.2)  # the task's end is seen by its done callback, on the loop
            with anyio.fail_after(2):
                with pytest.raises(SourceError):
                    await up.read("x://a", 10)
            assert up.status.state == "failed"
        finally:
            await up.aclose()

    anyio.run(main)
    died = [r for r in caplog.records if r.levelno >= logging.ERROR and "dying" in r.getMessage()]
    assert died and "RuntimeError: a bug between two attempts" in died[0].getMessage(), \
        [r.getMessage() for r in caplog.records]


# The McpSource behind the read path and aggregator serving aggregator: tests/test_mcp_kind.py (the `mcp` kind).
