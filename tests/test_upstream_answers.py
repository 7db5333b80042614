"""aggregator.upstream.answers: a read's answer taken from the wire's dict (`read_answer`) agrees with the SDK's result
model and `read_result` wherever it takes one, and leaves every other shape to them."""

from __future__ import annotations

import base64
from typing import Any

import mcp_types as types
import pytest
from pydantic import ValidationError

from aggregator.sources.base import SourceError, SourceNotFound, SourceTooLarge
from aggregator.upstream.answers import UpstreamRead, read_answer, read_result
from aggregator.upstream.lane import LooseResult, parsed

URI = "test://a"
TEXT = {"uri": URI, "text": "héllo", "mimeType": "text/plain"}
BLOB = {"uri": URI, "blob": base64.b64encode(b"\x00\x01png").decode(), "mimeType": "image/png"}
RESULTS: list[dict[str, Any]] = [
    {"contents": [TEXT]},
    {"contents": [BLOB]},
    {"contents": [{"uri": URI, "text": "x"}]},
    {"contents": [{"uri": URI, "text": "x", "mimeType": None, "_meta": {"k": 1}}], "_meta": None},
    {"contents": [{"uri": "test://sub", "text": "s"}, TEXT], "resultType": "complete"},
    {"contents": [TEXT], "ttlMs": 5000, "cacheScope": "public"},
    {"contents": [TEXT], "ttlMs": 0},
    {"contents": [TEXT], "cacheScope": "private", "extra": [1]},
    {"contents": []},
    {"contents": [{"uri": URI, "text": "x" * 101}]},
    {"contents": [{"uri": URI, "blob": base64.b64encode(b"y" * 101).decode()}]},
    {"contents": [{"uri": URI, "blob": "not base64!"}]},
    # Shapes the model decides (it rejects or coerces them): never taken from the dict.
    {"contents": [TEXT], "ttlMs": -1},
    {"contents": [TEXT], "ttlMs": 5.0},
    {"contents": [TEXT], "ttlMs": True},
    {"contents": [TEXT], "ttlMs": "5"},
    {"contents": [TEXT], "cacheScope": "shared"},
    {"contents": [{"uri": URI, "text": "x", "blob": "eA=="}]},
    {"contents": [{"uri": URI}]},
    {"contents": [{"uri": 5, "text": "x"}]},
    {"contents": [{"uri": URI, "text": 5}]},
    {"contents": [{"uri": URI, "text": "x", "mimeType": 5}]},
    {"contents": [{"uri": URI, "text": "x", "_meta": []}]},
    {"contents": [TEXT], "_meta": "no"},
    {"contents": [["no"]]},
    {"contents": {"uri": URI}},
    {"contents": None},
    {},
]


def _by_model(result: dict[str, Any], modern: bool) -> UpstreamRead | type[Exception]:
    try:
        model = types.ReadResourceResult.model_validate(result, by_name=False)
    except ValidationError:
        return ValidationError
    sent = model.model_fields_set
    given = (model.ttl_ms if "ttl_ms" in sent else None, model.cache_scope if "cache_scope" in sent else None)
    try:
        return read_result("up", URI, model, 100, *(given if modern else (None, None)))
    except (SourceNotFound, SourceTooLarge, SourceError) as exc:
        return type(exc)


@pytest.mark.parametrize("modern", [False, True])
@pytest.mark.parametrize("result", RESULTS, ids=range(len(RESULTS)))
def test_read_answer_agrees_with_the_model(result: dict[str, Any], modern: bool) -> None:
    expected = _by_model(result, modern)
    try:
        quick: UpstreamRead | type[Exception] | None = read_answer("up", URI, result, 100, modern)
    except (SourceNotFound, SourceTooLarge, SourceError) as exc:
        quick = type(exc)
    assert quick is None or quick == expected


def test_read_answer_takes_the_common_shapes() -> None:
    """What upstreams answer (text or blob contents, with or without the modern wire's hints) is taken from the dict."""
    for result in RESULTS[:8]:
        for modern in (False, True):
            assert isinstance(read_answer("up", URI, result, 100, modern), UpstreamRead)
    read = read_answer("up", URI, {"contents": [TEXT], "ttlMs": 5000, "cacheScope": "public"}, 100, True)
    assert read is not None and (read.ttl_ms, read.cache_scope) == (5000, "public")
    assert read.first.data == "héllo".encode() and read.first.is_text


@pytest.mark.parametrize(("text", "encoded_now"), [("a" * 100, False), ("é" * 25, False), ("é" * 26, True),
                                                    ("é" * 50, True), ("\U0001f600" * 25, False)])
def test_a_texts_utf8_is_encoded_only_when_asked_for_or_when_its_size_is_in_doubt(text: str, encoded_now: bool) -> None:
    """Within the bound at 4 bytes a character, a text's bytes are left unencoded (a served text needs none); nearer
    the bound they are encoded to check their size exactly. Either way its bytes are its UTF-8."""
    read = read_answer("up", URI, {"contents": [{"uri": URI, "text": text}]}, 100, False)
    assert read is not None
    assert (read.first.raw is not None) == encoded_now
    assert read.first.data == text.encode() and read.first.raw == text.encode() and read.first.text == text


def test_a_text_past_the_bound_once_encoded_is_too_large_as_before() -> None:
    with pytest.raises(SourceTooLarge) as raised:
        read_answer("up", URI, {"contents": [{"uri": URI, "text": "é" * 51}]}, 100, False)
    assert (raised.value.size, raised.value.limit) == (102, 100)


def test_a_result_the_stdlib_parsed_is_left_to_the_model() -> None:
    """A line orjson refuses (here a lone surrogate's escape) is parsed by the stdlib, its result marked loose: the
    SDK's model decides it, and its text, which no UTF-8 encodes, keeps the bytes `surrogatepass` gives."""
    line = b'{"jsonrpc": "2.0", "id": "agg-1", "result": {"contents": [{"uri": "test://a", "text": "a\\ud800b"}]}}'
    message = parsed(line)
    assert type(message["result"]) is LooseResult
    assert read_answer("up", URI, message["result"], 100, False) is None
    model = types.ReadResourceResult.model_validate(message["result"], by_name=False)
    content = read_result("up", URI, model, 100).first
    assert content.data == "a\ud800b".encode("utf-8", "surrogatepass") and content.text is None
    assert type(parsed(line.replace(b"\\ud800", b"x"))["result"]) is dict
