"""The stdio fast path for `resources/list` and `resources/templates/list` answers exactly as the SDK does: the same
bytes on both wires for every kind of listed item (titles, descriptions, icons, annotations, non-ASCII names),
every page, errors included; and takes only the requests it can answer so."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from aggregator.catalog import encode_cursor
from aggregator.stdio_fast import FastReads
from tests.conftest import server_params, write_manifest
from tests.test_stdio_fast import _never, _Server, _taken

MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture
def listed_manifest(docs_tree: Path) -> Path:
    """Every kind of item `mcp_shapes` lists, in pages of 4."""
    (docs_tree / "ref" / "çafé ünïcode.md").write_text("# Ü\n", encoding="utf-8")
    return write_manifest(docs_tree.parent, """
        version: 1
        server: {name: lists, version: "1.0", pageSize: 4}
        defaults: {ttl: 90s}
        sources:
          docs: {url: ./docs}
        resources:
          - uri: "docs://readme"
            name: readme
            title: Read me ✓
            description: "The \\"readme\\" <b>first</b>"
            source: docs
            path: README.md
            mimeType: text/markdown
            icons: [{src: "https://example.com/i.png", mimeType: image/png, sizes: ["48x48", "96x96"], theme: dark}]
            annotations: {audience: [user, assistant], priority: 1, lastModified: "2026-01-15T09:00:00Z"}
          - {uri: "note://inline", name: inline, text: "Inline content", annotations: {priority: 0.25}}
          - {uri: "img://logo", name: logo, source: docs, path: logo.png}
        collections:
          - {source: docs, glob: "ref/*.md", uri: "docs://{path}", name: "{stem}", annotations: {lastModified: file}}
          - {source: docs, glob: "guides/*.md", uri: "guide://{stem}", name: "{stem}", description: "Guide {stem}",
             annotations: {audience: [assistant]}}
        templates:
          - {uriTemplate: "file://docs/{+path}", name: file, source: docs, path: "{path}", title: Files,
             annotations: {priority: 0.5}}
          - {uriTemplate: "page://{name}", name: page, source: docs, path: "guides/{name}.md"}
        """)


def _request(request_id: object, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _script(wire: str) -> list[dict[str, Any]]:
    """The whole listing page by page (cursors are the catalog's, made here), templates, and malformed requests."""
    meta: dict[str, Any] = {} if wire == "legacy" else {"_meta": MODERN_META}
    if wire == "legacy":
        opening: list[dict[str, Any]] = [
            _request(1, "resources/list"),  # before the handshake: the SDK's gate answers it
            _request(2, "initialize", protocolVersion="2025-11-25", capabilities={},
                     clientInfo={"name": "pipe", "version": "1"}),
            {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    else:
        opening = [_request(2, "server/discover", _meta=MODERN_META)]
    uris = sorted(["docs://readme", "note://inline", "img://logo", "docs://ref/%C3%A7af%C3%A9%20%C3%BCn%C3%AFcode.md",
                   *(f"docs://ref/page{i:02}.md" for i in range(0, 12, 2)),
                   *(f"guide://page{i:02}" for i in range(1, 12, 2))])
    pages = [_request(10, "resources/list", **meta)]
    pages += [_request(100 + n, "resources/list", cursor=encode_cursor(uris[n * 4 - 1]), **meta)
              for n in range(1, len(uris) // 4 + 1)]
    templates = [_request(20, "resources/templates/list", **meta),
                 _request(21, "resources/templates/list", cursor=encode_cursor("file://docs/{+path}"), **meta)]
    odd = [_request(30, "resources/list", cursor="not a cursor", **meta),
           _request(31, "resources/list", cursor="", **meta),
           _request(32, "resources/list", cursor=None, **meta),
           _request(33, "resources/list", cursor=7, **meta),
           _request(34, "resources/list", extra=1, **meta),
           {"jsonrpc": "2.0", "id": 35, "method": "resources/list"},
           _request(36, "resources/list", _meta={"progressToken": 5}),
           _request(37, "resources/list"),
           _request(38, "resources/templates/list", cursor="bad", **meta),
           _request(39, "resources/list", _meta={**MODERN_META, "io.modelcontextprotocol/protocolVersion": "1999"}),
           {"jsonrpc": "2.0", "id": 40, "method": "resources/list", "params": [1]}]
    return [*opening, *pages, *templates, *odd]


def _answers(manifest: Path, wire: str, fast: bool, script: list[dict[str, Any]] | None = None) -> dict[Any, str]:
    """Each answer's line as the server wrote it, by request id (to `script`, by default `_script(wire)`)."""
    params = server_params(manifest, "--no-reload")
    env = {**os.environ, **(params.env or {}), "AGGREGATOR_STDIO_FAST": "1" if fast else "0"}
    lines = "".join(json.dumps(m) + "\n" for m in (script if script is not None else _script(wire)))
    done = subprocess.run([params.command, *params.args], input=lines.encode(), capture_output=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = [line for line in done.stdout.decode("utf-8").splitlines() if line.strip()]
    by_id = {json.loads(line).get("id"): line for line in answers}
    assert len(by_id) == len(answers)
    return by_id


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_fast_pages_are_the_sdks_byte_for_byte(listed_manifest: Path, wire: str) -> None:
    slow, fast = _answers(listed_manifest, wire, False), _answers(listed_manifest, wire, True)
    assert set(fast) == set(slow)
    for request_id, line in slow.items():
        assert fast[request_id] == line, (request_id, fast[request_id], line)
    pages = [10, *sorted(k for k in fast if isinstance(k, int) and 100 <= k < 200)]
    listed = [r for k in pages for r in json.loads(fast[k])["result"]["resources"]]
    assert len(listed) == 16 and len({r["uri"] for r in listed}) == 16
    assert "nextCursor" not in json.loads(fast[pages[-1]])["result"]
    first = json.loads(fast[10])["result"]
    assert ("ttlMs" in first) == (wire == "modern") and "nextCursor" in first
    readme = next(r for r in listed if r["uri"] == "docs://readme")
    assert readme["title"] == "Read me ✓" and readme["icons"][0]["sizes"] == ["48x48", "96x96"]
    assert "Read me ✓" in next(fast[k] for k in pages if "docs://readme" in fast[k])  # UTF-8, as the SDK writes it
    assert [t["name"] for t in json.loads(fast[20])["result"]["resourceTemplates"]] == ["file", "page"]
    assert [t["name"] for t in json.loads(fast[21])["result"]["resourceTemplates"]] == ["page"]
    assert json.loads(fast[30])["error"]["code"] == types.INVALID_PARAMS


@pytest.mark.anyio
async def test_takes_only_well_formed_listings() -> None:
    from mcp.server._otel import OpenTelemetryMiddleware

    fast = FastReads(_Server([OpenTelemetryMiddleware()]), None, {"resources/list": _never})
    fast.saw(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize", params={}))
    fast.answered(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"protocolVersion": "2025-11-25"}))
    for message in (_request(3, "resources/list", cursor=None), _request(3, "resources/list", cursor=1),
                    _request(3, "resources/list", cursor="c", x=1), _request(3, "resources/list", _meta={}),
                    _request(3, "resources/templates/list"), _request(3, "resources/read", uri="a://b"),
                    {"id": 3, "method": "resources/list"}, {**_request(3, "resources/list"), "params": None}):
        assert _taken(fast, message) is None, message
    assert _taken(fast, {"jsonrpc": "2.0", "id": 4, "method": "resources/list"}) == 4
    assert _taken(fast, _request(5, "resources/list", cursor="")) == 5
    assert _taken(fast, _request("6", "resources/list", cursor="abc")) == "6"
    for task in list(fast.tasks.values()):
        task.cancel()


@pytest.fixture
def plain_manifest(docs_tree: Path) -> Path:
    """Collections whose names are their paths (their pages are encoded from the rows' columns, `listing_json`):
    mixed types, a description to escape, icons, annotations with each file's time, a declared type."""
    return write_manifest(docs_tree.parent, """
        version: 1
        server: {name: plain, version: "1.0", pageSize: 3}
        sources:
          docs: {url: ./docs}
        resources:
          - {uri: "all://guides/page01.md0", name: between, text: "x", title: Between}
        collections:
          - source: docs
            glob: "**/*"
            uri: "all://{path}"
            name: "{path}"
            description: 'Every "file" at 100% ✓'
            icons: [{src: "https://example.com/i.png", mimeType: image/png}]
            annotations: {audience: [user], priority: 0.5, lastModified: file}
          - {source: docs, glob: "ref/*.md", uri: "ref://{path}?v=1", name: "{path}", mimeType: text/x-ref}
        """)


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_plain_collections_pages_are_the_sdks_byte_for_byte(plain_manifest: Path, wire: str) -> None:
    """Pages after cursors anywhere in the listing (every kind of row: compact rows of both collections, rows that
    need percent-encoding, a manifest resource among them) are the SDK's, byte for byte, on both wires."""
    after = ["", "all://", "all://d", "all://guides/page01.md", "all://guides/page05.md", "all://n", "all://ref/",
             "ref://ref/page04.md?v=1", "zzz"]
    meta: dict[str, Any] = {} if wire == "legacy" else {"_meta": MODERN_META}
    pages = [_request(100 + n, "resources/list", **({"cursor": encode_cursor(key)} if key else {}), **meta)
             for n, key in enumerate(after)]
    opening = _script(wire)[:3 if wire == "legacy" else 1]  # the handshake (legacy: and a request before it)
    slow, fast = (_answers(plain_manifest, wire, False, [*opening, *pages]),
                  _answers(plain_manifest, wire, True, [*opening, *pages]))
    assert set(fast) == set(slow) and len(fast) == len(pages) + (2 if wire == "legacy" else 1)
    for request_id, line in slow.items():
        assert fast[request_id] == line, (request_id, fast[request_id], line)
    first = json.loads(fast[100])["result"]["resources"]
    assert [r["uri"] for r in first] == ["all://README.md", "all://big.bin", "all://data.json"]
    assert first[0]["annotations"]["lastModified"].endswith("Z") and first[0]["description"].endswith("100% ✓")
