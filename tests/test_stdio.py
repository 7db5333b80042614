"""The answers `aggregator.stdio` gives lines the SDK cannot decode."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest

from aggregator.core import Aggregator
from aggregator.errors import ResourceNotFound, ResourceTooLarge
from aggregator.sources.base import Blob
from aggregator.stdio import unreadable_line_error
from tests.conftest import PNG_BYTES


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


async def _read_ahead(aggregator: Aggregator, uri: str) -> None:
    job = aggregator.read_ahead(uri)
    if job is not None:
        await job


def test_read_ahead_loads_a_cold_file_once_for_the_read_and_nothing_else(docs_manifest: Path) -> None:
    """What the stdio transport starts when a `resources/read` line arrives: the file's load, which the read then
    takes (one source call, counted once as a miss); a cached file, an inline text or an unknown URI cost nothing,
    and a file that fails raises nothing: the read that follows gets the failure (one source call, one error)."""

    async def main() -> None:
        aggregator = await Aggregator.open(docs_manifest)
        source = aggregator.sources["docs"]
        calls: list[str] = []
        real_read = source.read

        async def counted(path: str, max_bytes: int) -> Blob:
            calls.append(path)
            return await real_read(path, max_bytes)

        source.read = counted  # type: ignore[method-assign]
        try:
            await _read_ahead(aggregator, "docs://readme")
            assert calls == ["README.md"] and aggregator.cache.misses == 0
            assert (await aggregator.read("docs://readme")).text == "# Readme\n"
            assert calls == ["README.md"] and (aggregator.cache.misses, aggregator.cache.hits) == (1, 0)
            for uri in ("docs://readme", "note://inline", "nope://x"):  # cached, not a file, unknown: no work at all
                assert aggregator.read_ahead(uri) is None
            for uri in ("note://inline", "nope://x", "file://docs/missing.md", "file://docs/big.bin", "img://logo"):
                await _read_ahead(aggregator, uri)
            assert calls == ["README.md", "missing.md", "big.bin", "logo.png"]
            assert (await aggregator.read("img://logo")).blob == PNG_BYTES
            with pytest.raises(ResourceNotFound):  # the read-ahead's failure, not a second source call
                await aggregator.read("file://docs/missing.md")
            with pytest.raises(ResourceTooLarge):
                await aggregator.read("file://docs/big.bin")
            assert calls == ["README.md", "missing.md", "big.bin", "logo.png"]
            assert aggregator.source_errors["docs"] == 1  # big.bin, counted once
            with pytest.raises(ResourceNotFound):  # the next read of it calls the source again: nothing cached
                await aggregator.read("file://docs/missing.md")
            assert calls[-1] == "missing.md" and len(calls) == 5
        finally:
            await aggregator.aclose()

    anyio.run(main)
