"""A listing page's line parsed a piece at a time while it arrives, so that no one parse of a page of megabytes holds
the event loop (a page of 1M resources took orjson about 0.2-0.5 s in one call).

A worker thread does not help: orjson builds Python objects and holds the GIL for the whole call, so the loop waits
just as long (measured: the loop's longest gap is the whole parse). What helps is cutting the work: while the line
streams in, the `resources` array's elements are parsed in pieces of about `PIECE` bytes in the pipe's own callback
(one piece per chunk the pipe reads), and once the line ends only its last piece and the few bytes around the array
remain.

A piece is cut after an element's closing brace followed by one opening as the first element does (`},{"uri":`,
which a string hardly ever holds: its quote would end the string) and parsed as `[piece]`: cut anywhere but between
two of the array's own elements, that text does not parse (a string left open, brackets that do not balance), so a
wrong cut is found out and the next one tried. The rest is the line with the array put aside: it parses with a
stand-in in its place, which must be the array's value once parsed (no later duplicate key took its place). Where
any of that fails (too many wrong cuts, a piece orjson refuses, a shape not recognised) the whole line is parsed as
before (`lane.parsed`): the outcome is what that gives, only its cost differs. One element of megabytes is still
parsed in one call (an element is not cut), and so is a page written with spaces between its elements.
"""

from __future__ import annotations

import re
from typing import Any

from aggregator.codec import loads_strict
from aggregator.upstream.lane import parsed

__all__ = ["HEAD", "PIECE", "Pieces", "START"]

PIECE = 256 * 1024
"""Bytes of elements parsed at a time (a few milliseconds of orjson)."""
START = 4 * PIECE
"""Bytes of a line not yet ended past which its elements start being parsed (a shorter line is parsed whole)."""
_WRONG_CUTS = 8
"""Cuts that did not parse after which the line is left to be parsed whole."""
_LAST_TRIES = 16
"""`]`s tried, from the end, as the end of the array in the line's last bytes."""
_MARKS = ((b'"\\u0000aggregator: resources 1"', "\x00aggregator: resources 1"),
          (b'"\\u0000aggregator: resources 2"', "\x00aggregator: resources 2"))
"""Two stand-ins for the array: the value found in its place is the array's only if it is each one in turn (a key
after the array holding the same text would be found both times)."""
_VERSION = rb'"jsonrpc"\s*:\s*"2\.0"\s*,\s*'
_SCALAR = rb'"[^"\\]*"\s*:\s*(?:"[^"\\]*"|[-+.0-9eE]+|true|false|null)\s*,\s*'
"""A member before the array (`"nextCursor":"c",`, `"ttlMs":0,`: Python's SDK writes them first)."""
_HEAD = re.compile(rb'\s*\{\s*(?:' + _VERSION + rb')?(?:"id"\s*:\s*(?:-?\d+|"[^"\\]*")\s*,\s*)?(?:' + _VERSION
                   + rb')?"result"\s*:\s*\{\s*(?:' + _SCALAR + rb')*"resources"\s*:\s*(\[)\s*(\{"[^"\\]*":)')
HEAD = 4096
"""Bytes of a line `Pieces.of` is given to recognise a page by (a cursor before the array may be long)."""


class Pieces:
    """The `resources` of one listing answer's line, parsed as the line arrives (`advance`), the message made whole
    when it ended (`finish`)."""

    __slots__ = ("_open", "_start", "_cut", "_done", "_searched", "_items", "_wrong")

    def __init__(self, opening: int, start: int, first: bytes) -> None:
        self._open = opening
        """Where the array's `[` is."""
        self._start = start
        """Where the array's first element begins."""
        self._cut = b"}," + first
        """Where a piece may end: an element's end, then one that opens as the first one does (`},{"uri":`)."""
        self._done = start
        """Where the elements not yet parsed begin (an element's `{`, or `_start`)."""
        self._searched = start
        """Where the next cut is looked for from (what lies before was looked through)."""
        self._items: list[Any] = []
        self._wrong = 0

    @classmethod
    def of(cls, head: bytes | bytearray) -> Pieces | None:
        """The pieces of a line starting with `head` (its first bytes), None when it does not open as a listing page
        answer (`{"jsonrpc":"2.0","id":..,"result":{"nextCursor":..,"resources":[{"uri":`: the id first or last, the
        result's scalar members before the array or after it)."""
        match = _HEAD.match(head)
        return None if match is None else cls(match.start(1), match.start(2), match.group(2))

    def advance(self, line: bytes | bytearray, end: int) -> None:
        """Parse the whole elements of `line[:end]` (the bytes of the line come so far) not parsed yet, a piece of
        at least `PIECE` bytes at a time (nothing while less has come, or once given up)."""
        while self._wrong <= _WRONG_CUTS:
            # Compact JSON (what the SDKs write) is cut; elements written with spaces between are parsed whole.
            at = line.find(self._cut, max(self._done + PIECE, self._searched), end)
            if at < 0:
                self._searched = max(self._searched, end - len(self._cut))  # a cut may straddle `end`
                return
            self._searched = at + 1
            with memoryview(line) as view, view[self._done:at + 1] as elements:
                piece = b"".join((b"[", elements, b"]"))  # one copy, the line's buffer left free to grow
            try:
                self._items += loads_strict(piece)
            except ValueError:  # not a cut between elements (or a piece orjson refuses): the next one is tried
                self._wrong += 1
                continue
            self._done = at + 2

    def finish(self, line: bytes) -> Any:
        """The message `line` (the whole line, `advance`d over before) holds: what `lane.parsed` gives for it
        (ValueError or RecursionError where it raises)."""
        if self._wrong <= _WRONG_CUTS:
            message = self._made(line)
            if message is not None:
                return message
        return parsed(line)

    def _made(self, line: bytes) -> dict[str, Any] | None:
        """The message made of the elements parsed and the line's rest, None where the rest does not make one."""
        closing = len(line)
        for _ in range(_LAST_TRIES):
            closing = line.rfind(b"]", self._done, closing)
            if closing < 0:
                return None
            head, tail = line[:self._open], line[closing + 1:]
            try:
                last = loads_strict(b"[" + line[self._done:closing] + b"]")
                messages = [loads_strict(head + mark + tail) for mark, _ in _MARKS]
            except ValueError:
                continue
            results = [message.get("result") if type(message) is dict else None for message in messages]
            if not all(type(result) is dict and result.get("resources") == text
                       for result, (_, text) in zip(results, _MARKS)):
                return None  # the array's value was not the one the line's parse keeps (a later duplicate key)
            self._items += last
            results[0]["resources"] = self._items  # type: ignore[index]
            return messages[0]
        return None
