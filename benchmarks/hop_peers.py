"""The upstreams of the one-hop benchmark and the peers read over each: the upstream itself (`direct`), the
upstream behind the relay floor (`relay floor`, benchmarks/peers/relay.py: bytes copied) and the JSON relay floor
(`JSON relay floor`, benchmarks/peers/json_relay.py: every message parsed and encoded again), the same on an event
loop (`loop relay floor`, benchmarks/peers/loop_relay.py: what the aggregator is built on), and behind an
aggregator whose only source is that upstream (`one hop`: outer cache off; `one hop, cached`: on).

Each upstream serves text resources over stdio: our own aggregator and the SDK's `MCPServer` the 1,000 files of the
workload (`bench://<path>`), @modelcontextprotocol/server-everything its own static documents.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mcp import StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(REPO)}
EVERYTHING_VERSION = "2026.8.31"
EVERYTHING = (REPO / "tests" / ".node" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"
              / "index.js")
EVERYTHING_SETUP = ("mkdir -p tests/.node && cd tests/.node && echo '{\"private\": true}' > package.json && "
                    f"npm install @modelcontextprotocol/server-everything@{EVERYTHING_VERSION}")


@dataclass(frozen=True, slots=True)
class Upstream:
    """An upstream server: its stdio command for a workload folder and a scratch folder, the URI prefix of what it
    lists (the gateway's source `prefix`) and the glob of the paths under it that the gateway's collection serves."""

    name: str
    summary: str
    command: Callable[[Path, Path], list[str]]
    prefix: str = "bench://"
    glob: str = "**/*.md"
    unavailable: Callable[[], str | None] = lambda: None


def _aggregator(root: Path, folder: Path) -> list[str]:
    inner = folder / "inner.yaml"
    inner.write_text(f"version: 1\nserver: {{name: inner}}\nsources:\n  files: {{url: {root}}}\n"
                     'collections:\n  - {source: files, glob: "**/*.md", uri: "bench://{path}"}\n')
    return [sys.executable, "-m", "aggregator", "--log-level", "WARNING", "serve", str(inner)]


def _mcpserver(root: Path, folder: Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.peers.sdk_mcpserver", str(root)]


def _everything(root: Path, folder: Path) -> list[str]:
    return [shutil.which("node") or "node", str(EVERYTHING), "stdio"]


def _everything_unavailable() -> str | None:
    if not shutil.which("node"):
        return "node is not on PATH"
    return None if EVERYTHING.is_file() else f"not installed ({EVERYTHING_SETUP})"


UPSTREAMS = {upstream.name: upstream for upstream in [
    Upstream("aggregator", "this project, `aggregator serve` on the workload folder (answers from its cache)",
             _aggregator),
    Upstream("mcpserver", "the SDK's `MCPServer` (FastMCP in SDK 1.x), one `FileResource` per file, read from disk "
             "on every read (benchmarks/peers/sdk_mcpserver.py)", _mcpserver),
    Upstream("everything", f"@modelcontextprotocol/server-everything {EVERYTHING_VERSION} (Node), its 7 static "
             "documents (`demo://resource/static/document/<name>`, 1-12 KB)", _everything,
             prefix="demo://resource/static/document/", glob="*.md", unavailable=_everything_unavailable),
]}

PEERS = ("direct", "relay floor", "JSON relay floor", "loop relay floor", "one hop", "one hop, cached")


def peers(upstream: Upstream, root: Path, folder: Path) -> dict[str, StdioServerParameters]:
    """Every peer of `upstream` by name, in PEERS' order (the gateways' manifests written under `folder`)."""
    command = upstream.command(root, folder)
    found = {"direct": StdioServerParameters(command=command[0], args=command[1:], env=ENV, cwd=str(REPO))}
    for name, module in (("relay floor", "relay"), ("JSON relay floor", "json_relay"),
                         ("loop relay floor", "loop_relay")):
        found[name] = StdioServerParameters(command=sys.executable, args=["-m", f"benchmarks.peers.{module}", *command],
                                            env=ENV, cwd=str(REPO))
    for name, ttl in (("one hop", "0s"), ("one hop, cached", "60s")):
        outer = folder / f"outer-{upstream.name}-{ttl}.yaml"
        outer.write_text(f"version: 1\nserver: {{name: outer}}\ndefaults: {{ttl: {ttl}}}\nsources:\n"
                         f"  up: {{url: 'mcp+stdio:', prefix: {upstream.prefix!r}, command: {command!r}, "
                         f"env: {ENV!r}}}\n"
                         f"collections:\n  - {{source: up, glob: {upstream.glob!r}, uri: 'bench://{{path}}'}}\n")
        found[name] = StdioServerParameters(
            command=sys.executable, args=["-m", "aggregator", "--log-level", "WARNING", "serve", str(outer)],
            env=ENV, cwd=str(REPO))
    return found
