"""A `resources/read` on stdio relayed to an MCP upstream in callbacks (`reads.relayed`): sent from the callback
that brings the request, answered from the one that brings the upstream's answer, with no task and one object a
read (`RelayedRead`: the stdio path's running read, the lane's waiter and the cache's flight of its key at once).

Most answers are one text, differing from the last answer of the same URI only in that text. The first such
answer goes the usual way (checked as `Upstream.read` checks it, typed, its ttl and cache scope, the version's
result sieve, encoded); when what it served is that text as it came (`RelayPlan.text_as_sent`), the line is kept
with the text cut out (`_Shape`), and later answers alike (`answers.plain_text`: the same MIME type, hints and
client wire) are served by writing their text into it. The line is checked at that point to be the one the usual
way wrote, so a kept shape serves exactly what the usual way would.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.cache import Flight
from aggregator.codec import dumps
from aggregator.content import Content
from aggregator.reads.reader import Served
from aggregator.reads.relayed import RelayPlan
from aggregator.sources import Blob
from aggregator.upstream.answers import plain_text
from aggregator.upstream.lane import Sent
from aggregator.wire_results import encode_response

__all__ = ["RelayedRead", "Shape"]

MAX_SHAPES = 64
"""Shapes kept per plan (one per MIME type, hints and client wire an upstream answers with)."""
_BOM = "\ufeff"
_MARK = "\x00aggregator-relayed-text\x00"
"""What stands for the text while a shape is cut (a text holding it is served the usual way)."""
_LINE_HEAD = b'{"jsonrpc":"2.0","id":'


class Shape:
    """An answer line with its text cut out: `head`, the text encoded, `tail` (the request's id goes first)."""

    __slots__ = ("head", "tail")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail

    def line(self, request_id: types.RequestId, text: str) -> bytes:
        return b"".join((_LINE_HEAD, dumps(request_id), self.head, dumps(text), self.tail))


def _shape_of(result: dict[str, Any], text: str) -> Shape | None:
    """The shape of a shaped read `result` whose one content's text is `text`; None when the text is not found
    once where it is expected (then nothing is kept)."""
    contents = result.get("contents")
    if type(contents) is not list or len(contents) != 1 or type(item := contents[0]) is not dict \
            or item.get("text") is not text or _MARK in text:
        return None
    marked = dumps({**result, "contents": [{**item, "text": _MARK}]})
    head, found, tail = marked.partition(dumps(_MARK))
    if not found or dumps(_MARK) in tail:
        return None
    return Shape(b',"result":' + head, tail + b"}\n")


class RelayedRead(Sent, Flight[Content]):
    """One relayed read: in the stdio path's `tasks` under the client's id (`cancel` gives it up, never answered),
    the lane's waiter (`answered` is told its outcome once), and the flight of its key that reads of the key
    meanwhile follow. Made bare and filled by `start` (a Python `__init__` is a good part of what a read costs)."""

    _paths: Any  # stdio_fast.FastReads
    _out: Any  # stdio_fast.Immediate
    _asked: types.RequestId
    _version: str
    _uri: str
    _plan: RelayPlan
    _handler: Any
    _answer: Any
    _started: float

    def start(self, paths: Any, out: Any, plan: RelayPlan, asked: types.RequestId, version: str, uri: str,
              handler: Any, answer: Any) -> bool:
        """Send the read of `uri` asked as `asked` at `version`, answered through `out` where its outcome comes;
        False (nothing started) when it must be served the usual way."""
        cache, key = plan.cache, plan.key
        if plan.caches.shared is not None or not cache.lead(key, self):
            return False  # a load under way, or a copy the cluster may hold: the usual way serves it from them
        self._paths, self._out, self._plan, self._asked, self._version, self._uri = paths, out, plan, asked, version, uri
        self._handler, self._answer = handler, answer
        self._started = perf_counter()
        if not plan.route.send(self):
            cache.land(key, self, plan.limits.policy)
            return False
        plan.leases.hold(plan.snapshot)
        paths.tasks[asked] = self
        return True

    def answered(self, outcome: dict[str, Any] | None | BaseException) -> None:
        plan, paths, asked = self._plan, self._paths, self._asked
        plan.leases.let_go(plan.snapshot)
        # The text of an answer like one already shaped, when no read of the key follows this one.
        found = plain_text(outcome, plan.limits.max_bytes, self._lane.modern) if self._done is None else None
        if found is not None:
            text = found[0]
            shape = plan.shapes.get((self._version, found[1:]))
            if shape is not None and text[:1] != _BOM and paths.tasks.get(asked) is self:
                plan.route.release(self)
                plan.cache.land(plan.key, self, plan.limits.policy)
                plan.calls.succeeded(plan.target.source)
                del paths.tasks[asked]
                self._out.answer_now(asked, shape.line(asked, text), None)
                paths.relays.relay_counted(self._uri, "ok", self._started)
                return
        blob: Blob | Exception | None
        try:
            blob = plan.route.settle(self, outcome)
        except Exception as exc:  # noqa: BLE001 - what a read raises, for the handler to map
            blob = exc
        served = plan.served(blob)
        if served is None or isinstance(served, Exception):
            plan.cache.land(plan.key, self, plan.limits.policy, error=served)
        else:
            plan.cache.land(plan.key, self, plan.limits.policy, served.content)
        if paths.tasks.get(asked) is not self:
            return  # cancelled meanwhile: never answered
        if served is None:  # the connection was lost under it: read the usual way (the next connection)
            paths.tasks[asked] = asyncio.get_running_loop().create_task(paths.serve_read(
                asked, self._version, self._uri, self._handler, self._answer))
            return
        del paths.tasks[asked]
        result = paths.relays.relayed(self._uri, self._modern(), served, self._started)
        if isinstance(result, MCPError):
            self._out.answer_now(asked, None, paths.error_data(result))
            return
        try:
            shaped = paths.shaped_read(self._version, result)
        except Exception as exc:  # noqa: BLE001 - mapped as the usual path maps it (the result sieve refused it)
            self._out.answer_now(asked, None, paths.error_data(exc))
            return
        line = encode_response(asked, shaped)
        if found is not None and isinstance(blob, Blob) and isinstance(served, Served) \
                and plan.text_as_sent(blob, served) \
                and len(plan.shapes) < MAX_SHAPES and (shape := _shape_of(shaped, found[0])) is not None \
                and shape.line(asked, found[0]) == line:
            plan.shapes[(self._version, found[1:])] = shape
        self._out.answer_now(asked, line, None)

    def cancel(self) -> bool:
        """Give the read up (the client cancelled it, or the connection ends): never answered, the upstream told,
        its slot freed, the snapshot let go, reads following it sent to load again; counted as an error."""
        if not self._over:
            plan = self._plan
            self.give_up()
            plan.route.release(self)
            plan.leases.let_go(plan.snapshot)
            plan.cache.land(plan.key, self, plan.limits.policy)
            self._paths.relays.relay_counted(self._uri, "error", self._started)
        return True

    def _modern(self) -> bool:
        return self._version in MODERN_PROTOCOL_VERSIONS
