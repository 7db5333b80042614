"""A stdio child's stdout taken as the pipe delivers it: the lines that answer the read lane are claimed in the
pipe's own callback, everything else goes to the reader task in order.

Through the stream a lane answer woke the reader task, which parsed it and woke the read: two turns of the event
loop and the stream's and the line iterator's machinery per read, a good part of a hop (benchmarks/upstream_hop.py).
Here the answer resolves the read's future where the bytes arrive: in the pipe transport's own `data_received`
(`_Direct` stands in for asyncio's or uvloop's subprocess pipe protocol, which defers every chunk to a later turn of
the loop through `call_soon`: one more loop iteration per read). Lines are split and bounded as
`oversized.lines` does (a line past the cap is skipped as it streams, never buffered). What waits for the reader task
is bounded too: past `QUEUED_BYTES` the pipe stops being read until the task catches up, as the stream's own buffer
did.

It is installed on asyncio's `StreamReader` of the child's stdout (the one anyio's process wraps), whose protocol
hands it every chunk (`feed_data`), the end (`feed_eof`) or a failure (`set_exception`); where that is not what
the process offers, `tap` returns None and the stream is read as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aggregator.direct_pipe import feed_directly
from aggregator.upstream.lane import ID_MARK, Lane, parsed
from aggregator.upstream.oversized import LineSplitter, Oversized
from aggregator.upstream.pieces import HEAD, START, Pieces

__all__ = ["QUEUED_BYTES", "StdoutTap", "tap"]

QUEUED_BYTES = 256 * 1024
"""Bytes of lines waiting for the reader task past which the pipe is no longer read (until the task takes them)."""

Item = bytes | Oversized | None
_NEAR_END = 64
"""Bytes at each end of a line where an answer's id is looked for first."""


class StdoutTap(LineSplitter):
    """The lines of one child's stdout: lane answers claimed as they arrive, the rest iterated by one reader task
    (`async for`), ending when the pipe does (after a None: a line past the skip budget). It splits them itself (a
    `LineSplitter`)."""

    def __init__(self, reader: asyncio.StreamReader, limit: int, lane: Lane) -> None:
        super().__init__(limit)
        self._reader = reader
        self._lane = lane
        self._items: deque[Item] = deque()
        self._queued = 0
        self._paused = False
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._pieces: Pieces | None = None
        """The line not yet ended, parsed as it comes when it opens as a lane listing's page (`pieces`)."""
        self._looked = False
        """Whether the line not yet ended was looked at for that."""
        reader.feed_data = self._feed  # type: ignore[method-assign, assignment]
        reader.feed_eof = self._eof  # type: ignore[method-assign]
        reader.set_exception = self._failed  # type: ignore[method-assign]
        # Its own subprocess protocol defers every chunk through `call_soon`.
        feed_directly(reader, self._feed)
        pending = getattr(reader, "_buffer", None)  # what came before the tap was in place
        if pending:
            data = bytes(pending)
            pending.clear()
            self._feed(data)
        if getattr(reader, "_eof", False):
            self._eof()

    def _feed(self, data: bytes) -> None:
        end = len(data) - 1
        if (data.find(b"\n") == end and end <= self.limit and self._head is None and not self._buffer
                and not self._ended and self._claimed(data[:end])):
            return  # the usual chunk: one whole answer to a lane read (`feed`'s own first case, without its list)
        if self._ended:
            return
        waiting = len(self._items)
        items = self.feed(data)
        pieces = None
        if items:  # the first ends the line pieces were parsed of, if any; what is left is a new line's
            pieces, self._pieces, self._looked = self._pieces, None, False
        for item in items:
            of, pieces = pieces, None
            if type(item) is bytes and self._claimed(item, of):
                continue
            self._items.append(item)
            self._queued += len(item) if type(item) is bytes else 0
            if item is None:
                self._ended = True
                break
        if not self._ended and self._head is None and len(self._buffer) > START:
            self._piecemeal()
        if self._queued > QUEUED_BYTES and not self._paused:
            transport = getattr(self._reader, "_transport", None)
            if transport is not None:
                transport.pause_reading()
                self._paused = True
        if len(self._items) > waiting:  # the reader task has something to take (a claimed answer is not its)
            self._wake()

    def _piecemeal(self) -> None:
        """Parse what came of a long line not yet ended, a piece at a time, when it opens as the page a lane listing
        awaits: a page of megabytes is not parsed in one call once it ends (`pieces`)."""
        if not self._looked:
            self._looked = True
            if self._lane.listing:
                self._pieces = Pieces.of(bytes(self._buffer[:HEAD]))
        if self._pieces is not None:
            self._pieces.advance(self._buffer, len(self._buffer))

    def _claimed(self, line: bytes, pieces: Pieces | None = None) -> bool:
        """Whether `line` answers a lane read (it is delivered then); anything else, a line that does not parse
        included, is the reader task's. `pieces`: what was parsed of it as it came."""
        # Most of the SDK's traffic is not parsed twice. An answer's id is near one end (first from Python's SDK,
        # last from the TypeScript one's): looked for there before the whole line (of up to megabytes) is scanned.
        if (line.find(ID_MARK, 0, _NEAR_END) < 0 and line.find(ID_MARK, len(line) - _NEAR_END) < 0
                and line.find(ID_MARK) < 0):
            return False
        try:
            return self._lane.claims(parsed(line) if pieces is None else pieces.finish(line), line)
        except (ValueError, RecursionError):
            return False

    def _eof(self) -> None:
        if not self._ended:
            self._items.extend(self.end())
            self._ended = True
        self._wake()

    def _failed(self, exc: BaseException) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> StdoutTap:
        return self

    async def __anext__(self) -> Item:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        item = self._items.popleft()
        if type(item) is bytes:
            self._queued -= len(item)
            if self._paused and self._queued <= QUEUED_BYTES // 2:
                self._paused = False
                transport = getattr(self._reader, "_transport", None)
                if transport is not None:
                    transport.resume_reading()
        return item


def tap(process: Any, limit: int, lane: Lane) -> StdoutTap | None:
    """A tap on the stdout of `process` (anyio's, on asyncio), None when it has no asyncio StreamReader there."""
    reader = getattr(getattr(process, "_process", None), "stdout", None)
    return StdoutTap(reader, limit, lane) if isinstance(reader, asyncio.StreamReader) else None
