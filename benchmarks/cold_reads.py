"""Cold and warm reads: aggregator beside the in-memory floor and `floor-disk` (a bare server reading the file on
every request), interleaved.

`python -m benchmarks.cold_reads [--files 10000] [--reads 2000] [--rounds 5] [--modes legacy,auto]
[--transports stdio] [--only aggregator,floor-disk,floor]`

Each round starts one fresh server per peer and wire, all at once, each with its own official `mcp` client (cache
off), and reads one at a time: a few warm-up reads of files outside the measured set, then `--reads` cold reads
(distinct files picked at random over the catalog, the same picks for every peer in a round: each is the server's
first read of that file), then the same files again in another order (warm: whatever the server caches is
cached). The peers take turns every `BATCH` reads, so a slow spell of the machine costs them alike. Figures are
medians over rounds; it prints them and writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import stdio_client

from benchmarks.figures import percentile
from benchmarks.machine import describe as describe_machine
from benchmarks.measure import _accepting, free_port, server_params, text_of
from benchmarks.peers import PEERS
from benchmarks.run import DATA
from benchmarks.sections import COLD_READS, DOCS, write_section
from benchmarks.workload import body_of, generate, uri_of

SUBJECTS = ("aggregator", "floor-disk", "floor")
WARM_UP = 20
# Targets (reported, never asserted): aggregator's cold reads against the floor that reads the disk, its warm reads
# against the in-memory floor.
COLD_TARGET = ("floor-disk", 0.95)
WARM_TARGET = ("floor", 1.0)


@dataclass(frozen=True)
class Phase:
    """One read phase of one peer: reads per second and the median latency (ms)."""

    reads_per_s: float
    p50_ms: float


BATCH = 50


async def _check(client: Client, i: int) -> None:
    got = text_of(await client.read_resource(uri_of(i)))
    if got != body_of(i):
        raise ValueError(f"{uri_of(i)} read {got!r}")


async def _interleaved(clients: dict[str, Client], indices: list[int]) -> dict[str, Phase]:
    """Every client reads `indices` one at a time, in batches of BATCH taken in turn (the order alternating), so
    a slow spell of the machine costs every peer alike."""
    latencies: dict[str, list[float]] = {peer: [] for peer in clients}
    order = list(clients)
    for n, start in enumerate(range(0, len(indices), BATCH)):
        batch = indices[start:start + BATCH]
        for peer in order if n % 2 == 0 else reversed(order):
            client, spent = clients[peer], latencies[peer]
            for i in batch:
                t = time.perf_counter()
                await client.read_resource(uri_of(i))
                spent.append(time.perf_counter() - t)
    return {peer: Phase(len(spent) / sum(spent), percentile(sorted(spent), 0.5) * 1000)
            for peer, spent in latencies.items()}


async def one_round(peers: list[str], root: Path, mode: str, transport: str, warm_up: list[int], cold: list[int],
                    warm: list[int]) -> tuple[dict[str, Phase], dict[str, Phase]]:
    """A fresh server per peer, all at once, over `transport` on wire `mode`: (cold phases, warm phases)."""
    async with contextlib.AsyncExitStack() as stack:
        clients = {peer: await stack.enter_async_context(_connect(peer, root, mode, transport)) for peer in peers}
        for client in clients.values():
            await client.list_resources()
            for i in warm_up:
                await _check(client, i)
        return await _interleaved(clients, cold), await _interleaved(clients, warm)


@contextlib.asynccontextmanager
async def _connect(peer: str, root: Path, mode: str, transport: str) -> AsyncIterator[Client]:
    if transport == "stdio":
        params = server_params(PEERS[peer].launch(root, 500, None))
        async with Client(stdio_client(params, errlog=subprocess.DEVNULL), mode=mode,  # type: ignore[arg-type]
                          cache=None) as client:
            yield client
        return
    port = free_port()
    params = server_params(PEERS[peer].launch(root, 500, port))
    process = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not _accepting(port):
            if process.poll() is not None:
                raise RuntimeError(f"{peer} exited with {process.returncode} before listening")
            await anyio.sleep(0.01)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode, cache=None) as client:
            yield client
    finally:
        process.terminate()
        process.wait(10)


def picks(files: int, reads: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """(warm-up, cold, warm) file indices for one round: distinct random files, the warm set the cold one
    reshuffled."""
    rng = random.Random(seed)
    chosen = rng.sample(range(files), reads + WARM_UP)
    warm_up, cold = chosen[:WARM_UP], chosen[WARM_UP:]
    warm = cold[:]
    rng.shuffle(warm)
    return warm_up, cold, warm


def median_phase(phases: list[Phase]) -> Phase:
    return Phase(statistics.median(p.reads_per_s for p in phases), statistics.median(p.p50_ms for p in phases))


def section(results: dict[tuple[str, str], dict[str, tuple[Phase, Phase]]],
            ratios: dict[tuple[str, str], dict[tuple[str, str, int], float]], files: int, reads: int, rounds: int,
            command: str) -> str:
    """The Markdown section: per wire, each peer's cold and warm medians, its ratios to the floors (medians of
    the per-round ratios) and aggregator's verdicts."""
    lines = [COLD_READS, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {describe_machine()}.",
             "",
             f"{files:,} files of the main report's workload. Per round and wire, one fresh server per peer, all "
             "running at once, each with its own official `mcp` client (cache off), reading one at a time: "
             f"{WARM_UP} warm-up reads of other files, then {reads:,} **cold** reads (distinct files picked at "
             "random, the same for every peer in a round: each is the server's first read of its file), then the "
             "same files again in another order (**warm**: aggregator serves them from its cache). The peers take "
             f"turns every {BATCH} reads, so a slow spell of the machine costs them alike. Figures are medians of "
             f"{rounds} rounds, ratios medians of the per-round ratios. `floor` answers from memory; `floor-disk` "
             "is the same bare SDK server opening and reading the file on every read with a plain `open` on the "
             "event loop (no thread, timeout, containment or file-type check, all of which aggregator keeps). "
             f"Targets: aggregator's cold reads/s at least {COLD_TARGET[1]:.2f}x `{COLD_TARGET[0]}`'s, its warm "
             f"reads/s at least {WARM_TARGET[1]:.2f}x `{WARM_TARGET[0]}`'s. The OS page cache holds the files in "
             "every case. Reads/s is the reads over their summed latencies, so a few slow reads weigh on it; p50 is "
             "the steadier figure when the machine is loaded. A cold read of a small local file whose bytes are all "
             "in the page cache is read on the event loop (`sources/cached_read.py`: `preadv2` with `RWF_NOWAIT`, "
             "which never waits on the disk); any other read hops to its source's threads (`sources/threads.py`: "
             "what keeps a hung mount from stalling the server), which the floors do not pay. Over stdio the floors use the SDK's transport, which reads each line and writes each "
             "message through a worker thread and relays both through a memory stream; aggregator's "
             "(`aggregator/stdio.py`) reads and writes a pipe from the event loop with no task in between, which "
             "is most of its lead.", "",
             f"| wire | peer | cold reads/s | cold p50 (ms) | cold vs {COLD_TARGET[0]} | warm reads/s | warm p50 (ms) "
             f"| warm vs {WARM_TARGET[0]} |", "|---|---|---|---|---|---|---|---|"]
    for (transport, mode), peers in results.items():
        wire = mode if transport == "stdio" else f"{mode} {transport}"
        for peer, phases in peers.items():
            cells = []
            for phase, (against, target) in enumerate((COLD_TARGET, WARM_TARGET)):
                share = ratios[(transport, mode)].get((peer, against, phase))
                verdict = f" {'pass' if share >= target else 'FAIL'}" if peer == "aggregator" and share else ""
                cells += [f"{phases[phase].reads_per_s:,.0f}", f"{phases[phase].p50_ms:.2f}",
                          f"{share:.2f}x{verdict}" if share is not None and peer != against else ""]
            lines.append(f"| {wire} | {peer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=2_000, help="cold reads per run (then as many warm ones)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="legacy,auto", help="wires: legacy (2025-11-25), auto (2026-07-28)")
    parser.add_argument("--transports", default="stdio", help="stdio, http (Streamable HTTP on loopback)")
    parser.add_argument("--only", default=",".join(SUBJECTS), help="peers, of " + ", ".join(SUBJECTS))
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    if args.files < args.reads + WARM_UP:
        parser.error(f"--files must be at least --reads + {WARM_UP}")
    root = generate(DATA, args.files)
    subjects = [p for p in args.only.split(",") if p]
    wires = [(t, m) for t in args.transports.split(",") if t for m in args.modes.split(",") if m]
    runs: dict[tuple[str, str], dict[str, list[tuple[Phase, Phase]]]] = {w: {p: [] for p in subjects} for w in wires}
    for r in range(args.rounds):
        warm_up, cold, warm = picks(args.files, args.reads, r)
        for transport, mode in wires:
            colds, warms = anyio.run(one_round, subjects, root, mode, transport, warm_up, cold, warm)
            for peer in subjects:
                runs[(transport, mode)][peer].append((colds[peer], warms[peer]))
            print(f"round {r + 1} {transport} {mode}: " + "; ".join(
                f"{peer} cold {colds[peer].reads_per_s:,.0f}/s p50 {colds[peer].p50_ms:.2f} ms, warm "
                f"{warms[peer].reads_per_s:,.0f}/s p50 {warms[peer].p50_ms:.2f} ms" for peer in subjects),
                file=sys.stderr)
    results = {wire: {peer: (median_phase([c for c, _ in got]), median_phase([w for _, w in got]))
                      for peer, got in peers.items()} for wire, peers in runs.items()}
    ratios = {wire: {(peer, other, phase): statistics.median(
                         mine[phase].reads_per_s / theirs[phase].reads_per_s for mine, theirs in zip(got, peers[other]))
                     for peer, got in peers.items() for other in peers for phase in (0, 1)}
              for wire, peers in runs.items()}
    command = " ".join(["python -m benchmarks.cold_reads", *sys.argv[1:]])
    text = section(results, ratios, args.files, args.reads, args.rounds, command)
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
