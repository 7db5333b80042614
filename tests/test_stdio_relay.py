"""The text of a relayed answer taken as the upstream wrote it (`stdio_relay._text_token`): wherever a kept shape
says its answers' one string `"text"` is their content's key, the token found decodes to the answer's text, whatever
the encoder (compact or spaced, ASCII-escaped or not, keys in any order), and a text written with escapes, an
escaped key or a `"text"` inside another string is never taken for it."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import assume, given
from hypothesis import strategies as st

from aggregator.codec import dumps
from aggregator.stdio_relay import _MAX_QUOTES, _TEXT_KEY, _text_token

_KEY = "\x01KEY\x01"
"""Stands for the content's text key while a line is encoded, so that the test can write it plainly or escaped."""
_texts = st.text(st.characters(blacklist_categories=("Cs",)))
_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | _texts,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
                     max_leaves=6)


def _encode(message: dict[str, Any], how: str) -> bytes:
    if how == "orjson":
        return orjson.dumps(message)
    if how == "spaced":
        return json.dumps(message, ensure_ascii=False).encode()
    return json.dumps(message, separators=(",", ":"), ensure_ascii=how == "ascii").encode()


def _spliced(result: dict[str, Any]) -> bool:
    """What `stdio_relay._shape_of` keeps: whether `result`, its text emptied, holds one string `"text"`."""
    item = result["contents"][0]
    return dumps({**result, "contents": [{**item, "text": ""}, *result["contents"][1:]]}).count(_TEXT_KEY) == 1


@given(text=_texts, uri=_texts, meta=st.none() | _json, text_first=st.booleans(), id_last=st.booleans(),
       how=st.sampled_from(["orjson", "spaced", "ascii", "compact"]), escaped_key=st.booleans())
def test_the_token_found_is_the_answers_text(text: str, uri: str, meta: Any, text_first: bool, id_last: bool,
                                            how: str, escaped_key: bool) -> None:
    item = {_KEY: text, "uri": uri} if text_first else {"uri": uri, "mimeType": "text/plain", _KEY: text}
    result: dict[str, Any] = {"contents": [item], **({"_meta": meta} if meta is not None else {})}
    envelope = {"jsonrpc": "2.0", "id": "agg-7"}
    message = {"result": result, **envelope} if id_last else {**envelope, "result": result}
    key = _encode(_KEY, how)
    line = _encode(message, how).replace(key, b'"\\u0074ext"' if escaped_key else b'"text"')
    parsed = orjson.loads(line)
    assert parsed["result"]["contents"][0]["text"] == text
    shape_result = {**parsed["result"], "contents": [{**parsed["result"]["contents"][0]}]}
    assume(_spliced(shape_result))  # anything else is encoded again
    token = _text_token(line)
    if token is not None:
        assert orjson.loads(token) == text
    elif not escaped_key and text.count('"') < _MAX_QUOTES - 1:
        raise AssertionError(f"no token found in {line!r}")


def test_a_text_key_inside_another_string_or_a_value_is_not_taken() -> None:
    for line in (b'{"result":{"contents":[{"uri":"a\\"text\\":\\"no","text":"yes"}]}}',  # inside a string
                 b'{"result":{"contents":[{"uri":"text","text":"yes"}]}}',  # a value: no colon follows
                 b'{"result":{"contents":[{"text":1}]}}'):  # not a string
        token = _text_token(line)
        assert token is None or orjson.loads(token) == "yes", line
    assert _text_token(b'{"result":{"contents":[{"uri":"a\\"text\\":\\"no","text":"yes"}]}}') == b'"yes"'
    # A string that ends with `"text`: its `"text"` follows a backslash, and nothing after it is looked at.
    assert _text_token(b'{"result":{"contents":[{"uri":"a\\"text","text":"yes"}]}}') is None
    assert _text_token(b'{"result":{"contents":[{"a\\"text":"no","text":"yes"}]}}') is None  # a key ending so
    assert _text_token(b'{"result":{"contents":[{"text": "a \\\\\\"b\\\\"}]}}') == b'"a \\\\\\"b\\\\"'
    many = "\"" * _MAX_QUOTES
    assert _text_token(orjson.dumps({"text": many})) is None  # looked through no further: encoded again
