"""The stdio fast path for `resources/read` answers exactly as the SDK does, on both wires, errors included, and
takes only the requests it can answer so."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from aggregator.stdio_fast import FastReads
from tests.conftest import server_params

MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}
INFO, CAPABILITIES = "io.modelcontextprotocol/clientInfo", "io.modelcontextprotocol/clientCapabilities"


def _read(request_id: object, uri: object, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "resources/read", "params": {"uri": uri, **params}}


def _script(wire: str) -> list[dict[str, Any]]:
    """Requests as a client would pipe them: reads of each kind of target, missing and malformed ones."""
    meta: dict[str, Any] = {} if wire == "legacy" else {"_meta": MODERN_META}
    if wire == "legacy":
        opening: list[dict[str, Any]] = [
            _read(1, "docs://README.md"),  # before the handshake: the SDK's gate answers it
            {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pipe", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    else:
        opening = [{"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": MODERN_META}}]
    reads = [_read(10, "docs://README.md", **meta), _read("s", "docs://ref/page00.md", **meta),
             _read(11, "img://logo", **meta), _read(12, "note://inline", **meta), _read(13, "docs://readme", **meta),
             _read(14, "docs://missing.md", **meta), _read(15, "nothing://here", **meta),
             _read(16, "docs://README.md", extra=1, **meta), _read(17, 42, **meta), _read(18, "docs://README.md"),
             _read(19, "docs://README.md", _meta={**MODERN_META, "io.modelcontextprotocol/protocolVersion": "1999"}),
             _read(20, "docs://README.md", _meta={"progressToken": 5}),
             _read(21, "docs://README.md", _meta={**MODERN_META, "io.modelcontextprotocol/clientInfo": 5}),
             _read(22, "docs://README.md", _meta={**(MODERN_META if wire == "modern" else {}), "progressToken": 7}),
             _read(23, "docs://README.md", _meta={**MODERN_META, CAPABILITIES: {"roots": {"listChanged": True}}}),
             _read(24, "docs://README.md", _meta={**MODERN_META, CAPABILITIES: {"roots": {"listChanged": 1}}}),
             _read(25, "docs://README.md", _meta={**MODERN_META, CAPABILITIES: {"experimental": {"x": True}}}),
             _read(26, "docs://README.md", _meta={**MODERN_META, INFO: {"name": "pipe", "version": 1}}),
             _read(27, "docs://README.md", **meta),  # the first envelope again, after the others
             # What orjson refuses or reads otherwise than json (aggregator/codec.py): an id past 64 bits (a float
             # to orjson), a lone surrogate escaped (the SDK answers -32700, id null), NaN; each as the SDK does.
             _read(2**64 + 1, "docs://README.md", **meta), _read(28, "docs://\ud800.md", **meta),
             _read(29, "docs://README.md", _meta={**meta.get("_meta", {}), "progressToken": float("nan")}),
             _read(30, "docs://caf\u00e9.md", **meta),
             _read(0, "docs://guides/page01.md", **meta)]
    return [*opening, *reads]


def _answers(manifest: Path, wire: str, fast: bool) -> dict[Any, Any]:
    params = server_params(manifest, "--no-reload")
    env = {**os.environ, **(params.env or {}), "AGGREGATOR_STDIO_FAST": "1" if fast else "0"}
    lines = "".join(json.dumps(m) + "\n" for m in _script(wire))
    done = subprocess.run([params.command, *params.args], input=lines, capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    by_id = {a.get("id"): a for a in answers}
    assert len(by_id) == len(answers)
    return by_id


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_fast_answers_are_the_sdks(docs_manifest: Path, wire: str) -> None:
    slow, fast = _answers(docs_manifest, wire, False), _answers(docs_manifest, wire, True)
    ids = {2, 10, "s", 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 2**64 + 1, None, 29, 30, 0}
    assert set(slow) == ids | ({1} if wire == "legacy" else set())
    for request_id, answer in slow.items():
        assert fast[request_id] == answer, (request_id, fast[request_id], answer)
    assert "blob" in fast[11]["result"]["contents"][0] and "error" in fast[14]


class _Server:
    def __init__(self, middleware: list[Any]) -> None:
        self.middleware = middleware


async def _never(ctx: Any, params: Any) -> dict[str, Any]:
    raise AssertionError("not called")


def _taken(fast: FastReads, message: dict[str, Any]) -> object:
    return fast.take(json.dumps(message).encode() + b"\n", lambda *_: _never(None, None))


@pytest.mark.anyio
async def test_takes_only_well_formed_reads_after_the_handshake() -> None:
    from mcp.server._otel import OpenTelemetryMiddleware

    fast = FastReads(_Server([OpenTelemetryMiddleware()]), _never)
    init = types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize", params={})
    fast.saw(init)
    assert _taken(fast, _read(2, "a://b")) is None  # the handshake is not answered yet
    fast.answered(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
    for message in (_read(3, 5), _read(True, "a://b"), _read(3, "a://b", x=1), {**_read(3, "a://b"), "extra": 1},
                    _read(3, "a://b", _meta={"progressToken": 1}), {**_read(3, "a://b"), "method": "resources/list"}):
        assert _taken(fast, message) is None, message
    assert _taken(fast, _read(4, "a://b")) == 4
    assert _taken(fast, _read(4, "a://b")) is None  # an id still in flight is the SDK's to judge
    for task in list(fast.tasks.values()):
        task.cancel()
    other = FastReads(_Server([OpenTelemetryMiddleware(), object()]), _never)  # any other middleware sees every request
    other.saw(init)
    other.answered(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
    assert _taken(other, _read(5, "a://b")) is None


@pytest.mark.anyio
async def test_a_modern_read_is_taken_only_with_an_envelope_the_sdk_accepts() -> None:
    """Once an envelope is accepted, one that differs from it (a value, a key, or only the type of a value) is still
    classified and validated: refused when the SDK refuses it."""
    from mcp.server._otel import OpenTelemetryMiddleware

    fast = FastReads(_Server([OpenTelemetryMiddleware()]), _never)
    fast.saw(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="server/discover", params={"_meta": MODERN_META}))
    assert fast.era == "modern"
    assert _taken(fast, _read(2, "a://b", _meta={**MODERN_META, INFO: {"name": "c", "version": "1"}})) == 2
    refused = [{**MODERN_META, "io.modelcontextprotocol/protocolVersion": "1999"},
               {**MODERN_META, INFO: {"name": "c", "version": 1}}, {**MODERN_META, INFO: 5},
               {**MODERN_META, CAPABILITIES: {"experimental": {"x": True}}},
               {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}, {}]
    for request_id, meta in enumerate(refused, start=3):
        assert _taken(fast, _read(request_id, "a://b", _meta=meta)) is None, meta
    assert _taken(fast, _read(20, "a://b", _meta={**MODERN_META, INFO: {"name": "c", "version": "1"}})) == 20
    assert _taken(fast, _read(21, "a://b", _meta={**MODERN_META, CAPABILITIES: {"roots": {"listChanged": 1}}})) == 21
    assert _taken(fast, _read(22, "a://b")) is None  # no envelope: the SDK's
    for task in list(fast.tasks.values()):
        task.cancel()


@pytest.mark.anyio
async def test_a_read_leaves_the_in_flight_map_when_it_ends_or_is_cancelled() -> None:
    """A finished read is gone from `tasks` when its answer is written (no done-callback turn of the loop after it),
    a cancelled one as soon as the cancellation is seen (and cancelled on the next turn); its id is free again for
    the path at once."""
    import asyncio

    from mcp.server._otel import OpenTelemetryMiddleware

    answered: list[object] = []
    release = asyncio.Event()

    async def handler(ctx: Any, params: Any) -> dict[str, Any]:
        await release.wait()
        return {"contents": []}

    async def answer(request_id: object, data: object, error: object) -> None:
        answered.append(request_id)
        assert request_id not in fast.tasks  # already out of the map when the answer goes

    fast = FastReads(_Server([OpenTelemetryMiddleware()]), handler)
    fast.saw(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize", params={}))
    fast.answered(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
    line = json.dumps(_read(4, "a://b")).encode() + b"\n"
    assert fast.take(line, answer) == 4
    task = fast.tasks[4]
    fast.saw(types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 4}))
    assert 4 not in fast.tasks  # out at once; cancelled on the next turn, as the SDK cancels (the handler has begun)
    assert fast.take(line, answer) == 4  # the id is free again
    await asyncio.sleep(0)
    assert task.cancelling() and not fast.tasks[4].cancelling()
    release.set()
    await fast.tasks[4]
    assert answered == [4] and not fast.tasks


@pytest.mark.anyio
async def test_reads_are_taken_where_stdin_delivers_them_and_never_overtake_a_waiting_line() -> None:
    """`tap` takes whole reads as the pipe hands its bytes over (no turn of the reader task); anything else, a part
    of a line, and every line behind one the reader has not taken yet, go to the reader in order."""
    import asyncio

    from mcp.server._otel import OpenTelemetryMiddleware

    async def handler(ctx: Any, params: Any) -> dict[str, Any]:
        return {"contents": []}

    async def answer(request_id: object, data: object, error: object) -> None:
        pass

    fast = FastReads(_Server([OpenTelemetryMiddleware()]), handler)
    fast.saw(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize", params={}))
    fast.answered(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
    reader = asyncio.StreamReader()
    taken: list[object] = []
    fast.tap(reader, answer, taken.append)

    def line(message: dict[str, Any]) -> bytes:
        return json.dumps(message).encode() + b"\n"

    ping = line({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    reader.feed_data(line(_read(2, "a://b")) + line(_read(3, "a://c")) + ping + line(_read(4, "a://d"))
                     + line(_read(5, "a://e"))[:10])
    assert taken == [2, 3] and set(fast.tasks) == {2, 3}  # taken at once; the ping and all behind it wait
    reader.feed_data(line(_read(5, "a://e"))[10:] + line(_read(6, "a://f")))
    assert taken == [2, 3]  # the reader has not taken the ping yet: nothing overtakes it
    assert await reader.readline() == ping
    assert await reader.readline() == line(_read(4, "a://d"))
    assert await reader.readline() == line(_read(5, "a://e"))
    assert await reader.readline() == line(_read(6, "a://f"))
    reader.feed_data(line(_read(7, "a://g")))
    assert taken == [2, 3, 7]  # the reader has caught up: reads are taken where they arrive again
    await asyncio.gather(*fast.tasks.values())
