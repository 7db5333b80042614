"""A line from a stdio upstream past `maxMessageBytes`: skipped as it streams (never buffered), and the call it
answered named, so that one call fails and the connection stays up for every other.

A JSON-RPC answer's top-level keys are `jsonrpc`, `id` and `result` or `error`. Whatever order a server writes them
in, the id comes before the big member or after it, so the line's first bytes or its last ones name it (Python's
SDK writes `{"jsonrpc":"2.0","id":..,"result":..}`, TypeScript's `{"result":..,"jsonrpc":"2.0","id":..}`). A line
whose id is not found there (a notification, a request, an unusual shape), or one that does not end within
`skip_budget`, cannot be told: the caller ends the connection, as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream

__all__ = ["MISSING", "LineSplitter", "Oversized", "answered_id", "lines", "skip_budget"]

HEAD_BYTES = 256
TAIL_BYTES = 256
SKIP_FLOOR = 64 * 1024 * 1024
_COPIED_TWICE = 64 * 1024
"""Bytes of a line up to which it is taken out of the buffer the plain way (a slice, then bytes: two copies)."""
MISSING = object()
"""`answered_id`'s answer when the line names no call."""

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_VERSION = rb'"jsonrpc"\s*:\s*"2\.0"\s*'
_ID_FIRST = re.compile(rb'\s*\{\s*(?:' + _VERSION + rb',\s*)?"id"\s*:\s*' + _ID + rb'\s*,\s*(?:' + _VERSION
                       + rb',\s*)?"(?:result|error)"\s*:')
_ANSWER_FIRST = re.compile(rb'\s*\{\s*(?:' + _VERSION + rb',\s*)?"(?:result|error)"\s*:')
# The line ends with the one `}` that closes the message, so an id right before it is a top-level key.
_ID_LAST = re.compile(rb',\s*"id"\s*:\s*' + _ID + rb'\s*(?:,\s*' + _VERSION + rb')?\}\s*$')


@dataclass(frozen=True)
class Oversized:
    """A line past the cap: `head` is its first bytes; `tail` its last ones once it ended (None: still skipping)."""

    head: bytes
    tail: bytes | None


def skip_budget(limit: int) -> int:
    """How many bytes of one line past `limit` are skipped before the connection is given up."""
    return max(8 * limit, SKIP_FLOOR)


def answered_id(head: bytes, tail: bytes | None) -> object:
    """The JSON-RPC id of the answer whose line starts with `head` and ends with `tail` (None: not seen yet), or
    MISSING when the bytes do not name one."""
    match = _ID_FIRST.match(head)
    if match is None and tail is not None and _ANSWER_FIRST.match(head):
        match = _ID_LAST.search(tail)
    if match is None:
        return MISSING
    try:
        return json.loads(match.group(1))
    except ValueError:
        return MISSING


class LineSplitter:
    """`lines` without the stream: chunks fed in, the items they complete handed back (for a caller that is given
    bytes as they arrive rather than awaiting them)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._budget = skip_budget(limit)
        self._buffer = bytearray()
        self._scanned = 0
        self._head: bytes | None = None  # set while a line past the cap is being skipped
        self._tail = b""
        self._skipped = 0

    def feed(self, chunk: bytes) -> list[bytes | Oversized | None]:
        """The items `chunk` completes, as `lines` yields them; a None (past the skip budget) is the last one."""
        if self._head is None and not self._buffer:
            # The usual chunk, one whole answer: its line as it is, without going through the buffer (three copies).
            newline = chunk.find(b"\n")
            if 0 <= newline == len(chunk) - 1 and newline <= self.limit:
                return [chunk[:newline]]
        items: list[bytes | Oversized | None] = []
        if self._head is not None:
            newline = chunk.find(b"\n")
            end = len(chunk) if newline < 0 else newline
            self._tail = (self._tail + chunk[max(0, end - TAIL_BYTES):end])[-TAIL_BYTES:]
            self._skipped += end
            if newline < 0:
                if self._skipped > self._budget:
                    items.append(None)
                return items
            items.append(Oversized(self._head, self._tail))
            self._head = None
            chunk = chunk[newline + 1:]
        buffer, limit = self._buffer, self.limit
        buffer += chunk
        while (newline := buffer.find(b"\n", self._scanned)) >= 0:
            if newline > limit:
                items.append(Oversized(bytes(buffer[:min(newline, HEAD_BYTES)]),
                                       bytes(buffer[max(0, newline - TAIL_BYTES):newline])))
            elif newline < _COPIED_TWICE:
                items.append(bytes(buffer[:newline]))
            else:  # copied once: a slice of a bytearray is a copy of its own (tens of ms for a page of 60 MB)
                with memoryview(buffer) as view, view[:newline] as line:
                    items.append(bytes(line))
            del buffer[:newline + 1]
            self._scanned = 0
        self._scanned = len(buffer)
        if self._scanned > limit:
            self._head, self._tail, self._skipped = bytes(buffer[:HEAD_BYTES]), bytes(buffer[-TAIL_BYTES:]), len(buffer)
            buffer.clear()
            self._scanned = 0
            items.append(Oversized(self._head, None))
        return items

    def end(self) -> list[bytes | Oversized | None]:
        """The items the end of the stream completes: an unterminated last line (not one being skipped)."""
        return [bytes(self._buffer)] if self._buffer and self._head is None else []


async def lines(stream: ByteReceiveStream, limit: int) -> AsyncIterator[bytes | Oversized | None]:
    """Lines of `stream` (without the newline). A line past `limit` bytes is skipped: Oversized(head, None) when it
    crosses the cap, Oversized(head, tail) when it ends; None (then the end) when it passes `skip_budget`."""
    splitter = LineSplitter(limit)
    while True:
        try:
            chunk = await stream.receive()
        except anyio.EndOfStream:
            for item in splitter.end():
                yield item
            return
        for item in splitter.feed(chunk):
            yield item
            if item is None:
                return
