"""Read requests seen before but for their id. A stdio client asks for a URI in the same words each time, so a line
equal byte for byte to one the fast path checked, but for its integer id, is that request again under another id:
found with a `find`, a match and a dict lookup instead of a parse and the checks (`stdio_fast.FastReads.take`).

Only lines without a backslash are kept: every string in such a line is written as it reads, so its one `"id"` is
the request's own key and the digits after it its id (an integer JSON writes one way: no sign, no leading zero).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["MAX_SEEN", "MAX_SEEN_LINE", "SeenRead", "SeenReads"]

MAX_SEEN = 4096
"""Lines kept (one a URI and envelope): past this many the memo starts over."""
MAX_SEEN_LINE = 4096
"""Bytes of a line past which it is not kept (a line may be megabytes: the memo would hold thousands of them)."""
_ID_KEY = b'"id":'
_ID = re.compile(rb"0|[1-9][0-9]{0,14}")
"""An id as JSON writes it (at most 15 digits: any larger is left to the parse)."""


class SeenRead(NamedTuple):
    """What the checks found of a read line: the version it is served at and its URI."""

    version: str
    uri: str


class SeenReads:
    """Read lines the fast path took, their ids cut out, with what its checks found of them."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[tuple[bytes, bytes], SeenRead] = {}

    def find(self, line: bytes) -> tuple[int, SeenRead] | None:
        """The id of `line` and what was found of a line equal to it but for its id; None when none was kept."""
        seen = self._seen
        if not seen or (at := line.find(_ID_KEY)) < 0:
            return None
        start = at + len(_ID_KEY)
        digits = _ID.match(line, start)
        if digits is None:
            return None
        end = digits.end()
        found = seen.get((line[:start], line[end:]))
        return None if found is None else (int(line[start:end]), found)

    def keep(self, line: bytes, request_id: object, read: SeenRead) -> None:
        """Remember that `line`, which asked for `read` as request `request_id`, passed the checks (a line that
        could hold its id otherwise is not kept)."""
        if (type(request_id) is not int or len(line) > MAX_SEEN_LINE or b"\\" in line
                or line.count(b'"id"') != 1):
            return
        start = line.find(_ID_KEY) + len(_ID_KEY)
        digits = _ID.match(line, start)
        if start < len(_ID_KEY) or digits is None or int(digits.group()) != request_id:
            return
        if len(self._seen) >= MAX_SEEN:
            self._seen.clear()  # a bound, not an eviction order: lines asked again come back at once
        self._seen[(line[:start], line[digits.end():])] = read

    def clear(self) -> None:
        """Forget every line (what the checks found of them may no longer hold: a new handshake)."""
        self._seen.clear()
