"""Read requests seen before but for their id (`aggregator/stdio_seen.py`): a line equal to one kept but for its
integer id is found with that id and what was kept of it; a line that could hold its id otherwise (a backslash, a
second `"id"`, an id JSON could write another way) is not kept, and one whose id is not an integer as JSON writes
it is not found."""

from __future__ import annotations

import json

import orjson
from hypothesis import assume, given
from hypothesis import strategies as st

from aggregator.stdio_seen import MAX_SEEN, MAX_SEEN_LINE, SeenRead, SeenReads


def _line(request_id: object, uri: str, id_first: bool = True, **extra: object) -> bytes:
    read = {"method": "resources/read", "params": {"uri": uri, **extra}}
    message = {"jsonrpc": "2.0", "id": request_id, **read} if id_first else {**read, "jsonrpc": "2.0", "id": request_id}
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


READ = SeenRead("2025-11-25", "wiki://a")


def test_a_line_kept_is_found_again_under_any_other_id() -> None:
    seen = SeenReads()
    assert seen.find(_line(1, "wiki://a")) is None
    seen.keep(_line(1, "wiki://a"), 1, READ)
    assert seen.find(_line(1, "wiki://a")) == (1, READ)
    assert seen.find(_line(987654321, "wiki://a")) == (987654321, READ)
    assert seen.find(_line(0, "wiki://a")) == (0, READ)
    assert seen.find(_line(2, "wiki://b")) is None
    seen.keep(_line(7, "wiki://a", id_first=False), 7, READ)  # the TypeScript client writes its id last
    assert seen.find(_line(8, "wiki://a", id_first=False)) == (8, READ)
    seen.clear()
    assert seen.find(_line(1, "wiki://a")) is None


def test_lines_that_could_hold_their_id_otherwise_are_not_kept() -> None:
    seen = SeenReads()
    seen.keep(_line(1, 'wiki://"quoted"'), 1, READ)  # a backslash: strings may hide an "id"
    seen.keep(_line(1, "wiki://b", id=1), 1, READ)  # a second "id"
    seen.keep(_line("1", "wiki://c"), "1", READ)  # not an integer
    seen.keep(_line(True, "wiki://d"), True, READ)
    seen.keep(_line(-1, "wiki://e"), -1, READ)
    seen.keep(_line(10**16, "wiki://f"), 10**16, READ)  # past 15 digits
    seen.keep(_line(1, "wiki://g").replace(b'"id":1', b'"id": 1'), 1, READ)  # not where the digits are looked for
    seen.keep(_line(1, "wiki://h"), 2, READ)  # not the id the checks found
    seen.keep(_line(1, "wiki://" + "x" * MAX_SEEN_LINE), 1, READ)  # too long to be kept thousands of times
    # Its own id written with an escape, and another "id" (say in a modern `_meta`) holding the same number: the one
    # "id" written plainly is not the request's.
    escaped = b'{"jsonrpc":"2.0","\\u0069d":5,"method":"resources/read","params":{"uri":"a","_meta":{"id":5}}}\n'
    assert orjson.loads(escaped)["id"] == 5
    seen.keep(escaped, 5, READ)
    assert not seen._seen  # noqa: SLF001


def test_ids_json_would_not_write_so_are_not_found() -> None:
    seen = SeenReads()
    seen.keep(_line(5, "wiki://a"), 5, READ)
    for other in (b"05", b"5.0", b"5e0", b"-5", b"1234567890123456", b'"5"', b"true"):
        assert seen.find(_line(5, "wiki://a").replace(b'"id":5', b'"id":' + other)) is None, other


def test_the_memo_is_bounded() -> None:
    seen = SeenReads()
    for n in range(MAX_SEEN + 1):
        seen.keep(_line(1, f"wiki://{n}"), 1, READ)
    assert len(seen._seen) <= MAX_SEEN  # noqa: SLF001
    assert seen.find(_line(2, f"wiki://{MAX_SEEN}")) == (2, READ)


@given(uri=st.text(), first=st.integers(0, 10**15 - 1), then=st.integers(-10**17, 10**17), id_first=st.booleans(),
       ascii_only=st.booleans())
def test_a_line_found_is_the_kept_one_under_the_id_found(uri: str, first: int, then: int, id_first: bool,
                                                          ascii_only: bool) -> None:
    """Whatever the URI and ids: a line is found only with its own id, and it parses to the kept line's message but
    for that id."""
    def line(request_id: int) -> bytes:
        read = {"method": "resources/read", "params": {"uri": uri}}
        message = {"jsonrpc": "2.0", "id": request_id, **read} if id_first else {**read, "id": request_id}
        return json.dumps(message, separators=(",", ":"), ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")

    try:
        orjson.loads(line(first))  # what the checks take: valid JSON (a lone surrogate is not)
    except orjson.JSONDecodeError:
        assume(False)
    seen = SeenReads()
    kept = SeenRead("v", uri)
    seen.keep(line(first), first, kept)
    found = seen.find(line(then))
    if found is not None:
        assert found == (then, kept)
        assert orjson.loads(line(then)) == {**orjson.loads(line(first)), "id": then}
    elif b"\\" not in line(first) and 0 <= then < 10**15:
        raise AssertionError(f"{line(then)!r} not found after {line(first)!r}")
