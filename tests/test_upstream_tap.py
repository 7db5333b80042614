"""aggregator.upstream.tap over a real child's stdout: the lane's answers are claimed as the pipe delivers them,
every other line reaches the reader in order (cut at the cap, the last one without its newline too), and a reader
that lags stops the pipe being read until it catches up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import anyio
import pytest

from aggregator.upstream.lane import Lane
from aggregator.upstream.oversized import Oversized
from aggregator.upstream.tap import QUEUED_BYTES, tap

ANSWERING = r"""
import json, sys
print(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    answer = {"contents": [{"uri": request["params"]["uri"], "text": "hi"}]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": answer}) + "\n")
    sys.stdout.write("x" * 2000 + "\n")
    sys.stdout.write('{"jsonrpc":"2.0","id":7,"result":{}}\n')
    sys.stdout.flush()
sys.stdout.write("no newline")
"""

FLOODING = r"""
import sys
for i in range(LINES):
    sys.stdout.write(f"{i:08d}" + "y" * 992 + "\n")
sys.stdout.flush()
"""


async def _child(script: str) -> Any:
    return await anyio.open_process([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.mark.parametrize("uvloop", [False, True])
def test_lane_answers_are_claimed_and_the_rest_reaches_the_reader(uvloop: bool) -> None:
    async def main() -> None:
        async with await _child(ANSWERING) as process:
            lane = Lane(process.stdin.send)
            lane.negotiated("2025-11-25", {})
            stdout = tap(process, 1000, lane)
            assert stdout is not None
            with anyio.fail_after(30):
                answer = await lane.read("test://a", timeout=30)
            assert answer == {"contents": [{"uri": "test://a", "text": "hi"}]}
            await process.stdin.aclose()
            with anyio.fail_after(30):
                items = [item async for item in stdout]
        assert items[0] == b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {}}'
        assert isinstance(items[1], Oversized) and items[1].head.startswith(b"x") and items[1].tail
        assert items[2:] == [b'{"jsonrpc":"2.0","id":7,"result":{}}', b"no newline"]

    anyio.run(main, backend_options={"use_uvloop": uvloop})


@pytest.mark.parametrize("uvloop", [False, True])
@pytest.mark.parametrize("lines", [4 * QUEUED_BYTES // 1000])
def test_a_lagging_reader_pauses_the_pipe(lines: int, uvloop: bool) -> None:
    async def main() -> None:
        async with await _child(FLOODING.replace("LINES", str(lines))) as process:
            stdout = tap(process, 4096, Lane(process.stdin.send))
            assert stdout is not None
            transport = process._process.stdout._transport
            with anyio.fail_after(30):
                while transport.is_reading():  # nobody takes the lines: the pipe stops being read
                    await anyio.sleep(0.02)
            assert stdout._queued <= QUEUED_BYTES + 256 * 1024  # at most one read of the pipe past the bound
            with anyio.fail_after(30):
                got = [item async for item in stdout]
                await process.wait()
        assert len(got) == lines and all(isinstance(g, bytes) and g.startswith(b"%08d" % i) for i, g in enumerate(got))

    anyio.run(main, backend_options={"use_uvloop": uvloop})


@pytest.mark.parametrize("uvloop", [False, True])
def test_an_answer_is_claimed_in_the_pipe_callback_itself(uvloop: bool) -> None:
    """The bytes the pipe reads resolve the lane's read in that same callback: no turn of the event loop between the
    pipe and the read (asyncio's subprocess protocol defers each chunk to a later turn, a loop iteration per read, and
    so does uvloop's)."""

    async def main() -> None:
        async with await _child("import sys; sys.stdin.read()") as process:
            lane = Lane(process.stdin.send)
            lane.negotiated("2025-11-25", {})
            assert tap(process, 1000, lane) is not None
            reading = asyncio.ensure_future(lane.read("test://a", timeout=30))
            await asyncio.sleep(0)  # the read is written and waits for its answer
            (future,) = lane._waiting.values()
            pipe = process._process.stdout._transport
            pipe.get_protocol().data_received(b'{"jsonrpc":"2.0","id":"agg-1","result":{"contents":[]}}\n')
            assert future.done()  # resolved by the callback, not by a call it scheduled
            assert await reading == {"contents": []}
            await process.stdin.aclose()

    anyio.run(main, backend_options={"use_uvloop": uvloop})


PAGING = r"""
import json, sys
for line in sys.stdin:
    request = json.loads(line)
    resources = [{"uri": f"big://r{i}", "name": f"r{i}", "description": "},{\"]" * (i % 3)} for i in range(RESOURCES)]
    answer = {"jsonrpc": "2.0", "id": request["id"], "result": {"resources": resources, "nextCursor": "c]"}}
    sys.stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    sys.stdout.write('{"jsonrpc":"2.0","method":"notifications/message","params":{}}\n')
    sys.stdout.flush()
"""


@pytest.mark.parametrize("uvloop", [False, True])
def test_a_page_of_megabytes_is_not_parsed_in_one_call(uvloop: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing page of megabytes comes as one line: it is parsed a piece at a time as the pipe delivers it, the
    loop turning between pieces, not in one call of orjson once it ended (which held the loop for all of it: a
    worker thread would too, orjson holds the GIL). The page is what the whole line's parse gives, and the lines
    after it reach the reader after it."""
    resources = 100_000
    parses: list[tuple[int, int]] = []  # (bytes parsed in one call, loop turns so far)
    turns = [0]

    def counting(parse: Any) -> Any:
        def parse_counted(data: Any) -> Any:
            parses.append((len(data), turns[0]))
            return parse(data)
        return parse_counted

    import aggregator.upstream.lane as lane_module
    monkeypatch.setattr(lane_module, "loads_strict", counting(lane_module.loads_strict))
    pieces_module = sys.modules.get("aggregator.upstream.pieces")  # absent where pages are parsed whole
    if pieces_module is not None:
        monkeypatch.setattr(pieces_module, "loads_strict", counting(pieces_module.loads_strict))

    async def turning(stop: asyncio.Event) -> None:
        while not stop.is_set():
            turns[0] += 1
            await asyncio.sleep(0)

    async def main() -> None:
        async with await _child(PAGING.replace("RESOURCES", str(resources))) as process:
            lane = Lane(process.stdin.send)
            lane.negotiated("2025-11-25", {})
            stdout = tap(process, 64 * 1024 * 1024, lane)
            assert stdout is not None
            stop = asyncio.Event()
            turner = asyncio.ensure_future(turning(stop))
            with anyio.fail_after(60):
                page = await lane.list_resources(None)
            stop.set()
            await turner
            await process.stdin.aclose()
            with anyio.fail_after(30):
                items = [item async for item in stdout]
        assert page["nextCursor"] == "c]" and len(page["resources"]) == resources
        assert page["resources"][-1] == {"uri": f"big://r{resources - 1}", "name": f"r{resources - 1}",
                                         "description": "},{\"]" * ((resources - 1) % 3)}
        assert items == [b'{"jsonrpc":"2.0","method":"notifications/message","params":{}}']
        line_bytes = sum(size for size, _ in parses)
        assert line_bytes > 5_000_000
        biggest = max(size for size, _ in parses)
        assert biggest < 2 * 1024 * 1024, f"{biggest:,} bytes parsed in one call"
        assert parses[-1][1] > parses[0][1] + 4, "the loop did not turn between the page's first and last parse"

    anyio.run(main, backend_options={"use_uvloop": uvloop})
