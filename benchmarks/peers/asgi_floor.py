"""The HTTP floor: a bare ASGI app on uvicorn with httptools, no SDK and no framework (issue 29).

Usage: python -m benchmarks.peers.asgi_floor FOLDER PAGE_SIZE --http PORT   (URIs are bench://<path>)

Every POST to /mcp: read the body, `json.loads` it, and for `resources/read` find the URI in a dict built by one walk
of FOLDER at start, open and read the file, and answer one JSON body with the result the aggregator gives on that
request's wire: on the modern wire (a `MCP-Protocol-Version` header of 2026-07-28) the contents with `ttlMs`,
`cacheScope`, `resultType` and the `serverInfo` stamp; otherwise (the 2025-11-25 wire) the contents alone, as
`application/json` (what a legacy server with JSON responses sends; the aggregator's default there is an SSE body).
`initialize` gets a minimal result and an `Mcp-Session-Id`; a notification gets 202; unknown URIs -32602 with
data.uri. No header, session or envelope checks, no thread: what answering a read over HTTP costs in Python at least.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from benchmarks.peers.stdlib_floor import PREFIX, walk

TTL_MS = 300_000
MODERN = "2026-07-28"
SERVER_INFO = {"io.modelcontextprotocol/serverInfo": {"name": "asgi-floor", "version": "1"}}
_JSON = [(b"content-type", b"application/json")]


def app_for(root: str) -> Any:
    """The ASGI app over `root`."""
    paths = {PREFIX + path: os.path.join(root, path) for path, _ in walk(root)}

    def result(method: str, params: dict[str, Any], modern: bool) -> dict[str, Any]:
        if method == "initialize":
            return {"protocolVersion": params.get("protocolVersion", "2025-11-25"), "capabilities": {"resources": {}},
                    "serverInfo": {"name": "asgi-floor", "version": "1"}}
        uri = params["uri"]
        path = paths.get(uri)
        if path is None:
            raise KeyError(uri)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        answer: dict[str, Any] = {"contents": [{"uri": uri, "mimeType": "text/markdown", "text": text}]}
        if modern:
            answer.update(ttlMs=TTL_MS, cacheScope="public", resultType="complete", _meta=SERVER_INFO)
        return answer

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        request = json.loads(b"".join(chunks))
        headers = [*_JSON]
        if "id" not in request:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        modern = (b"mcp-protocol-version", MODERN.encode()) in scope["headers"]
        try:
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"],
                                     "result": result(request["method"], request.get("params") or {}, modern)}
        except KeyError:
            missing = {"code": -32602, "message": "Resource not found", "data": {"uri": request["params"]["uri"]}}
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": missing}
        if request["method"] == "initialize":
            headers.append((b"mcp-session-id", b"floor"))
        body = json.dumps(reply, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def main(argv: list[str]) -> None:
    import uvicorn

    root, port = argv[0], int(argv[argv.index("--http") + 1])
    uvicorn.run(app_for(root), host="127.0.0.1", port=port, http="httptools", lifespan="off", log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
