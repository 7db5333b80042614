"""Reads through one hop vs direct and vs the relay floor, over three upstreams (benchmarks/hop_peers.py): the
official client reads from the upstream over stdio (`direct`), through the relay floor (a stdlib process copying the
bytes both ways: the least a hop costs), and through an aggregator whose source is that upstream (`one hop`:
McpSource over aggregator.upstream, the outer cache off, every read crosses both; `one hop, cached`: on).

`python -m benchmarks.upstream_hop [--reads 600] [--rounds 3] [--modes legacy,auto] [--upstreams ...] [--write]`
prints a table (`--write`: also its section of docs/benchmarks.md). Each round starts every peer afresh in turn;
a row is the median of its rounds.
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

from benchmarks.documents import cpu_ns
from benchmarks.hop_peers import PEERS, UPSTREAMS, peers
from benchmarks.measure import sequential_reads
from benchmarks.rss import children, new_children
from benchmarks.sections import DOCS, UPSTREAM, write_section
from benchmarks.workload import generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"


@dataclass(frozen=True, slots=True)
class Run:
    """One fresh server's figures: CPU microseconds per read of the server the client talks to (`outer`) and of
    the processes it started (`inner`: the upstream behind a relay or a gateway, 0 for `direct`), which a loaded
    machine disturbs less than latency does."""

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
        await sequential_reads(client, uris, len(uris), 30.0)  # every resource once: both levels' caches are warm
        outer = new_children(before)
        inner = [c.pid for pid in outer for c in psutil.Process(pid).children()]
        cpu = cpu_ns(outer), cpu_ns(inner)
        rate, latencies = await sequential_reads(client, uris, reads, 20.0)
        used = cpu_ns(outer) - cpu[0], cpu_ns(inner) - cpu[1]
    done = len(latencies)
    return Run(ready, rate, statistics.median(latencies) * 1000, used[0] / done / 1e3, used[1] / done / 1e3)


def middle(runs: list[Run]) -> Run:
    """Each figure's median over the rounds."""
    return Run(*(statistics.median(getattr(run, field) for run in runs) for field in Run.__slots__))


def row(mode: str, upstream: str, name: str, run: Run, direct: Run, relay: Run) -> str:
    return (f"| {mode} | {upstream} | {name} | {run.ready:.2f} | {run.rate:,.0f} | {run.median_ms:.2f} "
            f"| {run.median_ms / direct.median_ms:.2f} | {run.median_ms / relay.median_ms:.2f} | {run.outer_us:.0f} "
            f"| {run.inner_us:.0f} | {(run.outer_us + run.inner_us) / direct.outer_us:.2f} |")


def measure_all(upstreams: list[str], modes: list[str], reads: int, rounds: int, root: Path) -> list[str]:
    """The table's rows: per wire and upstream, every peer's figures (medians over `rounds` fresh starts)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for name in upstreams:
                params = peers(UPSTREAMS[name], root, Path(tmp))
                runs: dict[str, list[Run]] = {peer: [] for peer in PEERS}
                for _ in range(rounds):
                    for peer in PEERS:
                        runs[peer].append(anyio.run(measure, params[peer], mode, reads))
                figures = {peer: middle(found) for peer, found in runs.items()}
                for peer in PEERS:
                    rows.append(row(mode, name, peer, figures[peer], figures["direct"], figures["relay floor"]))
                    print(rows[-1], flush=True)
    return rows


def missing(name: str) -> str | None:
    """Why upstream `name` cannot run here (said on stderr), or None."""
    reason = UPSTREAMS[name].unavailable()
    if reason:
        print(f"skipping {name}: {reason}", file=sys.stderr)
    return reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="legacy,auto")
    parser.add_argument("--upstreams", default=",".join(UPSTREAMS))
    parser.add_argument("--write", action="store_true", help=f"write its section of {DOCS}")
    args = parser.parse_args()
    upstreams = [name for name in args.upstreams.split(",") if not missing(name)]
    root = generate(DATA, 1_000)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = ["| wire | upstream | peer | ready (s) | reads/s | median read (ms) | x direct | x relay floor "
            "| CPU/read: server (us) | upstream (us) | both, x direct |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(rows))
    rows += measure_all(upstreams, args.modes.split(","), args.reads, args.rounds, root)
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
