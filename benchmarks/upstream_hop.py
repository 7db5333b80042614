"""Reads through one hop vs direct: the official client reading 1,000 files from an aggregator over stdio
(`direct`), from an aggregator whose source is that aggregator (`one hop`, McpSource over aggregator.upstream, the
outer cache off: every read crosses both), and the same with the outer cache on (`one hop, cached`).

`python -m benchmarks.upstream_hop [--reads 600] [--modes legacy,auto] [--write]` prints a table (`--write`: also
its section of docs/benchmarks.md). The outer aggregator's source is the `mcp` kind: `mcp+stdio:` with the inner
aggregator as its command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from benchmarks.measure import sequential_reads
from benchmarks.sections import DOCS, UPSTREAM, write_section
from benchmarks.workload import generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
ENV = {"PYTHONPATH": str(REPO)}


def manifests(folder: Path, root: Path) -> dict[str, StdioServerParameters]:
    inner = folder / "inner.yaml"
    inner.write_text(f"version: 1\nserver: {{name: inner}}\nsources:\n  files: {{url: {root}}}\n"
                     'collections:\n  - {source: files, glob: "**/*.md", uri: "bench://{path}"}\n')
    command = [sys.executable, "-m", "aggregator", "serve", str(inner)]
    peers = {"direct": StdioServerParameters(command=sys.executable, args=command[1:], env=ENV)}
    for name, ttl in (("one hop", "0s"), ("one hop, cached", "60s")):
        outer = folder / f"outer-{ttl}.yaml"
        outer.write_text(f"version: 1\nserver: {{name: outer}}\ndefaults: {{ttl: {ttl}}}\nsources:\n"
                         f"  inner: {{url: 'mcp+stdio:', prefix: 'bench://', command: {command!r}, env: {ENV!r}}}\n"
                         'collections:\n  - {source: inner, glob: "**/*.md", uri: "bench://{path}"}\n')
        peers[name] = StdioServerParameters(
            command=sys.executable, args=["-m", "aggregator", "serve", str(outer)], env=ENV)
    return peers


async def measure(params: StdioServerParameters, mode: str, reads: int) -> tuple[float, float, float]:
    """(ready seconds, reads per second, median read ms) for one fresh server."""
    started = time.perf_counter()
    async with Client(params, mode=mode, cache=None) as client:
        uris = [r.uri for r in (await client.list_resources()).resources]
        ready = time.perf_counter() - started
        await sequential_reads(client, uris, len(uris), 30.0)  # every file once: both levels' caches are warm
        rate, latencies = await sequential_reads(client, uris, reads, 20.0)
    return ready, rate, statistics.median(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=600)
    parser.add_argument("--modes", default="legacy,auto")
    parser.add_argument("--write", action="store_true", help=f"write its section of {DOCS}")
    args = parser.parse_args()
    root = generate(DATA, 1_000)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = ["| wire | peer | ready (s) | reads/s | median read (ms) |", "|---|---|---:|---:|---:|"]
    print("\n".join(rows))
    with tempfile.TemporaryDirectory() as tmp:
        peers = manifests(Path(tmp), root)
        for mode in args.modes.split(","):
            for name, params in peers.items():
                ready, rate, median = anyio.run(measure, params, mode, args.reads)
                rows.append(f"| {mode} | {name} | {ready:.2f} | {rate:,.0f} | {median:.2f} |")
                print(rows[-1], flush=True)
    if args.write:
        command = " ".join(["python -m benchmarks.upstream_hop", *sys.argv[1:]])
        write_section(DOCS, f"""{UPSTREAM}

Run {started} with `{command}`: the official client reads {args.reads} times (sequentially, URIs in turn) from the
1,000 files of the main report's workload, served by an aggregator over stdio (`direct`), and by an aggregator
whose only source is that aggregator (`mcp+stdio:`, the `mcp` kind) with its own cache off (`one hop`: every read
crosses both servers) and on (`one hop, cached`: reads stop at the outer cache). `ready` is from starting the
server to its first listing (for the hops: starting the inner one and listing it too). Every file is read once
first, so both levels' caches are warm.

{chr(10).join(rows)}
""")


if __name__ == "__main__":
    main()
