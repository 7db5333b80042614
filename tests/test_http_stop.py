"""A second stop over HTTP (aggregator.http_stop): a request in flight is cancelled from inside and its answer ended
as well as it can be: 503 when none had started, its last chunk when it was streaming; later requests get 503."""

from __future__ import annotations

from typing import Any

import anyio

from aggregator.http_stop import STOPPING, Abandonable

SCOPE = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}


async def _receive() -> dict[str, Any]:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def _run(stream: bool) -> list[dict[str, Any]]:
    """What `Abandonable` sends for one request abandoned while its app waits forever (after starting a streamed
    answer when `stream`), then for a request that comes after."""
    sent: list[dict[str, Any]] = []
    waiting = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def forever(scope: Any, receive: Any, send: Any) -> None:
        if stream:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"event: ping\n\n", "more_body": True})
        waiting.set()
        await anyio.sleep_forever()

    async def main() -> None:
        stopper = Abandonable(forever)
        async with anyio.create_task_group() as tg:
            tg.start_soon(stopper, SCOPE, _receive, send)
            await waiting.wait()
            stopper.abandon()
        with anyio.fail_after(5):
            await stopper(SCOPE, _receive, send)  # after the stop: answered at once

    anyio.run(main)
    return sent


def test_an_abandoned_request_that_had_not_answered_gets_503_and_so_does_a_later_one() -> None:
    sent = _run(stream=False)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [503, 503]
    assert all((b"connection", b"close") in m["headers"] for m in starts)
    assert [m["body"] for m in sent if m["type"] == "http.response.body"] == [STOPPING, STOPPING]


def test_an_abandoned_stream_is_ended_with_its_last_chunk() -> None:
    sent = _run(stream=True)
    first = sent[:3]
    assert [m["type"] for m in first] == ["http.response.start", "http.response.body", "http.response.body"]
    assert first[2] == {"type": "http.response.body", "body": b"", "more_body": False}
