"""The event-loop JSON relay floor: the JSON relay floor (benchmarks/peers/json_relay.py) built as the aggregator is,
on an event loop (uvloop when installed, as `aggregator serve` runs) with the pipes' protocol callbacks instead of a
blocking thread a direction. Every line is parsed and encoded again (orjson), nothing else: no ids rewritten, no
shape checked, no URI renamed.

Usage: python -m benchmarks.peers.loop_relay COMMAND [ARG...]

What a read through it costs over the JSON relay floor is what the event loop itself costs a hop (two more
callbacks and the loop's own system calls a message); a gateway on an event loop pays at least this.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

import orjson


class Lines(asyncio.Protocol):
    """A pipe read line by line: each whole line parsed and encoded again, handed to `sink`; `ended` at its end."""

    def __init__(self, sink: Callable[[bytes], None], ended: asyncio.Future[None]) -> None:
        self._sink, self._ended, self._rest = sink, ended, b""

    def data_received(self, data: bytes) -> None:
        chunk = self._rest + data if self._rest else data
        start = 0
        while end := chunk.find(b"\n", start) + 1:
            try:
                self._sink(orjson.dumps(orjson.loads(chunk[start:end]), option=orjson.OPT_APPEND_NEWLINE))
            except orjson.JSONDecodeError:
                pass  # not JSON: dropped, as the JSON relay floor's reader would stop on it
            start = end
        self._rest = chunk[start:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended.done():
            self._ended.set_result(None)


async def relay(argv: list[str]) -> int:
    """Run `argv` as the child, its stdout relayed to ours and our stdin to its, until our stdin ends; its exit
    code."""
    loop = asyncio.get_running_loop()
    child_in, ours_out = os.pipe()
    ours_in, child_out = os.pipe()
    child = await asyncio.create_subprocess_exec(*argv, stdin=child_in, stdout=child_out)
    os.close(child_in)
    os.close(child_out)
    to_child, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(ours_out, "wb", buffering=0))
    to_client, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(os.dup(1), "wb", buffering=0))
    child_gone, client_gone = loop.create_future(), loop.create_future()
    await loop.connect_read_pipe(lambda: Lines(to_client.write, child_gone), os.fdopen(ours_in, "rb", buffering=0))
    await loop.connect_read_pipe(lambda: Lines(to_child.write, client_gone), os.fdopen(os.dup(0), "rb", buffering=0))
    await asyncio.wait([client_gone, child_gone], return_when=asyncio.FIRST_COMPLETED)
    to_child.close()  # the client's end of file is the upstream's cue to exit
    return await child.wait()


def main(argv: list[str]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(relay(argv))
    return uvloop.run(relay(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
