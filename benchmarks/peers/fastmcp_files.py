"""The `fastmcp` package (PyPI) with one `FileResource` per file, paginated with the same page size.

Usage: <fastmcp venv python> -m benchmarks.peers.fastmcp_files FOLDER PAGE_SIZE   (URIs are bench://<relative path>)

Runs under the python of `benchmarks/.venv-fastmcp` (see `benchmarks.peers.fastmcp_python`), which has fastmcp
and its own `mcp`; fastmcp reads the file from disk on every `resources/read`, measured as is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.resources import FileResource


def build(root: str, page_size: int) -> FastMCP:
    """A FastMCP server with one FileResource per file under `root`."""
    server = FastMCP("fastmcp-files", list_page_size=page_size)
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
    build(sys.argv[1], int(sys.argv[2])).run("stdio", show_banner=False)
