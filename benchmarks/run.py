"""`python -m benchmarks.run [--quick|--full] [--sizes 1000,10000] [--only aggregator,floor]`

Runs every peer on the same generated files in the same run, prints a table and rewrites docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

import anyio

from aggregator.manifest.model import DEFAULT_PAGE_SIZE
from benchmarks.measure import Figures, measure
from benchmarks.workload import generate, manifest_for

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
TARGETS_10K = {"ready_s": 1.0, "listing_s": 0.3, "peak_rss_mb": 120.0, "read_ratio": 0.9}


def commands(root: Path) -> dict[str, list[str]]:
    return {
        "aggregator": ["-m", "aggregator", "--log-level", "WARNING", "serve", str(manifest_for(root))],
        "floor": ["-m", "benchmarks.peers.floor", str(root), str(DEFAULT_PAGE_SIZE)],
        "floor-annotated": ["-m", "benchmarks.peers.floor", str(root), str(DEFAULT_PAGE_SIZE), "--annotated"],
        "sdk-mcpserver": ["-m", "benchmarks.peers.sdk_mcpserver", str(root)],
    }


def row(f: Figures, floor: Figures | None) -> str:
    ratio = f"{f.reads_per_s / floor.reads_per_s:.2f}" if floor else "-"
    return (f"| {f.peer} | {f.size:,} | {f.mode} | {f.ready_s:.2f} | {f.listing_s:.3f} | {f.reads_per_s:,.0f} | "
            f"{ratio} | {f.p50_ms:.2f} | {f.p99_ms:.2f} | {f.concurrent_reads_per_s:,.0f} | {f.peak_rss_mb:.0f} |")


def verdicts(results: list[Figures]) -> list[str]:
    lines = []
    for f in results:
        if f.peer != "aggregator" or f.size != 10_000:
            continue
        floor = next((g for g in results if g.peer == "floor" and g.size == f.size and g.mode == f.mode), None)
        checks = [("ready within 1 s", f.ready_s <= TARGETS_10K["ready_s"]),
                  ("full listing under 0.3 s", f.listing_s < TARGETS_10K["listing_s"]),
                  ("peak RSS under 120 MB", f.peak_rss_mb < TARGETS_10K["peak_rss_mb"])]
        if floor:
            checks.append(("cached reads >= 0.9x floor", f.reads_per_s >= TARGETS_10K["read_ratio"] * floor.reads_per_s))
        lines.append(f"- {f.mode}: " + ", ".join(f"{name}: {'pass' if ok else 'FAIL'}" for name, ok in checks))
    return lines


def report(results: list[Figures]) -> str:
    header = ("| peer | files | wire | ready (s) | full listing (s) | reads/s | vs floor | p50 (ms) | p99 (ms) | "
              "reads/s, 32 in flight | peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [header]
    for f in results:
        floor = next((g for g in results if g.peer == "floor" and g.size == f.size and g.mode == f.mode), None)
        lines.append(row(f, floor))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    return "\n".join([
        "# Benchmarks", "",
        f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine}, with "
        "`python -m benchmarks.run`. Every peer serves the same generated Markdown files over stdio and is driven "
        "by the official `mcp` client (`cache=None`); the legacy wire is 2025-11-25, the modern (auto) 2026-07-28.",
        "", "Peers: **aggregator** (this project, a manifest with one collection) and **floor** (a bare low-level "
        "SDK server returning preloaded `Resource` objects and strings: the protocol's own cost) and "
        "**floor-annotated** (the floor listing the same fields aggregator lists, `annotations.lastModified` included, "
        "so listing costs compare like for like) and **sdk-mcpserver** (the SDK's high-level `MCPServer` with one "
        "`FileResource` per file, as a user would write it).", "",
        *lines, "", "Targets at 10,000 files:", *verdicts(results), "",
        "Each figure is the median of interleaved runs (`--repeat`); peak RSS is the largest VmHWM seen. Timings on "
        "this shared VM wander between runs, so compare ratios within one run rather than absolute figures across runs.", "",
    ])


def median_figures(runs: list[Figures]) -> Figures:
    """Each figure's median over repeated runs (this VM's timings wander by 20% or more between runs)."""
    def mid(name: str) -> float:
        return statistics.median(getattr(r, name) for r in runs)

    first = runs[0]
    return Figures(first.peer, first.size, first.mode, mid("ready_s"), mid("listing_s"), first.listed,
                   mid("reads_per_s"), mid("p50_ms"), mid("p99_ms"), mid("concurrent_reads_per_s"),
                   max(r.peak_rss_mb for r in runs))


async def run(sizes: list[int], peers: list[str], modes: list[str], repeat: int) -> list[Figures]:
    results = []
    for size in sizes:
        root = generate(DATA, size)
        chosen = {peer: command for peer, command in commands(root).items() if peer in peers}
        for mode in modes:
            runs: dict[str, list[Figures]] = {peer: [] for peer in chosen}
            # Interleave peers so a slow spell of the machine hits all of them alike.
            for _ in range(repeat):
                for peer, command in chosen.items():
                    figures = await measure(peer, command, size, mode)
                    print(row(figures, None), file=sys.stderr)
                    runs[peer].append(figures)
            results.extend(median_figures(r) for r in runs.values())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 files (the default)")
    parser.add_argument("--full", action="store_true", help="also 100,000 files")
    parser.add_argument("--sizes", help="comma-separated file counts")
    parser.add_argument("--only", default="aggregator,floor,floor-annotated,sdk-mcpserver", help="comma-separated peers")
    parser.add_argument("--modes", default="legacy,auto")
    parser.add_argument("--repeat", type=int, default=2, help="runs per peer; each figure is the median")
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [1_000, 10_000] + ([100_000] if args.full else [])
    results = anyio.run(run, sizes, args.only.split(","), args.modes.split(","), args.repeat)
    text = report(results)
    Path(args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
