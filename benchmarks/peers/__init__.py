"""The named peers: how to launch each one over stdio on a workload folder, its size cap, and whether it can run.

A peer's server answers `bench://<relative path>` for every file of the folder it is given.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from benchmarks.manifest import write_manifest

BENCH = Path(__file__).resolve().parents[1]
FASTMCP_VENV = BENCH / ".venv-fastmcp"


@dataclass(frozen=True)
class Launch:
    """A server command: the interpreter and its arguments (run from the repository root), and variables added to
    its environment."""

    python: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Peer:
    """A named server under test.

    `launch(root, page_size, port)` gives its command for a workload folder, over stdio (port None) or Streamable
    HTTP on 127.0.0.1:port at /mcp; `http` says whether it can serve HTTP here. `max_size` caps the catalog sizes it
    is run at by default (None: no cap), for the reason `cap_reason`; `unavailable()` returns None when it can run,
    else the reason it cannot.
    """

    name: str
    summary: str
    launch: Callable[[Path, int, int | None], Launch]
    max_size: int | None = None
    cap_reason: str = ""
    unavailable: Callable[[], str | None] = lambda: None
    http: bool = True


def _http(port: int | None, *flag: str) -> list[str]:
    return [*flag, str(port)] if port is not None else []


def _aggregator(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "aggregator", "--log-level", "WARNING", "serve",
                                   str(write_manifest(root, page_size)), *_http(port, "--http")])


def _aggregator_annotated(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "aggregator", "--log-level", "WARNING", "serve",
                                   str(write_manifest(root, page_size, annotated=True)), *_http(port, "--http")])


def _floor(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "benchmarks.peers.floor", str(root), str(page_size),
                                   *_http(port, "--http")])


def _floor_annotated(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "benchmarks.peers.floor", str(root), str(page_size), "--annotated",
                                   *_http(port, "--http")])


def _floor_disk(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "benchmarks.peers.floor", str(root), str(page_size), "--disk",
                                   *_http(port, "--http")])


def _floor_stdlib(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "benchmarks.peers.stdlib_floor", str(root), str(page_size)])


def _floor_asgi(root: Path, page_size: int, port: int | None) -> Launch:
    if port is None:
        raise ValueError("floor-asgi serves HTTP only")
    return Launch(sys.executable, ["-m", "benchmarks.peers.asgi_floor", str(root), str(page_size), "--http", str(port)])


def _sdk_mcpserver(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(sys.executable, ["-m", "benchmarks.peers.sdk_mcpserver", str(root), *_http(port, "--http")])


def fastmcp_python() -> Path:
    """The interpreter of the separate fastmcp virtualenv (fastmcp is kept out of the project's venv)."""
    return FASTMCP_VENV / "bin" / "python"


def _fastmcp(root: Path, page_size: int, port: int | None) -> Launch:
    return Launch(str(fastmcp_python()), ["-m", "benchmarks.peers.fastmcp_files", str(root), str(page_size)])


@cache
def _fastmcp_unavailable() -> str | None:
    """None when the fastmcp venv imports fastmcp, else why not (with the command that would set it up)."""
    python = fastmcp_python()
    if not python.exists():
        return (f"no {FASTMCP_VENV.relative_to(BENCH.parent)} (create it: python -m venv {FASTMCP_VENV.name} "
                "&& .venv-fastmcp/bin/pip install fastmcp, in benchmarks/)")
    probe = subprocess.run([str(python), "-c", "import fastmcp"], capture_output=True, text=True, timeout=120,
                           check=False)
    if probe.returncode != 0:
        return "fastmcp does not import: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None


@cache
def fastmcp_versions() -> str:
    """`fastmcp X, mcp Y` as installed in the fastmcp venv, or '' when it is not there."""
    if _fastmcp_unavailable():
        return ""
    script = "import importlib.metadata as m; print(f\"fastmcp {m.version('fastmcp')}, mcp {m.version('mcp')}\")"
    out = subprocess.run([str(fastmcp_python()), "-c", script], capture_output=True, text=True, timeout=120,
                         check=False)
    return out.stdout.strip()


FASTMCP_CAP = 1_000
FASTMCP_CAP_REASON = (
    "fastmcp 4.x registers in O(N^2) (`LocalProvider._check_version_mixing` scans every component on each "
    "`add_resource`), converts all N resources on every list page and scans all N on every read: at 10,000 files "
    "one run takes about 90 s (ready about 50 s), too long for --quick; `--uncapped` runs it anyway")

PEERS: dict[str, Peer] = {peer.name: peer for peer in [
    Peer("aggregator", "this project: `aggregator serve` on a manifest with one collection", _aggregator),
    Peer("floor", "bare low-level SDK `Server`, preloaded `Resource` objects and strings: the protocol floor", _floor),
    Peer("floor-disk", "the floor opening and reading the file on every read (a plain `open` on the event loop): "
         "the floor for a read that reaches the disk", _floor_disk),
    Peer("floor-stdlib", "a stdlib-only JSON-RPC loop over stdio (no SDK): walks the folder once, lists it in pages, "
         "opens the file on every read; the scale benchmark's floor (legacy wire only)", _floor_stdlib, http=False),
    Peer("floor-asgi", "a bare ASGI app on uvicorn with httptools (no SDK, no framework): parses the JSON-RPC body, "
         "opens the file on every read, answers the wire's result shape and cache hints; the HTTP floor (HTTP only)",
         _floor_asgi),
    Peer("aggregator-annotated", "aggregator with `annotations: {lastModified: file}` on the collection (stdio "
         "only: it exists to compare listing costs)", _aggregator_annotated, http=False),
    Peer("floor-annotated", "the floor also listing `annotations.lastModified`, as aggregator-annotated does "
         "(stdio only: it exists to compare listing costs)", _floor_annotated, http=False),
    Peer("sdk_mcpserver", "the SDK's high-level `MCPServer`, one `FileResource` per file (it does not paginate; "
         "reads the file on every read)", _sdk_mcpserver),
    Peer("fastmcp", "the `fastmcp` package, one `FileResource` per file, same page size (own venv; reads the file "
         "on every read)", _fastmcp, max_size=FASTMCP_CAP, cap_reason=FASTMCP_CAP_REASON,
         unavailable=_fastmcp_unavailable, http=False),
]}
