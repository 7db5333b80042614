"""The stdlib floor: a JSON-RPC loop over stdio with nothing but the standard library, for the scale benchmark.

Usage: python -m benchmarks.peers.stdlib_floor FOLDER PAGE_SIZE   (URIs are bench://<path>; 2025-11-25 wire)

At start it walks FOLDER once (`os.scandir`, one stat per file for the listed `size`) and keeps a sorted list of
(relative path, size) for every non-hidden `*.md` file; `resources/list` slices that list (the cursor is the index);
`resources/read` finds the URI by bisection and opens the file on every read. No SDK, no validation, no threads,
no watching: what walking, listing in pages and reading a folder costs in Python, whatever the framework.
Unknown URIs get -32602 with data.uri, unknown methods -32601.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from typing import Any

PREFIX = "bench://"
VERSION = "2025-11-25"


def walk(root: str) -> list[tuple[str, int]]:
    """(relative path with `/`, size) of every non-hidden `*.md` file under `root`, sorted by path."""
    found: list[tuple[str, int]] = []
    pending = [("", root)]
    while pending:
        relative, folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append((relative + entry.name + "/", entry.path))
                elif entry.name.endswith(".md") and entry.is_file(follow_symlinks=False):
                    found.append((relative + entry.name, entry.stat(follow_symlinks=False).st_size))
    found.sort()
    return found


class Floor:
    """The listing and the reads over one walked folder."""

    def __init__(self, root: str, page_size: int) -> None:
        self.root, self.page_size = root, page_size
        self.files = walk(root)
        self.paths = [path for path, _ in self.files]

    def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of one request (raises LookupError for an unknown method, KeyError for an unknown URI)."""
        if method == "initialize":
            return {"protocolVersion": VERSION, "capabilities": {"resources": {}},
                    "serverInfo": {"name": "stdlib-floor", "version": "1"}}
        if method == "ping":
            return {}
        if method == "resources/list":
            start = int(params.get("cursor") or 0)
            end = start + self.page_size
            page: dict[str, Any] = {"resources": [{"uri": PREFIX + path, "name": path, "mimeType": "text/markdown", "size": size}
                                  for path, size in self.files[start:end]]}
            if end < len(self.files):
                page["nextCursor"] = str(end)
            return page
        if method == "resources/read":
            uri = params["uri"]
            path = uri[len(PREFIX):] if uri.startswith(PREFIX) else ""
            at = bisect.bisect_left(self.paths, path)
            if not path or at == len(self.paths) or self.paths[at] != path:
                raise KeyError(uri)
            with open(os.path.join(self.root, path), encoding="utf-8") as handle:
                text = handle.read()
            return {"contents": [{"uri": uri, "mimeType": "text/markdown", "text": text}]}
        raise LookupError(method)


def reply(message: dict[str, Any], floor: Floor) -> dict[str, Any] | None:
    """The response to one message, None for a notification."""
    if "id" not in message:
        return None
    params = message.get("params") or {}
    try:
        return {"jsonrpc": "2.0", "id": message["id"], "result": floor.answer(message.get("method", ""), params)}
    except KeyError as exc:
        error = {"code": -32602, "message": "Resource not found", "data": {"uri": str(exc.args[0])}}
    except LookupError:
        error = {"code": -32601, "message": "Method not found"}
    return {"jsonrpc": "2.0", "id": message["id"], "error": error}


def serve(root: str, page_size: int) -> None:
    """Answer newline-delimited JSON-RPC on stdin until it closes."""
    floor = Floor(root, page_size)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        response = reply(json.loads(line), floor)
        if response is not None:
            out.write(json.dumps(response, separators=(",", ":")).encode() + b"\n")
            out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
