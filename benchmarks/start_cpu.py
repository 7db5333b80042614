"""CPU a start costs (issue 25: the suite starts hundreds of server processes): user + system seconds of one
`aggregator` process from exec to its first `initialize` answered, over stdio and over `serve --http`, and of a
whole `aggregator validate`. With `--compare REF` the same runs, interleaved, of the package as it was at a git
ref (exported to a temporary folder and put first on PYTHONPATH), so both share the machine's load; medians.

    python -m benchmarks.start_cpu [--runs 15] [--compare main] [--kinds stdio,http,validate] [--manifest M]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from benchmarks.rss import cpu_seconds
from tests.isolation import free_port

ROOT = Path(__file__).resolve().parents[1]
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "start-cpu", "version": "1"}}}


def _env(tree: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as `make test` runs: compiled once, then read
    return env


def stdio(tree: Path, manifest: Path) -> float:
    process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(tree), cwd=tempfile.gettempdir())
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    spent = cpu_seconds([process.pid])
    process.stdin.close()
    process.wait(30)
    if b'"result"' not in answer:
        raise RuntimeError(f"no initialize answer from {tree}: {answer[:200]!r}")
    return spent


def http(tree: Path, manifest: Path) -> float:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(tree),
                               cwd=tempfile.gettempdir())
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=json.dumps(INITIALIZE).encode(), headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
                    return cpu_seconds([process.pid])
            except (ConnectionError, urllib.error.URLError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"serve --http from {tree} did not answer") from None
                time.sleep(0.02)
    finally:
        process.terminate()
        process.wait(30)


def validate(tree: Path, manifest: Path) -> float:
    before = os.times()
    subprocess.run([sys.executable, "-m", "aggregator", "validate", str(manifest)], check=True, capture_output=True,
                   env=_env(tree), cwd=tempfile.gettempdir(), timeout=120)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


KINDS: dict[str, Callable[[Path, Path], float]] = {"stdio": stdio, "http": http, "validate": validate}


def _export(ref: str, into: Path) -> Path:
    """The package and schemas at git `ref`, compiled (a first run would otherwise pay the compiling)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "aggregator", "schemas"], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into / "aggregator")], check=True, timeout=300)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.start_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--kinds", default="stdio,http,validate")
    parser.add_argument("--manifest", type=Path, default=ROOT / "sample-configs" / "quickstart.yaml")
    parser.add_argument("--compare", metavar="REF", help="also the package at this git ref (e.g. main)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        trees = {"this": ROOT}
        if args.compare:
            trees[args.compare] = _export(args.compare, Path(folder))
        for tree in trees.values():  # compile what serving imports, outside the figures
            stdio(tree, args.manifest.resolve())
        print(f"load average {os.getloadavg()[0]:.1f}; CPU seconds per start, median of {args.runs} (min)")
        for kind in args.kinds.split(","):
            spent: dict[str, list[float]] = {name: [] for name in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():
                    spent[name].append(KINDS[kind](tree, args.manifest.resolve()))
            cells = [f"{name} {statistics.median(xs):.3f} ({min(xs):.3f})" for name, xs in spent.items()]
            print(f"{kind:9s} " + "  ".join(cells), flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
