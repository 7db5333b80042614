"""Listen streams ended by the server (`Notifier.end_streams()`, as after a cluster reconnect): a client that listens
again hears what was told between the end of its stream and its new one, once. The official client, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

import aggregator.notify
from aggregator.notify import Notifier
from aggregator.server import build_server
from aggregator.service import ResourceService
from tests.conftest import write_manifest

URI = "note://a"


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[Client, Notifier]]:
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: replay}}
        resources:
          - {{uri: "{URI}", name: a, text: hi}}
        """)
    service = await ResourceService.open(manifest)
    notifier = Notifier()
    try:
        async with Client(build_server(service, notifier), mode="auto", cache=None) as client:
            yield client, notifier
    finally:
        await service.aclose()


async def _heard(sub: Any, seconds: float = 0.3) -> list[Any]:
    """What `sub` delivers within `seconds` (or until the server ends it)."""
    events: list[Any] = []
    with anyio.move_on_after(seconds):
        async for event in sub:
            events.append(event)
    return events


def test_what_is_told_while_a_client_listens_again_reaches_its_new_stream_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (client, notifier):
            async with client.listen(resource_subscriptions=[URI]) as sub:
                await notifier.updated([URI])
                with anyio.fail_after(5):
                    assert await sub.__anext__() == ResourceUpdated(uri=URI)
                notifier.end_streams()
                await notifier.updated([URI])  # after the end of this stream, before the next one
                with anyio.fail_after(5):
                    assert await _heard(sub, 5) == []  # the stream ends without it
            async with client.listen(resource_subscriptions=[URI]) as again:
                assert await _heard(again) == [ResourceUpdated(uri=URI)]
                await notifier.updated([URI])  # a live one, after the replay: heard once too
                assert await _heard(again) == [ResourceUpdated(uri=URI)]
                notifier.end_streams()  # again: what was told before this end was heard, and is not replayed
                assert await _heard(again, 5) == []
            async with client.listen(resource_subscriptions=[URI]) as third:
                assert await _heard(third) == []

    anyio.run(main)


def test_nothing_is_replayed_past_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregator.notify, "REPLAY_SECONDS", 0.2)

    async def main() -> None:
        async with served(tmp_path) as (client, notifier):
            notifier.end_streams()
            await notifier.updated([URI])
            await anyio.sleep(0.4)
            async with client.listen(resource_subscriptions=[URI]) as late:
                assert await _heard(late) == []

    anyio.run(main)


def test_past_the_limit_nothing_of_the_gap_is_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part of the gap would pass for all of it: past REPLAY_EVENTS the new stream hears none (its client learned
    of the gap from its stream's end), and what follows live."""
    monkeypatch.setattr(aggregator.notify, "REPLAY_EVENTS", 2)

    async def main() -> None:
        async with served(tmp_path) as (client, notifier):
            notifier.end_streams()
            for _ in range(3):
                await notifier.updated([URI])
            async with client.listen(resource_subscriptions=[URI]) as late:
                assert await _heard(late) == []
                await notifier.updated([URI])
                assert await _heard(late) == [ResourceUpdated(uri=URI)]

    anyio.run(main)
