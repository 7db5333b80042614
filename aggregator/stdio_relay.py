"""A `resources/read` on stdio relayed to an MCP upstream in callbacks (`reads.relayed`): sent from the callback
that brings the request, answered from the one that brings the upstream's answer, with no task and one object a
read (`RelayedRead`: the stdio path's running read, the lane's waiter and the cache's flight of its key at once).

Most answers are one text, and differ from the last answer of the same URI only in that text. The first such
answer goes the usual way (checked as `Upstream.read` checks it, typed, its ttl and cache scope, the version's
result sieve, encoded); when what it served is that text as it came (`RelayPlan.text_as_sent`), its line is kept
with the text cut out, with the upstream's result it was made of (`Shape`), per client wire and upstream wire. A
later answer whose result equals that one but for its text (compared as parsed, in C) is served by writing its
text into the line, without checking, typing or shaping it again: what the usual way serves is a function of that
result, the snapshot's plan and the wire. A line is kept only once checked to be the one the usual way wrote.

A text not all ASCII goes into the line as the upstream wrote it (`_text_token`: the bytes of its JSON string, found
in the answer's line), not encoded again: kilobytes of it cost more to encode to UTF-8 than the rest of a read. An
ASCII text, and one whose token cannot be told apart for certain, is encoded (`Shape.line`; orjson copies ASCII).
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

import mcp_types as types
import orjson
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from aggregator.cache import Flight
from aggregator.codec import dumps, loads_strict
from aggregator.content import Content
from aggregator.reads.reader import Served
from aggregator.reads.relayed import RelayPlan
from aggregator.sources import Blob
from aggregator.upstream.lane import Sent
from aggregator.wire_results import encode_response

__all__ = ["RelayedRead", "Shape"]

MAX_KEPT_RESULT = 4096
"""Bytes of an upstream's result (its text left out) past which no shape is kept of it."""
RELEARN_AFTER = 16
"""Answers in a row that do not fit a kept shape after which another is learnt (an upstream that changed its form);
until then they are served the usual way without the cost of cutting a new shape each time."""
_BOM = "\ufeff"
_MARK = "\x00aggregator-relayed-text\x00"
"""What stands for the text while a shape is cut (a text holding it is served the usual way)."""
_LINE_HEAD = b'{"jsonrpc":"2.0","id":'
_encoded = orjson.dumps
_TEXT_KEY = b'"text"'
_MAX_QUOTES = 64
"""Quotes in a text's token past which it is encoded again rather than looked through for its end."""
_BACKSLASH = 0x5C


class Shape:
    """An answer line with its text cut out (`head`, the text encoded, `tail`; the request's id goes first), and the
    upstream's result it was made of, its text emptied (`result`): an answer equal to that but for its text is
    served as this line with its own text."""

    __slots__ = ("head", "tail", "result", "modern", "missed", "spliced")

    def __init__(self, head: bytes, tail: bytes, result: dict[str, Any], modern: bool, spliced: bool = False) -> None:
        self.head, self.tail, self.result = head, tail, result
        self.modern = modern
        """Whether `result` came on the modern wire (its hints count there)."""
        self.spliced = spliced
        """Whether the one string `"text"` of an answer that fits is its content's key (none elsewhere in `result`):
        then its text's token is found in the answer's line (`_text_token`)."""
        self.missed = 0
        """Answers in a row it did not fit (past RELEARN_AFTER, the next one served the usual way is kept instead)."""

    def line(self, request_id: types.RequestId, text: str) -> bytes:
        """The line answering `request_id` with `text` (orjson's own encoder: an id and a text parsed by orjson, a
        plain int or str with no lone surrogate, encode as `codec.dumps` encodes them)."""
        return b"".join((_LINE_HEAD, _encoded(request_id), self.head, _encoded(text), self.tail))

    def line_of(self, request_id: types.RequestId, token: bytes) -> bytes:
        """`line` of the text whose JSON string is `token` (`_text_token`), as the upstream wrote it."""
        return b"".join((_LINE_HEAD, _encoded(request_id), self.head, token, self.tail))


def _text_token(line: bytes) -> bytes | None:
    """The JSON string after the first key `"text"` in `line` (valid JSON, as orjson parsed it); None where the first
    `"text"` is not a key followed by a string, or the string holds more than _MAX_QUOTES quotes.

    In valid JSON a `"text"` whose first quote follows no backslash is a whole string (a quote that ends a string is
    followed by what follows a value, not by `text"`), and a quote that follows an even run of backslashes ends one."""
    at = line.find(_TEXT_KEY)
    if at < 1 or line[at - 1] == _BACKSLASH:
        return None
    start = at + len(_TEXT_KEY)
    if line[start:start + 1] != b":":
        return None
    start += 2 if line[start + 1:start + 2] == b" " else 1  # `": "`, as Python's json.dumps writes it
    if line[start:start + 1] != b'"':
        return None
    end = start
    for _ in range(_MAX_QUOTES):
        end = line.find(b'"', end + 1)
        if end < 0:
            return None
        run = end
        while line[run - 1] == _BACKSLASH:
            run -= 1
        if (end - run) % 2 == 0:
            return line[start:end + 1]
    return None


def _one_text(outcome: Any) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """The result of an answer that is one text (parsed by orjson: no `LooseResult`), its one content and the text;
    None for any other answer."""
    if (type(outcome) is dict and outcome.get("error") is None and type(result := outcome.get("result")) is dict
            and type(contents := result.get("contents")) is list and len(contents) == 1
            and type(item := contents[0]) is dict and type(text := item.get("text")) is str):
        return result, item, text
    return None


def _shape_of(shaped: dict[str, Any], outcome: Any, modern: bool) -> Shape | None:
    """The shape of a shaped read `shaped` made of the upstream's answer `outcome` (on the `modern` wire or not),
    whose one text it serves as it came; None when the answer is not one text or the text is not found once where
    it is expected."""
    found = _one_text(outcome)
    contents = shaped.get("contents")
    if (found is None or type(contents) is not list or len(contents) != 1 or type(served := contents[0]) is not dict
            or served.get("text") is not found[2] or _MARK in found[2]):
        return None
    result, item, text = found
    marked = dumps({**shaped, "contents": [{**served, "text": _MARK}]})
    head, cut, tail = marked.partition(dumps(_MARK))
    if not cut or dumps(_MARK) in tail:
        return None
    item["text"] = ""
    encoded = dumps(result)
    item["text"] = text
    if len(encoded) > MAX_KEPT_RESULT:
        return None  # an upstream's `_meta` of megabytes is not kept for every URI
    # Strings in `encoded` are written as they read (orjson escapes no letter): its key is the one `"text"` in it
    # unless another string says text.
    return Shape(b',"result":' + head, tail + b"}\n", loads_strict(encoded), modern,
                 spliced=encoded.count(_TEXT_KEY) == 1)


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
        started = perf_counter()
        cache, key = plan.cache, plan.key
        if plan.caches.shared is not None or not cache.lead(key, self):
            return False  # a load under way, or a copy the cluster may hold: the usual way serves it from them
        # Filled before the request goes out (`Lane.send_read` writes it last): the upstream it wakes waits for
        # this callback to end, not the other way round.
        self._paths, self._out, self._plan, self._asked = paths, out, plan, asked
        self._version, self._uri, self._handler, self._answer = version, uri, handler, answer
        self._started = started
        plan.leases.hold(plan.snapshot)
        paths.tasks[asked] = self
        if plan.route.send(self):
            return True
        del paths.tasks[asked]
        plan.leases.let_go(plan.snapshot)
        cache.land(key, self, plan.limits.policy)
        return False

    def answered(self, outcome: dict[str, Any] | None | BaseException) -> None:
        plan, paths, asked = self._plan, self._paths, self._asked
        # Served into the shape kept for an answer equal to this one but for its text, when no read of the key
        # follows this one (they need the content itself). Whatever differs fails the comparison (in C).
        message = outcome if type(outcome) is dict else None
        kept = plan.shapes.get(self._version)
        if kept is not None and message is not None and self._done is None and kept.modern is self._lane.modern:
            try:
                result = message["result"]
                item = result["contents"][0]
                text = item["text"]
            except (KeyError, IndexError, TypeError):
                pass  # not one text: the usual way
            else:
                if type(result) is dict and type(text) is str and message.get("error") is None:
                    item["text"] = ""
                    alike = result == kept.result  # not a `LooseResult` (above): no lone surrogate in the text
                    item["text"] = text
                    limit = plan.limits.max_bytes
                    # Equal but for a number's type (`==` takes 1.0 and True for 1): the one number a read uses.
                    if (alike and type(result.get("ttlMs", 0)) is int and text[:1] != _BOM and len(text) <= limit
                            and ((ascii_text := text.isascii()) or len(text) * 4 <= limit)
                            and paths.tasks.get(asked) is self):
                        del paths.tasks[asked]
                        # A text not all ASCII as the upstream wrote it (encoding it again costs more than finding
                        # it), where the answer holds no string `"text"` but its key (an answer of three members, as
                        # `result` holds none but the one the shape was cut of).
                        token = (_text_token(self._lane.answer_line) if kept.spliced and not ascii_text
                                 and len(message) == 3 and message.get("jsonrpc") == "2.0" else None)
                        self._out.answer_now(asked, kept.line(asked, text) if token is None
                                             else kept.line_of(asked, token), None)
                        # What the read held is let go once its answer is out: the client takes it meanwhile.
                        plan.leases.let_go(plan.snapshot)
                        plan.route.release(self)
                        plan.cache.land(plan.key, self, plan.limits.policy)
                        plan.calls.succeeded(plan.target.source)
                        if (relays := paths.relays).metrics is not None:
                            relays.relay_counted(self._uri, "ok", self._started)
                        kept.missed = 0
                        return
            kept.missed += 1
        plan.leases.let_go(plan.snapshot)
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
        if paths.tasks.get(asked) is not self:  # cancelled, its `cancel` still to come: never answered
            paths.relays.relay_counted(self._uri, "error", self._started)
            return
        if served is None:  # the connection was lost under it: read the usual way (the next connection)
            paths.tasks[asked] = asyncio.get_running_loop().create_task(paths.serve_read(
                asked, self._version, self._uri, self._handler, self._answer))
            return
        del paths.tasks[asked]
        answer = paths.relays.relayed(self._uri, self._modern(), served, self._started)
        if isinstance(answer, MCPError):
            self._out.answer_now(asked, None, paths.error_data(answer))
            return
        try:
            shaped = paths.shaped_read(self._version, answer)
        except Exception as exc:  # noqa: BLE001 - mapped as the usual path maps it (the result sieve refused it)
            self._out.answer_now(asked, None, paths.error_data(exc))
            return
        line = encode_response(asked, shaped)
        if ((kept is None or kept.missed > RELEARN_AFTER) and isinstance(blob, Blob) and isinstance(served, Served)
                and plan.text_as_sent(blob, served)):
            shape = _shape_of(shaped, outcome, self._lane.modern)
            if shape is not None and blob.text is not None and shape.line(asked, blob.text) == line:
                plan.shapes[self._version] = shape
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
