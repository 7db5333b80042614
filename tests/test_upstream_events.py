"""An upstream's change events (aggregator.upstream.events) against real upstream processes (tests/upstream_server.py):
the listener that starts listening after a listing is told to look again only when a change may have gone unheard
since that listing began (an event that came with nobody listening, no event stream open), so the gateway lists its
upstream once at start (one request per page) and still hears what changed before it listened; after the upstream
restarts it lists it once more, not twice (the loss and the reconnect both ask for one listing, which covers both)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from aggregator.sources.base import SourceError
from aggregator.upstream import ListChanged, Updated, Upstream, UpstreamEvent
from aggregator.upstream.events import EventCallback
from tests.test_upstream import ENV, FAST, free_port, mcpserver
from tests.test_upstream_hostile import logged
from tests.test_upstream_links import UPSTREAM, http_upstream, restart
from tests.test_upstream_scale import gateway, gateway_over, text

SETTLED = 3.0
"""Seconds after which the listing a listener's first event asks for would have been made (it is asked at once)."""
LEGACY = {"UPSTREAM_WIRE": "legacy"}
PAGED = {"UPSTREAM_RESOURCES": "250", "UPSTREAM_LISTS": "100"}
"""257 resources in pages of 100: one listing is 3 resources/list requests (`test://listings` counts them)."""
LINKS = [("stdio", "legacy"), ("stdio", "modern"), ("http", "legacy"), ("http", "modern")]


def _recorder() -> tuple[list[UpstreamEvent], EventCallback]:
    events: list[UpstreamEvent] = []

    async def record(event: UpstreamEvent) -> None:
        events.append(event)

    return events, record


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_the_gateway_lists_its_upstream_once_at_start(wire: str, tmp_path: Path) -> None:
    """`aggregator serve` over a stdio upstream listing 257 resources in pages of 100, on either wire: one request
    per page at start (the catalog's listing), none more once its live side listens, and every entry is served."""
    manifest = gateway(tmp_path, "", UPSTREAM_RESOURCES="250", UPSTREAM_LISTS="100",
                       **(LEGACY if wire == "legacy" else {}))

    async def main() -> None:
        async with Client(logged(manifest, tmp_path / "serve.log"), mode="auto", cache=None) as client:
            await anyio.sleep(SETTLED)
            assert await text(client, "up+test://listings") == "3"
            listed = 0
            cursor = None
            while True:
                page = await client.list_resources(cursor=cursor)
                listed += sum(1 for r in page.resources if str(r.uri).startswith("up+test://res/"))
                if (cursor := page.next_cursor) is None:
                    break
            assert listed == 250
            assert await text(client, "up+test://listings") == "3"

    anyio.run(main)


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_listener_after_a_listing_is_not_told_of_changes_that_did_not_happen(wire: str) -> None:
    """Every event reaches the connection whether anyone listens or not (legacy: its notifications; modern: a listen
    stream is open from before the first call), so one that starts listening after a listing, with nothing told
    meanwhile, is told nothing."""
    async def main() -> None:
        events, record = _recorder()
        up = Upstream("t", mcpserver(UPSTREAM_CHANGES="1", **(LEGACY if wire == "legacy" else {})), **FAST)
        try:
            assert len((await up.list_resources()).items) > 0
            up.on_change(record)
            await anyio.sleep(SETTLED)
            assert events == []
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_change_before_anyone_listened_is_told_once_one_does(wire: str) -> None:
    """The upstream changes its list after our listing and before anyone listens: its list_changed came with nobody
    to hear it. The first listener is told to look again."""
    async def main() -> None:
        events, record = _recorder()
        up = Upstream("t", mcpserver(UPSTREAM_CHANGES="1", **(LEGACY if wire == "legacy" else {})), **FAST)
        try:
            assert "test://added/x" not in {r.uri for r in (await up.list_resources()).items}
            assert (await up.read("test://add/x", 1000)).first.data == b"added"
            await anyio.sleep(0.5)  # its notification, if any, has come
            up.on_change(record)
            with anyio.fail_after(10):
                while ListChanged() not in events:
                    await anyio.sleep(0.05)
            assert "test://added/x" in {r.uri for r in (await up.list_resources()).items}
        finally:
            await up.aclose()

    anyio.run(main)


def test_a_listener_that_stopped_and_listens_again_is_told_to_look() -> None:
    """What came while nobody listened after a listener stopped (its subscriptions dropped meanwhile) is not known:
    the next listener is told to look again."""
    async def main() -> None:
        events, record = _recorder()
        up = Upstream("t", mcpserver(**LEGACY), **FAST)
        try:
            await up.list_resources()
            up.on_change(record)
            up.on_change(None)
            up.on_change(record)
            with anyio.fail_after(10):
                while ListChanged() not in events:
                    await anyio.sleep(0.05)
        finally:
            await up.aclose()

    anyio.run(main)


@contextlib.contextmanager
def _upstream(tmp_path: Path, link: str, wire: str) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]], int]]:
    """A gateway manifest (a folder and tests/upstream_server.py as source `up`, namespace up, PAGED) whose upstream
    is a child over stdio (its pid in tmp_path/pid) or an HTTP server on the port given (processes: those started,
    for `restart`), on `wire`."""
    env = {**PAGED, **(LEGACY if wire == "legacy" else {})}
    if link == "stdio":
        yield gateway(tmp_path, "", UPSTREAM_PIDFILE=str(tmp_path / "pid"), **env), [], 0
        return
    port = free_port()
    with http_upstream([*UPSTREAM, "http", str(port)], port, **env) as processes:
        yield gateway_over(tmp_path, f'{{url: "mcp+http://127.0.0.1:{port}/mcp", namespace: up, '
                                     'allowPrivateNetwork: true}'), processes, port


async def _listings_settle(client: Client, at_least: int, since: float | None = None) -> int:
    """How many resources/list the upstream answered, once at least `at_least` and then none more for SETTLED, or
    for twice as long as they took to come `since` then (a relist asked meanwhile waits for twice as long as the last
    took: `RelistPace`, and one that waited for a reconnect took that long)."""
    with anyio.fail_after(30):
        while int(await text(client, "up+test://listings")) < at_least:
            await anyio.sleep(0.1)
    took = 0.0 if since is None else anyio.current_time() - since
    await anyio.sleep(SETTLED + 2 * took)
    return int(await text(client, "up+test://listings"))


@pytest.mark.parametrize(("link", "wire"), LINKS)
def test_an_upstream_is_listed_once_at_start_on_every_link(link: str, wire: str, tmp_path: Path) -> None:
    """Over stdio and Streamable HTTP, on either wire: the gateway's start lists its upstream once (3 requests, one
    per page) and not again while nothing changes (a legacy HTTP session's event stream opening after the listing
    began was taken for a gap, and the upstream listed twice)."""
    with _upstream(tmp_path, link, wire) as (manifest, _, _):
        async def main() -> None:
            async with Client(logged(manifest, tmp_path / "serve.log"), mode="auto", cache=None) as client:
                assert await _listings_settle(client, 3) == 3

        anyio.run(main)


@pytest.mark.parametrize(("link", "wire"), LINKS)
def test_an_upstream_that_restarts_is_listed_once_more(link: str, wire: str, tmp_path: Path) -> None:
    """The upstream is killed and comes back (stdio: the gateway starts the child again; HTTP: the server restarts,
    listing other resources): the new process is listed once (3 requests), what it lists differently is served, and
    nothing more is asked while nothing changes (the loss told the listener to look, the reconnect told it again, and
    the upstream was listed twice)."""
    with _upstream(tmp_path, link, wire) as (manifest, processes, port):
        async def main() -> None:
            async with Client(logged(manifest, tmp_path / "serve.log"), mode="auto", cache=None) as client:
                assert await _listings_settle(client, 3) == 3
                lost = anyio.current_time()
                if link == "stdio":
                    first = (tmp_path / "pid").read_text()
                    os.kill(int(first), signal.SIGKILL)
                    with anyio.fail_after(30):
                        while (tmp_path / "pid").read_text() == first:
                            await anyio.sleep(0.05)
                else:
                    os.environ["UPSTREAM_TAG"] = "two"  # http_upstream puts the environment back
                    await anyio.to_thread.run_sync(restart, processes, [*UPSTREAM, "http", str(port)], port)
                    with anyio.fail_after(30):
                        while "up+test://tag/two" not in {str(r.uri) for r in (await client.list_resources()).resources}:
                            await anyio.sleep(0.1)
                with anyio.fail_after(30):  # the new process answers reads
                    while True:
                        try:
                            await text(client, "up+test://listings")
                            break
                        except Exception:  # noqa: BLE001 - not back yet
                            await anyio.sleep(0.1)
                assert await _listings_settle(client, 3, since=lost) == 3

        anyio.run(main)


async def _killed(up: Upstream, pidfile: Path) -> None:
    """Kill the upstream's child and return once the connection is up again with another."""
    await up.connect()
    first = pidfile.read_text()
    os.kill(int(first), signal.SIGKILL)
    with anyio.fail_after(30):
        while up.status.reconnects < 1 or up.status.state != "connected" or pidfile.read_text() == first:
            await anyio.sleep(0.05)


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_listener_told_at_the_loss_is_not_told_again_at_the_reconnect(wire: str, tmp_path: Path) -> None:
    """The loss tells ListChanged; the listener has sent no listing since when the connection is back, so the one it
    sends from then on sees what changed meanwhile: the reconnect tells it Updated for what it wants, not ListChanged
    a second time (which cost a second listing)."""
    async def main() -> None:
        events, record = _recorder()
        up = Upstream("t", mcpserver(UPSTREAM_PIDFILE=str(tmp_path / "pid"),
                                     **(LEGACY if wire == "legacy" else {})), **FAST)
        up.on_change(record)
        up.subscribe(["test://static-text"])
        try:
            await _killed(up, tmp_path / "pid")
            with anyio.fail_after(10):
                while Updated("test://static-text") not in events:
                    await anyio.sleep(0.05)
            await up.list_resources()
            await anyio.sleep(SETTLED)
            assert events.count(ListChanged()) == 1, events
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_listing_owed_that_fails_is_asked_for_again(wire: str, tmp_path: Path) -> None:
    """The ListChanged the reconnect did not tell (the loss's was not followed by a listing yet) is told after all
    when the listing sent then fails (here past maxMessageBytes, the connection kept): the listener may have given
    up, and what changed while the upstream was down must not go unlisted."""
    async def main() -> None:
        events, record = _recorder()
        up = Upstream("t", mcpserver(UPSTREAM_PIDFILE=str(tmp_path / "pid"), UPSTREAM_RESOURCES="5000",
                                     **(LEGACY if wire == "legacy" else {})), max_message_bytes=64 * 1024, **FAST)
        up.on_change(record)
        try:
            await _killed(up, tmp_path / "pid")
            await anyio.sleep(0.5)  # what the reconnect tells, if anything, has come
            assert events == [ListChanged()]
            with pytest.raises(SourceError, match="maxMessageBytes"):
                await up.list_resources()
            with anyio.fail_after(10):
                while events.count(ListChanged()) < 2:
                    await anyio.sleep(0.05)
            assert up.status.reconnects == 1
        finally:
            await up.aclose()

    anyio.run(main)
