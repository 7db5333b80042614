"""stdio reads against the stdlib floor (issue 29): reads/s and server CPU microseconds per read, cold and warm.

`python -m benchmarks.stdio_floor [--size 10k[,100k]] [--rounds 3] [--reads 2000] [--in-flight 16]`

Per round one fresh aggregator and one fresh `floor-stdlib` (taking turns, the order alternating) over the scale
corpus, through the raw client of `stdio_rpc` on the legacy wire: cold reads (distinct random files, each the
server's first read of it; the files are read into the page cache before the round, for both peers alike) then
warm reads (the same files again), `--in-flight` at once. Prints per round and the medians, with the ratio
aggregator / floor of each round (compare ratios within a run: the machine may be loaded) and the load average;
writes its section of docs/benchmarks.md (`--no-write`: print only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import describe as describe_machine
from benchmarks.peers import PEERS, Launch
from benchmarks.rss import cpu_seconds
from benchmarks.scale import FLOOR, PAGE_SIZE, SUBJECT, checker, parse_size, picks
from benchmarks.scale_corpus import CACHE, corpus, set_page_cache
from benchmarks.sections import DOCS, STDIO_FLOOR, write_section
from benchmarks.stdio_rpc import RawClient, pipelined
from benchmarks.workload import uri_of


@dataclass(frozen=True)
class Round:
    """One fresh server's reads: reads/s and server CPU microseconds per read, cold then warm."""

    cold_rps: float
    cold_us: float
    warm_rps: float
    warm_us: float


async def one_round(peer: str | Launch, root: Path, cold: list[int], warm: list[int], in_flight: int) -> Round:
    """A fresh server of `peer` (a named peer, or a command of one) over `root`: its cold then warm reads."""
    launch = PEERS[peer].launch(root, PAGE_SIZE, None) if isinstance(peer, str) else peer
    client = await RawClient.spawn(launch, sys.stderr)
    try:
        await client.initialize()
        await client.request("resources/list")
        cpu = cpu_seconds([client.pid])
        cold_phase = await pipelined(client, [uri_of(i) for i in cold], in_flight, checker(cold))
        mid = cpu_seconds([client.pid])
        warm_phase = await pipelined(client, [uri_of(i) for i in warm], in_flight, checker(warm))
        end = cpu_seconds([client.pid])
        return Round(cold_phase.reads_per_s, (mid - cpu) / len(cold) * 1e6, warm_phase.reads_per_s,
                     (end - mid) / len(warm) * 1e6)
    finally:
        await client.close()


async def measure_size(size: int, options: argparse.Namespace) -> tuple[dict[str, list[Round]], list[tuple[float, float]]]:
    """Every round at `size` files: each peer's rounds and the per-round ratios aggregator / floor (cold, warm)."""
    root = corpus(size, options.data)
    runs: dict[str, list[Round]] = {SUBJECT: [], FLOOR: []}
    ratios: list[tuple[float, float]] = []
    for r in range(options.rounds):
        cold, warm = picks(size, options.reads, r)
        # Both peers' cold reads (each server's first read of a file) find the files in the page cache whichever
        # goes first: else the first pays the disk for both (a thread hop per file for the aggregator).
        set_page_cache(root, cold, "held")
        got = {}
        for peer in (SUBJECT, FLOOR) if r % 2 == 0 else (FLOOR, SUBJECT):
            got[peer] = await one_round(peer, root, cold, warm, options.in_flight)
            runs[peer].append(got[peer])
        a, f = got[SUBJECT], got[FLOOR]
        ratios.append((a.cold_rps / f.cold_rps, a.warm_rps / f.warm_rps))
        print(f"{size:,} round {r + 1} load {os.getloadavg()[0]:.1f}: aggregator cold {a.cold_rps:,.0f}/s "
              f"{a.cold_us:.0f} us, warm {a.warm_rps:,.0f}/s {a.warm_us:.0f} us | floor cold {f.cold_rps:,.0f}/s "
              f"{f.cold_us:.0f} us, warm {f.warm_rps:,.0f}/s {f.warm_us:.0f} us | ratio cold {ratios[-1][0]:.2f}x "
              f"warm {ratios[-1][1]:.2f}x", flush=True)
    return runs, ratios


async def run(options: argparse.Namespace) -> None:
    med = statistics.median
    rows: list[str] = []
    for size in options.size:
        runs, ratios = await measure_size(size, options)
        for peer, rounds in runs.items():
            rows.append(f"| {size:,} | {peer} | {med(x.cold_rps for x in rounds):,.0f} | "
                        f"{med(x.cold_us for x in rounds):.0f} | {med(x.warm_rps for x in rounds):,.0f} | "
                        f"{med(x.warm_us for x in rounds):.0f} |")
        cold_cpu = med(f.cold_us / a.cold_us for a, f in zip(runs[SUBJECT], runs[FLOOR]))
        warm_cpu = med(f.warm_us / a.warm_us for a, f in zip(runs[SUBJECT], runs[FLOOR]))
        rows.append(f"| {size:,} | ratio aggregator / floor: reads/s (floor CPU / CPU) | "
                    f"{med(c for c, _ in ratios):.2f}x | ({cold_cpu:.2f}x) | {med(w for _, w in ratios):.2f}x | "
                    f"({warm_cpu:.2f}x) |")
    command = ("python -m benchmarks.stdio_floor " + " ".join(options.argv)).strip()
    sizes = " and ".join(f"{size:,}" for size in options.size)
    lines = [STDIO_FLOOR, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {describe_machine()}, "
             f"{os.getloadavg()[0]:.1f} at the end (other work shares the machine: compare ratios, each taken within "
             "one round).", "",
             f"{sizes} files (the scale corpus, about 2 KB each; a round's files are read into the page "
             "cache before it); per round a fresh "
             "aggregator and `floor-stdlib` (a stdlib-only JSON-RPC loop that opens the file on every read) taking "
             f"turns, {options.reads} cold reads (distinct files at random, each the server's first read of it) then "
             f"the same reads again (warm), {options.in_flight} in flight through a raw client on the legacy wire; "
             f"medians of {options.rounds} rounds; ratios are medians of the per-round ratios.", "",
             "| files | peer | cold reads/s | cold CPU us/read | warm reads/s | warm CPU us/read |",
             "|---|---|---|---|---|---|", *rows]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if options.output is not None:
        write_section(options.output, text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stdio_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=lambda text: [parse_size(part) for part in text.split(",") if part],
                        default=[10_000], help="files, or several sizes measured in turn: 10k,100k")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--data", type=Path, default=CACHE)
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    parser.add_argument("--no-write", dest="output", action="store_const", const=None, help="print only")
    options = parser.parse_args(argv)
    options.argv = sys.argv[1:] if argv is None else argv
    asyncio.run(run(options))


if __name__ == "__main__":
    main()
