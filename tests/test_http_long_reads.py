"""The HTTP fast path's watcher of long reads (aggregator/http_long_reads.py), driven turn by turn of the event loop
through its ASGI `receive` and `send`: a read that ends just as its watcher starts must still end it.

Once in CI a read of a cold herd through HAProxy never came back (tests/test_cluster_haproxy.py): its watcher had
taken the request's replayed body in the same turn as the read's end cancelled it, asyncio.wait_for (Python 3.11)
returned the message and dropped the cancel, and the watcher went on pinging with the read's answer waiting for it.
"""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from aggregator.http_long_reads import LongReads

END_WITHIN = 5.0
"""Seconds `end()` may take (it returns in a few turns of the loop; a watcher that lost its cancel never ends)."""


async def _end_after(turns: int, legacy: bool) -> list[str]:
    """Start a read, wait for its watcher, let `turns` turns of the loop pass, end it; what was sent after the end."""
    pending: list[Message] = [{"type": "http.request", "body": b"{}", "more_body": False}]  # the body the fast path replays
    client_stays = asyncio.Event()
    sent: list[str] = []

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await client_stays.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(str(message["type"]))

    reads = LongReads()
    read = reads.start(receive, send, legacy)
    while read.watcher is None:  # turn by turn: the watcher is seen in the turn after the one that made it
        await asyncio.sleep(0)
    for _ in range(turns):
        await asyncio.sleep(0)
    try:
        try:
            async with asyncio.timeout(END_WITHIN):
                await read.end()
        except TimeoutError:
            pytest.fail(f"end(), {turns} turn(s) of the loop after the watcher started, never returned (the "
                        f"watcher lost its cancel and runs on; sent {sent})")
        assert read.watcher.done(), "end() returned with its watcher still running"
        ended = len(sent)
        await asyncio.sleep(0.1)  # anything the watcher still sends shows up here
        return sent[ended:]
    finally:
        client_stays.set()


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "modern"])
def test_a_read_that_ends_as_its_watcher_starts_ends_the_watcher(legacy: bool) -> None:
    for turns in range(8):
        assert asyncio.run(_end_after(turns, legacy)) == [], turns
