"""A raw stdio upstream (stdlib only) for tests/test_upstream_pages.py: `resources/list` is answered with the
`result` in the JSON file `PAGE_FILE` as it is written there (pages `{"0": result, "c1": result, ...}` by cursor,
"0" the first), on the wire the client picks (`server/discover`: 2026-07-28, else the `initialize` handshake). The
id of every resources/list request is appended to `IDS_FILE`, one JSON value a line, and that of every request
cancelled as `{"cancelled": id}`. With `PAGE_ANSWER=none` resources/list is never answered; with `PAGE_ANSWER=junk`
it is answered with a result that is no JSON-RPC result (a number)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

PAGES: dict[str, Any] = json.load(open(os.environ["PAGE_FILE"], encoding="utf-8"))
HINTS = {"resultType": "complete", "ttlMs": 0, "cacheScope": "public"}
ANSWER = os.environ.get("PAGE_ANSWER", "page")


def note(value: Any) -> None:
    with open(os.environ["IDS_FILE"], "a", encoding="utf-8") as ids:
        ids.write(json.dumps(value) + "\n")


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    rid, method, params = request.get("id"), request.get("method"), request.get("params") or {}
    if method == "notifications/cancelled":
        note({"cancelled": params.get("requestId")})
    if rid is None:
        continue
    if method == "server/discover":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "supportedVersions": ["2026-07-28"], "capabilities": {"resources": {}}, **HINTS,
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "page", "version": "0"}}}})
    elif method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-11-25", "capabilities": {
            "resources": {}}, "serverInfo": {"name": "page", "version": "0"}}})
    elif method == "resources/list":
        note(rid)
        if ANSWER != "none":
            send({"jsonrpc": "2.0", "id": rid, "result": 5 if ANSWER == "junk" else PAGES[params.get("cursor", "0")]})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
