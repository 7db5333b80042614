"""`upstream.pieces`: a listing page's line parsed a piece at a time as it arrives gives what the whole line's parse
gives (`lane.parsed`), however it is chunked and whatever its strings hold (cuts look like element boundaries inside
strings and nested objects); and the tap parsing one as it comes still delivers every line in order, and a listing
given up meanwhile is given up at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregator.upstream import pieces, tap
from aggregator.upstream.lane import parsed
from aggregator.upstream.pieces import Pieces
from aggregator.upstream.tap import StdoutTap
from tests.test_upstream_lane import _lane
from tests.test_upstream_oversized import chunked

TRICKY = st.sampled_from(['},{"uri":', '"},{"uri":"', "]", '"}]}', "\\", "\ud800", "\u2028", "{", "},{", "x"])
TEXT = st.lists(st.one_of(TRICKY, st.text(max_size=4)), max_size=4).map("".join)
_MORE = {"name": TEXT, "size": st.integers(min_value=-2**70, max_value=2**70),
         "nested": st.lists(st.fixed_dictionaries({"uri": TEXT}), max_size=3)}
RESOURCE = st.one_of(st.fixed_dictionaries({"uri": TEXT}, optional=_MORE),  # keys in another order too
                     st.fixed_dictionaries({"name": TEXT, "uri": TEXT}, optional={"nested": _MORE["nested"]}))


@contextmanager
def small_pieces(size: int) -> Iterator[None]:
    """Pieces of `size` bytes, the tap's lines parsed in pieces past two of them (a test's lines are short)."""
    kept = pieces.PIECE, tap.START
    pieces.PIECE, tap.START = size, 2 * size
    try:
        yield
    finally:
        pieces.PIECE, tap.START = kept


def page_line(resources: list[dict[str, Any]], id_first: bool, after: dict[str, Any],
              before: bool = False) -> bytes:
    """A listing answer's line as an SDK writes it (compact; the id first, as Python's, or last, as TypeScript's;
    the result's other members `after` the array, or `before` it, as Python's SDK writes them)."""
    result = {**after, "resources": resources} if before else {"resources": resources, **after}
    message = ({"jsonrpc": "2.0", "id": "agg-1", "result": result} if id_first
               else {"result": result, "jsonrpc": "2.0", "id": "agg-1"})
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def outcome(parse: Any, line: bytes) -> Any:
    try:
        return parse(line)
    except (ValueError, RecursionError) as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(RESOURCE, max_size=12), st.booleans(),
       st.sampled_from([{}, {"nextCursor": "c]"}, {"nextCursor": None}, {"resources": []}, {"_meta": {"a": [1]}},
                        {"ttlMs": 0, "cacheScope": "private", "nextCursor": "c,\"x"}, {"a": 1.5e3, "b": True}]),
       st.booleans(),
       st.integers(min_value=1, max_value=64), st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
       st.sampled_from([None, 0, 1, -1, -2]))
@example([{"uri": "a"}, {"uri": '},{"uri":'}, {"uri": "b"}], True, {}, False, 1, [5, 9, 14], None)
@example([{"uri": "a", "nested": [{"uri": "n"}, {"uri": "m"}]}, {"uri": "b"}], False, {}, False, 1, [], None)
@example([{"uri": "a"}, {"uri": "b"}], True, {"resources": []}, False, 1, [], None)
@example([{"uri": "a"}, {"uri": "b"}], True, {"ttlMs": 0, "nextCursor": "c"}, True, 1, [], None)
def test_a_page_parsed_in_pieces_is_the_whole_lines_parse(resources: list[dict[str, Any]], id_first: bool,
                                                           after: dict[str, Any], before: bool, piece: int,
                                                           cuts: list[int], broken: int | None) -> None:
    """Whatever the page holds and wherever the chunks end: what `finish` gives is what `parsed` gives (the same
    error where it raises), also of a line cut short or with a byte dropped (`broken`)."""
    line = page_line(resources, id_first, after, before)
    if broken is not None:
        line = line[:broken] if broken <= 0 else line[:len(line) // 2] + line[len(line) // 2 + 1:]
    with small_pieces(piece):
        made = Pieces.of(line[:pieces.HEAD])
        if made is None:
            return
        buffer = bytearray()
        for chunk in chunked(line, cuts):
            buffer += chunk
            made.advance(buffer, len(buffer))
        assert outcome(made.finish, line) == outcome(parsed, line)


def test_pieces_are_cut_as_the_line_comes() -> None:
    """The elements are parsed before the line ends, only a piece's worth at a time."""
    line = page_line([{"uri": f"x://{i}", "name": '},{"uri":' * (i % 2)} for i in range(1000)], True, {})
    parsed_sizes: list[int] = []
    kept = pieces.loads_strict
    pieces.loads_strict = lambda data: (parsed_sizes.append(len(data)), kept(data))[1]  # type: ignore[assignment]
    try:
        with small_pieces(1000):
            made = Pieces.of(line[:256])
            assert made is not None
            buffer = bytearray()
            for chunk in chunked(line, list(range(0, len(line), 500))):
                buffer += chunk
                made.advance(buffer, len(buffer))
            assert len(made._items) > 900
            assert made.finish(line) == parsed(line)
    finally:
        pieces.loads_strict = kept
    assert max(parsed_sizes) < 2000


LINES = st.lists(st.one_of(
    st.just("page"), st.just("small-page"), st.just("not json {"), st.just('{"jsonrpc":"2.0","id":7,"result":{}}'),
    st.just('{"jsonrpc":"2.0","id":"agg-99","result":{"contents":[]}}'), st.just("y" * 300)), max_size=6)


@settings(max_examples=100, deadline=None)
@given(LINES, st.lists(st.integers(min_value=0, max_value=20000), max_size=10), st.booleans())
def test_the_tap_delivers_every_line_in_order_around_a_page_parsed_in_pieces(kinds: list[str], cuts: list[int],
                                                                            ended: bool) -> None:
    """Lines before, between and after pages parsed in pieces reach the reader in order (the last without its
    newline too); each page answers the listing waiting for it, as parsed whole."""
    resources = [{"uri": f"x://{i}", "name": '},{"uri":"' * (i % 3)} for i in range(200)]

    async def main() -> None:
        lane, _ = _lane()
        lane.negotiated("2025-11-25", {})
        reader = asyncio.StreamReader()
        stdout = StdoutTap(reader, 64 * 1024, lane)
        listings = [asyncio.ensure_future(lane.list_resources(None)) for kind in kinds if kind.endswith("page")]
        await asyncio.sleep(0)
        lines: list[bytes] = []
        pages: list[bytes] = []
        for kind in kinds:
            if kind.endswith("page"):
                page = page_line(resources if kind == "page" else resources[:2], True, {"nextCursor": "c"}, True)
                page = page.replace(b'"agg-1"', f'"agg-{len(pages) + 1}"'.encode())
                pages.append(page)
                lines.append(page)
            else:
                lines.append(kind.encode())
        data = b"".join(line + b"\n" for line in lines)
        if not ended:
            data += b"last"
        for chunk in chunked(data, cuts + list(range(0, len(data), 700))):  # as a pipe reads: a chunk at a time
            reader.feed_data(chunk)
        reader.feed_eof()
        got = [item async for item in stdout]
        expected: list[Any] = [line for line in lines if b'"nextCursor":"c"' not in line and b"agg-99" not in line]
        if not ended:
            expected.append(b"last")
        assert got == expected
        answered = await asyncio.wait_for(asyncio.gather(*listings), 10)
        assert answered == [parsed(page)["result"] for page in pages]

    finished: list[int] = []
    finish = Pieces.finish

    def finish_counted(self: Pieces, line: bytes) -> Any:
        finished.append(len(self._items))
        return finish(self, line)

    Pieces.finish = finish_counted  # type: ignore[method-assign]
    try:
        with small_pieces(500):
            asyncio.run(main())
    finally:
        Pieces.finish = finish  # type: ignore[method-assign]
    assert len(finished) == kinds.count("page") and all(finished)  # each big page was parsed in pieces


def test_a_listing_given_up_while_its_page_is_parsed_in_pieces() -> None:
    """A listing cancelled halfway through its page's line is cancelled at once (the loop turns between pieces), the
    upstream told; the rest of the page is dropped when it ends and the next line reaches the reader."""
    page = page_line([{"uri": f"x://{i}"} for i in range(400)], True, {})

    async def main() -> None:
        lane, written = _lane()
        lane.negotiated("2025-11-25", {})
        reader = asyncio.StreamReader()
        stdout = StdoutTap(reader, 64 * 1024, lane)
        listing = asyncio.ensure_future(lane.list_resources(None))
        await asyncio.sleep(0)
        data = page + b"\nnext\n"
        half = len(page) // 2
        for chunk in chunked(data[:half], list(range(0, half, 300))):
            reader.feed_data(chunk)
        assert stdout._pieces is not None and stdout._pieces._items  # parsing in pieces
        listing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listing
        assert b"notifications/cancelled" in written[-1] and not lane.listing
        for chunk in chunked(data[half:], list(range(0, len(data) - half, 300))):
            reader.feed_data(chunk)
        reader.feed_eof()
        assert [item async for item in stdout] == [b"next"]

    with small_pieces(500):
        asyncio.run(main())
