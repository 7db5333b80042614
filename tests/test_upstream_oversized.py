"""`upstream.oversized`: lines past the cap are skipped as they stream and name the call they answered, in either
key order; a line that names none, or does not end within the budget, is told as such."""

from __future__ import annotations

import json

import anyio
from hypothesis import example, given
from hypothesis import strategies as st

from aggregator.upstream import oversized
from aggregator.upstream.oversized import MISSING, Oversized, answered_id
from tests.test_upstream import collect

LIMIT = 64


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)]) if b > a]


@given(st.lists(st.binary(max_size=200).map(lambda b: b.replace(b"\n", b"")), max_size=8),
       st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
@example([b"x" * 65, b"short"], [64, 66])
@example([b"x" * 200], [1, 2, 3])
@example([b"x" * 64], [])  # one whole line in one chunk (the splitter's shortcut), at the cap
@example([b"x" * 65], [])  # and one past it, which the shortcut leaves to the buffer
@example([b"a", b"b"], [2])  # whole lines in chunks of their own, one after the other
def test_lines_give_every_short_line_and_one_skip_per_long_one(lines: list[bytes], cuts: list[int]) -> None:
    """However the stream is chunked: each line up to the cap comes whole, in order; each line past it comes as
    Oversized with its first bytes, ending (tail set) exactly once, with its last bytes."""
    data = b"".join(line + b"\n" for line in lines)

    got = anyio.run(collect, oversized.lines, chunked(data, cuts), LIMIT)
    ended = [item for item in got if not (isinstance(item, Oversized) and item.tail is None)]
    assert len(ended) == len(lines)
    for line, item in zip(lines, ended):
        if len(line) <= LIMIT:
            assert item == line
        else:
            assert isinstance(item, Oversized) and item.tail is not None
            assert line.startswith(item.head) and line.endswith(item.tail)
            assert len(item.head) >= min(len(line), LIMIT) or len(item.head) == oversized.HEAD_BYTES


def test_an_empty_chunk_completes_nothing() -> None:
    """A chunk of no bytes is no line (an empty line once came of it, the shortcut taking its length for a newline
    at its end)."""
    splitter = oversized.LineSplitter(LIMIT)
    assert splitter.feed(b"") == []
    assert splitter.feed(b"ab") == [] and splitter.feed(b"") == [] and splitter.feed(b"c\n") == [b"abc"]
    assert splitter.feed(b"") == []


def test_a_line_that_does_not_end_is_given_up_past_the_budget() -> None:
    chunk = b"y" * (1024 * 1024)
    count = oversized.skip_budget(LIMIT) // len(chunk) + 2
    got = anyio.run(collect, oversized.lines, [b'{"jsonrpc":"2.0","id":7,"result":', *[chunk] * count], LIMIT)
    assert got[0] == Oversized(b'{"jsonrpc":"2.0","id":7,"result":' + b"y" * 223, None)
    assert got[-1] is None and len(got) == 2


ids = st.one_of(st.integers(min_value=-2**53, max_value=2**53), st.text(max_size=30))


@given(ids, st.booleans(), st.sampled_from(["result", "error"]), st.booleans())
@example('a"b\\\\"}', True, "result", True)
def test_an_answer_names_its_id_first_or_last(request_id: object, id_first: bool, member: str, compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    big = {"contents": [{"uri": "x://", "text": "x" * 1000, "id": 99}]}
    order = ["jsonrpc", "id", member] if id_first else [member, "jsonrpc", "id"]
    values = {"jsonrpc": "2.0", "id": request_id, member: big}
    line = json.dumps({key: values[key] for key in order}, separators=separators).encode()
    head, tail = line[:oversized.HEAD_BYTES], line[-oversized.TAIL_BYTES:]
    assert answered_id(head, tail) == request_id
    assert answered_id(head, None) == (request_id if id_first else MISSING)


def test_lines_that_name_no_call() -> None:
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"id": 3, "data": "x"}})
    assert answered_id(note.encode()[:256], note.encode()[-256:]) is MISSING
    request = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "sampling/createMessage", "params": {}})
    assert answered_id(request.encode(), request.encode()) is MISSING
    nested = b'{"result":{"a":{"b":1},"id":5}}'  # the id of a nested object, not of the message
    assert answered_id(nested, nested) is MISSING
    assert answered_id(b'{"jsonrpc": "2.0", "id": agg-1, "result": {', None) is MISSING
    assert answered_id(b"garbage", b"more garbage") is MISSING
