"""An upstream's change events (aggregator.upstream.events) against real upstream processes (tests/upstream_server.py):
the listener that starts listening after a listing is told to look again only when a change may have gone unheard
since that listing began (an event that came with nobody listening, no event stream open), so the gateway lists its
upstream once at start (one request per page) and still hears what changed before it listened."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from aggregator.upstream import ListChanged, Upstream, UpstreamEvent
from aggregator.upstream.events import EventCallback
from tests.test_upstream import FAST, mcpserver
from tests.test_upstream_hostile import logged
from tests.test_upstream_scale import gateway, text

SETTLED = 3.0
"""Seconds after which the listing a listener's first event asks for would have been made (it is asked at once)."""
LEGACY = {"UPSTREAM_WIRE": "legacy"}


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
