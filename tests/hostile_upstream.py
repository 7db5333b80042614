"""A hostile upstream on stdio (legacy wire only): `resources/list` answers a malformed result, `resources/read`
starts a line and never finishes it, `resources/templates/list` pages forever with a cursor that repeats."""

from __future__ import annotations

import json
import sys
import time


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    method, rid = request.get("method"), request.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"resources": {}},
            "serverInfo": {"name": "hostile", "version": "0"}}})
    elif method == "resources/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"resources": 5}})
    elif method == "resources/templates/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"resourceTemplates": [
            {"uriTemplate": "x://{a}", "name": "x"}], "nextCursor": "again"}})
    elif method == "resources/read" and request["params"]["uri"] == "x://huge":
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"contents": [{"uri": "x://huge", "text": "' % rid)
        for _ in range(64):
            sys.stdout.write("x" * 65536)  # 4 MiB and no end of line
        sys.stdout.flush()
    elif method == "resources/read":
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"contents": [{"uri": "x://' % json.dumps(rid))
        sys.stdout.flush()
        time.sleep(3600)
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})
