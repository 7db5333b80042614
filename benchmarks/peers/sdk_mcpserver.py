"""The SDK's own high-level `MCPServer` with one `FileResource` per file, registered as a user would write it.

Usage: python -m benchmarks.peers.sdk_mcpserver FOLDER [--http PORT]   (URIs are bench://<relative path>)

`MCPServer` does not paginate `resources/list` (one page holds every resource) and reads the file from disk on
every `resources/read`: that is the SDK's out-of-the-box behaviour, measured as is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resources import FileResource


def build(root: str) -> MCPServer:
    """An MCPServer with one FileResource per file under `root`."""
    server = MCPServer("sdk-mcpserver", log_level="WARNING")
    base = Path(root).resolve()
    for folder, _, files in os.walk(base):
        for name in files:
            if name.startswith("."):
                continue
            path = Path(folder) / name
            rel = path.relative_to(base).as_posix()
            server.add_resource(FileResource(uri=f"bench://{rel}", name=rel, path=path, mime_type="text/markdown"))
    return server


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        build(sys.argv[1]).run("streamable-http", host="127.0.0.1", port=port, streamable_http_path="/mcp")
    else:
        build(sys.argv[1]).run("stdio")
