"""The answers `aggregator.stdio` gives lines the SDK cannot decode."""

from __future__ import annotations

import mcp_types as types
import pytest

from aggregator.stdio import unreadable_line_error


def _decode_error(line: str) -> Exception:
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:  # noqa: BLE001 - the SDK's stdin reader passes on whatever it raised
        return exc
    raise AssertionError(f"{line!r} decoded")


@pytest.mark.parametrize(("line", "code", "request_id"), [
    ("not json {\n", types.PARSE_ERROR, None),
    ('{"jsonrpc": "2.0", "id": 4, "method": "resources/read", \n', types.PARSE_ERROR, None),
    ('{"a": 1}\n', types.INVALID_REQUEST, None),
    ("[1, 2]\n", types.INVALID_REQUEST, None),
    ('{"jsonrpc": "2.0", "id": 9, "method": 3}\n', types.INVALID_REQUEST, 9),
    ('{"jsonrpc": "2.0", "id": "x", "method": ["a"]}\n', types.INVALID_REQUEST, "x"),
    ('{"jsonrpc": "2.0", "id": true, "method": 3}\n', types.INVALID_REQUEST, None),
])
def test_undecodable_lines_get_the_json_rpc_error(line: str, code: int, request_id: object) -> None:
    error = unreadable_line_error(_decode_error(line))
    assert error is not None and error.error.code == code and error.id == request_id


def test_blank_lines_and_other_failures_get_no_answer() -> None:
    assert unreadable_line_error(_decode_error("\n")) is None
    assert unreadable_line_error(_decode_error("   \r\n")) is None
    assert unreadable_line_error(OSError("stdin went away")) is None
