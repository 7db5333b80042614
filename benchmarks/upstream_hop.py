"""Reads through one hop vs direct: the official client reading 1,000 files from an aggregator over stdio
(`direct`), from an aggregator whose source is that aggregator (`one hop`, McpSource over aggregator.upstream, the
outer cache off: every read crosses both), and the same with the outer cache on (`one hop, cached`).

`python -m benchmarks.upstream_hop [--reads 600] [--modes legacy,auto] [--write]` prints a table (`--write`: also
its section of docs/benchmarks.md). The outer aggregator's source is the `mcp` kind: `mcp+stdio:` with the inner
aggregator as its command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import anyio
import psutil
from mcp import Client, StdioServerParameters

from benchmarks.measure import sequential_reads
from benchmarks.documents import cpu_ns
from benchmarks.rss import children, new_children
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


@dataclass(frozen=True, slots=True)
class Run:
    """One fresh server's figures: CPU microseconds per read of the server the client talks to (`outer`) and of
    the upstream behind it (`inner`, 0 for `direct`), which a loaded machine disturbs less than latency does."""

    ready: float
    rate: float
    median_ms: float
    outer_us: float
    inner_us: float


async def measure(params: StdioServerParameters, mode: str, reads: int) -> Run:
    """The figures of one fresh server (and its upstream, for the hops)."""
    started = time.perf_counter()
    before = children()
    async with Client(params, mode=mode, cache=None) as client:
        uris = [r.uri for r in (await client.list_resources()).resources]
        ready = time.perf_counter() - started
        await sequential_reads(client, uris, len(uris), 30.0)  # every file once: both levels' caches are warm
        outer = new_children(before)
        inner = [c.pid for pid in outer for c in psutil.Process(pid).children()]
        cpu = cpu_ns(outer), cpu_ns(inner)
        rate, latencies = await sequential_reads(client, uris, reads, 20.0)
        used = cpu_ns(outer) - cpu[0], cpu_ns(inner) - cpu[1]
    done = len(latencies)
    return Run(ready, rate, statistics.median(latencies) * 1000, used[0] / done / 1e3, used[1] / done / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=600)
    parser.add_argument("--modes", default="legacy,auto")
    parser.add_argument("--write", action="store_true", help=f"write its section of {DOCS}")
    args = parser.parse_args()
    root = generate(DATA, 1_000)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = ["| wire | peer | ready (s) | reads/s | median read (ms) | x direct | CPU/read: server (us) "
            "| upstream (us) | both, x direct |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(rows))
    with tempfile.TemporaryDirectory() as tmp:
        peers = manifests(Path(tmp), root)
        for mode in args.modes.split(","):
            direct: Run | None = None
            for name, params in peers.items():
                run = anyio.run(measure, params, mode, args.reads)
                direct = direct or run
                rows.append(f"| {mode} | {name} | {run.ready:.2f} | {run.rate:,.0f} | {run.median_ms:.2f} "
                            f"| {run.median_ms / direct.median_ms:.2f} | {run.outer_us:.0f} | {run.inner_us:.0f} "
                            f"| {(run.outer_us + run.inner_us) / direct.outer_us:.2f} |")
                print(rows[-1], flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.write:
        command = " ".join(["python -m benchmarks.upstream_hop", *sys.argv[1:]])
        write_section(DOCS, f"""{UPSTREAM}

Run {started} with `{command}`: the official client reads {args.reads} times (sequentially, URIs in turn) from the
1,000 files of the main report's workload, served by an aggregator over stdio (`direct`), and by an aggregator
whose only source is that aggregator (`mcp+stdio:`, the `mcp` kind) with its own cache off (`one hop`: every read
crosses both servers) and on (`one hop, cached`: reads stop at the outer cache). `ready` is from starting the
server to its first listing (for the hops: starting the inner one and listing it too). Every file is read once
first, so both levels' caches are warm. `x direct` is the median read over `direct`'s in the same run; `CPU/read` is
the user+system CPU each server process spent per measured read (the client's is in none of them), `both, x
direct` the two levels' sum over `direct`'s. Load average at the end: {load} (2 cores).

{chr(10).join(rows)}

The outer cache keeps what the upstream lets it keep (`aggregator/sources/mcp.py`: its `ttlMs` caps our ttl, its
`cacheScope: private` is never kept nor shared). The inner aggregator answers `public` with its ttl, so `one hop,
cached` stops at the outer cache and costs what `direct` does. An upstream on the official SDK that sets no hints
answers `ttlMs: 0, cacheScope: private` on the modern wire (the SDK's defaults, sent as its word): nothing may be
kept, and there a cached hop costs what an uncached one does (tests/test_mcp_kind.py
`test_upstream_caching_hints`): an earlier measurement over a FastMCP server found the outer cache made no
difference. On the legacy wire there are no hints and the source's ttl applies: server-everything (2026.8.31)
speaks only 2025-11-25, and three reads of one of its resources through a gateway with a ttl are one miss and two
hits.

An uncached hop pays the gateway's own serving plus its call upstream. Over stdio that call is a lean lane
(`aggregator/upstream/lane.py`: the request written to the pipe and its answer taken off it, past the SDK client's
dispatcher, models and tasks); through the SDK's client the gateway spent 625-750 us of CPU a read (2026-11-25, load
8), about half of it in that client. Since 2026-11-28 the lane writes its line at once, takes a slot of the cap
without waiting when one is free, has its answer claimed where the pipe delivers it (`upstream/tap.py`) and checked
on the wire's dict (`answers.read_answer`): about 220 us against 300 before (load 6). The hop still crosses two
servers and two more pipes than `direct`, and the gateway's own serving of a read costs about what `direct`'s does,
so it costs at least about twice `direct`'s median; the target of 1.3x is not reached.
""")


if __name__ == "__main__":
    main()
