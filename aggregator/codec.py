"""The JSON codec of the hot paths (reads and listings on stdio and HTTP, an upstream's answers): orjson, which
parses and writes a read's line in a third to a sixth of the stdlib's time, wherever it gives what `json` would;
the stdlib wherever it refuses, so what it takes or writes is taken or written as before.

Where the two differ and orjson does not refuse: an integer past 64 bits is parsed as the nearest float (as a
JavaScript peer reads it), a value nested deeper than the stdlib's recursion limit allows (but at most 1,024 levels)
is parsed, and NaN or an infinity is written as `null` (the stdlib writes `NaN`, which is not JSON). A float may be
written in another of its shortest forms (`1e-7` for the stdlib's `1e-07`): the same number. So an upstream's
integer past 64 bits where the SDK's models want an integer (a resource's `size` of 2**70) fails their check, and
the page holding it is malformed, as it would be to a JavaScript client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["dumps", "dumps_line", "loads", "loads_strict"]

_dumps = orjson.dumps
_loads = orjson.loads
_DecodeError = orjson.JSONDecodeError
_EncodeError = orjson.JSONEncodeError
# Subclasses of str, int, dict and list, dataclasses and datetimes: orjson would write them its own way; the stdlib
# writes the first four as their base type and refuses the rest, so they go to it.
_AS_STDLIB = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_AS_STDLIB_SORTED = _AS_STDLIB | orjson.OPT_SORT_KEYS
_AS_STDLIB_LINE = _AS_STDLIB | orjson.OPT_APPEND_NEWLINE
_stdlib_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_stdlib_encode_sorted = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


def loads(line: bytes) -> Any:
    """What `json.loads(line)` gives (ValueError or RecursionError as it raises them), but for integers past 64
    bits, which arrive as the nearest float."""
    try:
        return _loads(line)
    except _DecodeError:
        # Not UTF-8 as orjson wants it (a BOM, a lone surrogate escape), NaN, nested past 1,024, or not JSON: the
        # stdlib decides, reading a line that opens `{"` as UTF-8 with surrogates passed, as json.loads does.
        return json.loads(line.decode("utf-8", "surrogatepass") if line[:2] == b'{"' else line)


loads_strict: Callable[[bytes], Any] = _loads
"""`line` as orjson parses it: UTF-8 with no lone surrogate, no NaN, at most 1,024 levels deep; ValueError
otherwise. For a fast path that hands on what it does not take: the SDK's own parser then decides (it refuses a lone
surrogate too, which `loads` would let through). orjson's own function: a wrapper would cost every request a call."""


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    """`value` as compact UTF-8 JSON: `json.dumps(value, ensure_ascii=False, separators=(",", ":"),
    sort_keys=sort_keys).encode()`, but for NaN and infinities (`null`); the stdlib's errors where it raises (a lone
    surrogate: UnicodeEncodeError)."""
    try:
        return _dumps(value, option=_AS_STDLIB_SORTED if sort_keys else _AS_STDLIB)
    except _EncodeError:  # an integer past 64 bits, a key that is not a string, a lone surrogate, a type of its own
        return (_stdlib_encode_sorted if sort_keys else _stdlib_encode)(value).encode("utf-8")


def dumps_line(value: Any) -> bytes:
    """`dumps(value)` and a newline: one line of a JSON-lines stream, written whole (no copy to add the newline)."""
    try:
        return _dumps(value, option=_AS_STDLIB_LINE)
    except _EncodeError:
        return _stdlib_encode(value).encode("utf-8") + b"\n"
