"""The hot paths' codec gives what the stdlib's json gives, but where aggregator/codec.py says otherwise."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.codec import dumps, dumps_line, loads, loads_strict

_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_TEXT = st.text(st.characters(codec=None))  # every code point, lone surrogates included
_FINITE = st.floats(allow_nan=False, allow_infinity=False)


def _json(scalars: st.SearchStrategy[Any], keys: st.SearchStrategy[str] = _TEXT) -> st.SearchStrategy[Any]:
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                        max_leaves=20)


def _same(a: Any, b: Any) -> bool:
    """`a` (the codec's) equal to `b` (the stdlib's), NaN equal to NaN and 1 apart from 1.0 and True; an integer of
    `b` past 64 bits is the nearest float in `a` (as the codec's docstring says)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(b) is int and not -(2**63) <= b < 2**64:
        return type(a) is float and a == float(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _outcome(parse: Any, line: bytes) -> Any:
    try:
        return parse(line)
    except (ValueError, RecursionError) as exc:
        return type(exc)


@settings(max_examples=300)
@given(_json(st.none() | st.booleans() | _INT64 | st.floats() | _TEXT), st.booleans())
def test_loads_reads_what_json_writes_as_json_reads_it(value: Any, ascii: bool) -> None:
    line = json.dumps(value, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    assert _same(loads(line), json.loads(line))


@settings(max_examples=300)
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_loads_takes_and_refuses_any_bytes_as_json_does(line: bytes) -> None:
    got, expected = _outcome(loads, line), _outcome(json.loads, line)
    if isinstance(expected, type):
        assert got is expected or (issubclass(got, ValueError) and issubclass(expected, ValueError)), (got, expected)
    else:
        assert _same(got, expected)


@pytest.mark.parametrize("line", [b'"\\ud800"', b'{"x":NaN}', b'[Infinity]', b"\xef\xbb\xbf{}",
                                  b"[" * 2000 + b"]" * 2000])
def test_loads_strict_refuses_what_orjson_does_and_loads_takes_as_json_does(line: bytes) -> None:
    with pytest.raises(ValueError):
        loads_strict(line)
    assert _same(_outcome(loads, line), _outcome(json.loads, line))


def test_an_integer_past_64_bits_is_read_as_the_nearest_float() -> None:
    assert loads(b"[18446744073709551615,-9223372036854775808]") == [2**64 - 1, -(2**63)]
    past = loads(b"[18446744073709551617]")[0]
    assert type(past) is float and past == float(2**64 + 1)


@settings(max_examples=300)
@given(_json(st.none() | st.booleans() | st.integers() | _TEXT), st.booleans())
def test_dumps_writes_what_json_writes(value: Any, sort_keys: bool) -> None:
    def stdlib() -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode()

    try:
        expected: Any = stdlib()
    except UnicodeEncodeError:
        expected = UnicodeEncodeError
    if expected is UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            dumps(value, sort_keys)
        with pytest.raises(UnicodeEncodeError):
            dumps_line(value)
    else:
        assert dumps(value, sort_keys) == expected
        if not sort_keys:
            assert dumps_line(value) == expected + b"\n"


@settings(max_examples=200)
@given(_json(_FINITE, st.text()))
def test_a_float_is_written_as_the_same_number(value: Any) -> None:
    assert _same(json.loads(dumps(value)), value)


def test_nan_and_infinities_are_written_as_null_and_other_types_as_json_writes_or_refuses_them() -> None:
    assert dumps([float("nan"), float("inf"), -float("inf")]) == b"[null,null,null]"

    class Name(str):
        pass

    assert dumps({Name("k"): Name("v"), "n": True}) == b'{"k":"v","n":true}'
    assert dumps({1: 2, None: 3}) == json.dumps({1: 2, None: 3}, separators=(",", ":")).encode()
    with pytest.raises(TypeError):
        dumps({"when": object()})
