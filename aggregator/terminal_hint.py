"""What `aggregator serve` over stdio says to a person at a terminal, who may not know it waits for an MCP client."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

__all__ = ["stdio_hint"]


def _client_entry(manifest: str) -> dict[str, object]:
    """The command a client runs to start this server: the `aggregator` script when that is what ran, else this
    Python with `-m aggregator`; absolute paths, since clients start servers from a folder of their own."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    target = str(Path(manifest).resolve())
    if script is not None and script.name.startswith("aggregator") and script.suffix != ".py":
        return {"command": str(script.resolve()), "args": ["serve", target]}
    return {"command": sys.executable, "args": ["-m", "aggregator", "serve", target]}


def stdio_hint(manifest: str) -> str:
    """Several lines for stderr: this is an MCP server waiting on stdin, how to see it work, how to connect a client."""
    name = Path(manifest).stem or "aggregator"
    entry = json.dumps({name: _client_entry(manifest)})
    here = shlex.quote(manifest)  # as typed: it names the file from where the person is
    return (
        "aggregator: this is an MCP server; it speaks JSON-RPC on stdin/stdout and is now waiting for a client on "
        "stdin\n"
        "  (typing here does nothing useful; Ctrl-D or Ctrl-C stops it).\n"
        "  See what a client sees:  make demo  (in the aggregator folder), or\n"
        f"                           aggregator list {here}  /  aggregator read {here} URI\n"
        "  Connect a client: add this under \"mcpServers\" (Claude Desktop, Cursor) or, with \"type\": \"stdio\",\n"
        "  under \"servers\" in .vscode/mcp.json (VS Code); the README shows each client's file:\n"
        f"    {entry}\n"
        f"  Over HTTP instead:  aggregator serve --http 8000 {here}  then connect to http://127.0.0.1:8000/mcp\n"
    )
