"""Upstreams at scale (issue 26 item 4), through the real gateway: the official client on both wires against
`aggregator serve` whose `mcp` source is tests/upstream_server.py with its scale knobs (`UPSTREAM_RESOURCES`,
`UPSTREAM_LISTS`, `UPSTREAM_FLOOD`). A listing stops at `maxEntries` (and at maxEntries/10 pages) and says so once;
URIs past the cap still read under a namespace; a message past `maxMessageBytes` fails what it answered, not the
server; a flood of list_changed costs a listing a second at most; a slow legacy `initialize` waits for
`connect_timeout`, not for one call's timeout."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from aggregator.sources.base import SourceError
from aggregator.upstream import HttpTarget, StdioTarget, Upstream
from tests.conftest import MODES, write_manifest
from tests.test_upstream import ENV, HERE, http_upstream  # noqa: F401 - a fixture
from tests.test_upstream_hostile import docs_folder, logged

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]
OWN = {"test://static-text", "test://static-binary", "test://big", "test://hang", "test://boom", "test://tag/one",
       "test://listings"}
"""What the upstream lists before its generated `test://res/{i}` (with any scale knob set)."""


def gateway(tmp_path: Path, settings: str, **env: str) -> Path:
    """A manifest serving a folder and the upstream (namespace up) with these source `settings` and knobs."""
    return gateway_over(tmp_path, f'{{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, '
                                  f'env: {({**ENV, **env})!r}{settings}}}')


def gateway_over(tmp_path: Path, up: str) -> Path:
    """A manifest serving a folder and source `up` (its manifest entry)."""
    docs_folder(tmp_path)
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: gateway}}
        defaults: {{ttl: 0s}}
        sources:
          docs: {{url: ./docs}}
          up: {up}
        collections:
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
        """)


async def all_uris(client: Client) -> list[str]:
    """Every URI the server lists, cursors followed."""
    found: list[str] = []
    cursor = None
    while True:
        page = await client.list_resources(cursor=cursor)
        found += [str(r.uri) for r in page.resources]
        cursor = page.next_cursor
        if cursor is None:
            return found


async def text(client: Client, uri: str) -> str:
    content = (await client.read_resource(uri)).contents[0]
    assert hasattr(content, "text"), content
    return str(content.text)


def cut_warnings(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "cut short" in line]


@pytest.mark.parametrize("mode", MODES)
def test_a_listing_stops_at_max_entries_and_reads_go_past_it(mode: str, tmp_path: Path) -> None:
    """maxEntries 100 over 250 generated entries in pages of 40: 100 listed, one warning naming the source, and an
    entry past the cap (never listed) reads from the upstream through the namespace."""
    manifest = gateway(tmp_path, ", maxEntries: 100", UPSTREAM_RESOURCES="250", UPSTREAM_LISTS="40")
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode=mode, cache=None) as client:
            listed = [uri for uri in await all_uris(client) if uri.startswith("up+")]
            assert len(listed) == 100
            assert {f"up+{uri}" for uri in OWN} <= set(listed)
            assert "up+test://res/249" not in listed
            assert await text(client, "up+test://res/249") == "res 249"
            assert await text(client, "up+test://res/0") == "res 0"
            assert await text(client, "docs://a.md") == "# A\n"
            with pytest.raises(MCPError):  # forwarded, and the upstream has none
                await client.read_resource("up+test://res/nope")

    anyio.run(main)
    said = cut_warnings(log)
    assert len(said) == 1, log.read_text()
    assert "(up)" in said[0] and "maxEntries" in said[0] and "100 entries kept" in said[0]


def test_a_listing_follows_at_most_max_entries_over_ten_pages(tmp_path: Path) -> None:
    """Pages of 5 under maxEntries 100: ten pages, 50 entries, cut there (an upstream giving tiny pages cannot
    keep a listing going)."""
    manifest = gateway(tmp_path, ", maxEntries: 100", UPSTREAM_RESOURCES="250", UPSTREAM_LISTS="5")
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode="auto", cache=None) as client:
            listed = [uri for uri in await all_uris(client) if uri.startswith("up+")]
            assert len(listed) == 50
            count = int(await text(client, "up+test://listings"))
            assert count >= 1

    anyio.run(main)
    said = cut_warnings(log)
    assert len(said) == 1 and "10 pages" in said[0] and "(up)" in said[0], log.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_a_message_past_max_message_bytes_fails_what_it_answered(mode: str, tmp_path: Path) -> None:
    """maxMessageBytes 64KiB: the listing (5,000 entries in one page, about 400 KB) and the read of test://big
    (100 KB) fail, said in the log with the source and the setting; the folder keeps serving, and so does the
    upstream for what fits (a forwarded read)."""
    manifest = gateway(tmp_path, ", maxMessageBytes: 64KiB", UPSTREAM_RESOURCES="5000")
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode=mode, cache=None) as client:
            listed = await all_uris(client)
            assert listed == ["docs://a.md"]
            with pytest.raises(MCPError):
                await client.read_resource("up+test://big")
            assert await text(client, "up+test://static-text") == "Hello from one"
            assert await text(client, "docs://a.md") == "# A\n"
            # The failed listing is not tried again and again: the connection was kept, so nothing asks for it.
            listings = int(await text(client, "up+test://listings"))
            await anyio.sleep(1.5)
            assert int(await text(client, "up+test://listings")) == listings

    anyio.run(main)
    assert "connection lost" not in log.read_text()
    said = [line for line in log.read_text().splitlines() if "maxMessageBytes" in line]
    assert any("(up)" in line and "resources/list" in line for line in said), log.read_text()
    assert any("65,536 bytes" in line for line in said), log.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_an_http_answer_past_max_message_bytes_fails_that_call(mode: str, http_upstream: tuple[str, list[str],
                                                                                                 int]) -> None:
    """Over Streamable HTTP too: the read of test://big (100 KB) under a 64 KiB cap fails with the cap in its
    error (the SDK's SSE limit on the legacy wire, ours on JSON answers), and the next read is served."""
    url, _, _ = http_upstream

    async def main() -> None:
        up = Upstream("up", HttpTarget(url, allow_private_network=True), mode=mode, timeout=30.0,
                      max_message_bytes=64 * 1024, backoff=(0.05, 0.3))
        try:
            with pytest.raises(SourceError, match=r"65,?536 byte"):
                await up.read("test://big", 10**6)
            assert (await up.read("test://static-text", 1000)).first.data == b"Hello from one"
        finally:
            await up.aclose()

    anyio.run(main)


async def only_the_big_ones_fail(up: Upstream, big: list[str]) -> None:
    """Reads of test://static-text in flight beside the `big` calls (each answered past the cap) are all served:
    the cap fails the call it answered, never its neighbours; the connection is kept."""
    failed: list[str] = []
    served: list[bytes] = []

    async def call(what: str) -> None:
        try:
            if what == "list":
                await up.list_resources()
            else:
                await up.read(what, 10**6)
        except SourceError as exc:
            assert "maxMessageBytes" in str(exc) and "65,536 bytes" in str(exc), exc
            failed.append(what)

    async def small() -> None:
        served.append((await up.read("test://static-text", 1000)).first.data)

    await up.connect()
    for _ in range(3):
        async with anyio.create_task_group() as tg:
            for what in big:
                tg.start_soon(call, what)
            for _ in range(20):
                tg.start_soon(small)
        assert sorted(failed) == sorted(big) and served == [b"Hello from one"] * 20
        failed.clear(), served.clear()
    assert up.status.reconnects == 0 and up.status.state == "connected"


@pytest.mark.parametrize("mode", MODES)
def test_a_stdio_answer_past_max_message_bytes_fails_its_call_not_its_neighbours(mode: str) -> None:
    """A 400 KB listing and a 100 KB read under a 64 KiB cap, with reads in flight beside them on the same pipe
    (the SDK's and the read lane's): those two fail, every other read is served, and nothing reconnects."""
    target = StdioTarget(UPSTREAM, env={**ENV, "UPSTREAM_RESOURCES": "5000"})

    async def main() -> None:
        up = Upstream("up", target, mode=mode, timeout=30.0, max_message_bytes=64 * 1024, backoff=(0.05, 0.3))
        try:
            await only_the_big_ones_fail(up, ["list", "test://big"])
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_http_answer_past_max_message_bytes_fails_its_call_not_its_neighbours(
        mode: str, http_upstream: tuple[str, list[str], int]) -> None:
    """Over Streamable HTTP (JSON answers on the modern wire, SSE events on the legacy one) the same holds."""
    url, _, _ = http_upstream

    async def main() -> None:
        up = Upstream("up", HttpTarget(url, allow_private_network=True), mode=mode, timeout=30.0,
                      max_message_bytes=64 * 1024, backoff=(0.05, 0.3))
        try:
            await only_the_big_ones_fail(up, ["test://big"])
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_list_changed_flood_is_coalesced(mode: str, tmp_path: Path) -> None:
    """1,000 list_changed over about 3 s: the gateway lists the upstream at most once a second (RelistPace's
    floor) plus the one at once and the one queued, where each event alone would list it hundreds of times."""
    manifest = gateway(tmp_path, "", UPSTREAM_FLOOD="1000", UPSTREAM_FLOOD_SECONDS="3")

    async def main() -> None:
        async with Client(logged(manifest, tmp_path / "serve.log"), mode=mode, cache=None) as client:
            before = int(await text(client, "up+test://listings"))
            started = time.monotonic()
            assert await text(client, "up+test://flood/go") == "1000"
            # Settled: no listing for longer than the pace allows between two (the queued one comes within ~1 s).
            count, still = int(await text(client, "up+test://listings")), 0
            while still < 3:
                await anyio.sleep(1.0)
                now = int(await text(client, "up+test://listings"))
                still, count = (still + 1, count) if now == count else (0, now)
            elapsed = time.monotonic() - started
            assert count - before <= math.ceil(elapsed) + 2, (count - before, elapsed)
            assert count - before >= 1

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_legacy_initialize_waits_for_connect_timeout(mode: str) -> None:
    """A legacy stdio upstream answering initialize after 2 s, under a 0.5 s call timeout and a 20 s
    connect_timeout: it connects (the handshake is bounded by connect_timeout), and calls keep their own bound."""
    target = StdioTarget(UPSTREAM, env={**ENV, "UPSTREAM_WIRE": "legacy", "UPSTREAM_SLOW_INIT": "2"})

    async def main() -> None:
        up = Upstream("slow", target, mode=mode, timeout=0.5, connect_timeout=20.0, backoff=(0.05, 0.3))
        try:
            await up.connect()  # a call waiting for the connection would be bounded by its own timeout
            listing = await up.list_resources()
            assert "test://static-text" in {r.uri for r in listing.items}
            assert up.status.protocol_version == "2025-11-25"
            with pytest.raises(Exception, match="no answer to resources/read within 0.5s"):
                await up.read("test://hang", 1000)
        finally:
            await up.aclose()

    anyio.run(main)


def test_a_forwarded_uri_resolves_to_the_source_with_its_access() -> None:
    """What Catalog.resolve gives an unlisted URI under a namespaced source's prefix: the upstream URI as the path,
    the source's access, a type guessed from the name that the upstream's own type overrides; nothing outside it."""
    from aggregator.catalog import Catalog, FileTarget
    from aggregator.errors import ResourceNotFound

    catalog = Catalog([], [], forwards={"up+": ("up", frozenset({"wiki"})), "up+docs://": ("deep", frozenset())})
    target = catalog.resolve("up+test://res/9.md")
    assert isinstance(target, FileTarget)
    assert (target.source, target.path, target.access, target.mime_declared) == (
        "up", "test://res/9.md", frozenset({"wiki"}), False)
    deeper = catalog.resolve("up+docs://a.md")  # the longest prefix wins
    assert isinstance(deeper, FileTarget) and (deeper.source, deeper.path) == ("deep", "a.md")
    for unknown in ("up+", "other+test://x", "test://res/9.md"):
        with pytest.raises(ResourceNotFound):
            catalog.resolve(unknown)
