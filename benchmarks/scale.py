"""Catalog size against a stdlib floor: 10,000 to 1,000,000 files over stdio, aggregator and the floor in one run.

`python -m benchmarks.scale [--sizes 10k,100k,1M] [--rounds 3] [--live-rounds 5] [--churn-seconds 60]
[--page-cache held|dropped] [--quick] [--profile-memory 100k] [--baseline]`

Per size, `--rounds` rounds each start one fresh aggregator and one fresh `floor-stdlib` (a stdlib-only JSON-RPC
loop that walks the folder, lists it in pages and opens the file on every read), taking turns, and time through a
raw client on the legacy wire: ready (spawn to the first `resources/list` answer), a full listing (500 a page),
cold reads (distinct random files, each the server's first read of it; before each server's, the files are put
in the OS page cache, or dropped from it with `--page-cache dropped`, for both peers and every size alike) and then
warm reads (the same files again), 16 in flight, and the peak RSS. Then one aggregator (`scale_live`): a file
added -> `list_changed`, the manifest saved -> `list_changed`, and churn. Figures are medians over rounds (peak
RSS the largest); ratios are aggregator / floor, and reads at each size / the same reads at the run's smallest
size. It prints its section and writes it into docs/benchmarks.md. Files: `scale_corpus` (made once per size,
outside the repository).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from benchmarks import scale_live
from benchmarks.machine import describe as describe_machine
from benchmarks.measure import describe
from benchmarks.peers import PEERS, Launch
from benchmarks.rss import cpu_seconds, peak_rss_mb
from benchmarks.run import RESULTS
from benchmarks.scale_corpus import CACHE, PAGE_CACHE_STATES, body, corpus, set_page_cache
from benchmarks.scale_report import section
from benchmarks.sections import DOCS, write_section
from benchmarks.stdio_rpc import RawClient, ReadPhase, pipelined
from benchmarks.workload import uri_of

SUBJECT, FLOOR = "aggregator", "floor-stdlib"
PAGE_SIZE = 500
BASE_SIZE = 100  # the catalog whose peak RSS is taken off before dividing by the entries listed


@dataclass(frozen=True)
class Static:
    """One fresh server's figures: seconds to ready and for the full listing (and the server's CPU in it), peak RSS
    (MB), the cold and warm read phases and the server's CPU per warm read (s)."""

    ready_s: float
    listing_s: float
    listing_cpu_s: float
    listed: int
    peak_rss_mb: float
    cold: ReadPhase
    warm: ReadPhase
    cpu_per_read_s: float


@dataclass
class SizeResult:
    """Everything measured at one size: each peer's combined static figures (a peer whose every round failed is
    missing), aggregator's live phases, and the rounds that failed."""

    size: int
    static: dict[str, Static] = field(default_factory=dict)
    live: scale_live.Live | None = None
    errors: list[str] = field(default_factory=list)


def parse_size(text: str) -> int:
    """`10k`, `1M`, `100_000` or `100000` as a count."""
    text = text.strip().replace("_", "").replace(",", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def checker(indices: list[int]) -> Callable[[str, str], None]:
    """A check that the text read at each of the files' URIs is that file's."""
    expected = {uri_of(i): i for i in indices}

    def check(uri: str, text: str) -> None:
        if text != body(expected[uri]):
            raise ValueError(f"{uri} read {text[:60]!r}...")

    return check


async def static_round(peer: str, root: Path, cold: list[int], warm: list[int], in_flight: int,
                       errlog: IO[str], page_cache: str = "held") -> Static:
    """Spawn `peer` on `root`, time it to ready, list everything, read `cold` (its files put in the `page_cache`
    state first: `scale_corpus.set_page_cache`) then `warm`, and take its peak RSS."""
    started = time.perf_counter()
    client = await RawClient.spawn(PEERS[peer].launch(root, PAGE_SIZE, None), errlog)
    try:
        await client.initialize()
        await client.request("resources/list")
        ready = time.perf_counter() - started
        cpu, started = cpu_seconds([client.pid]), time.perf_counter()
        listed = len(await client.list_all())
        listing, listing_cpu = time.perf_counter() - started, cpu_seconds([client.pid]) - cpu
        set_page_cache(root, cold, page_cache)
        cold_phase = await pipelined(client, [uri_of(i) for i in cold], in_flight, checker(cold))
        cpu = cpu_seconds([client.pid])
        warm_phase = await pipelined(client, [uri_of(i) for i in warm], in_flight, checker(warm))
        cpu_per_read = (cpu_seconds([client.pid]) - cpu) / max(1, len(warm))
        return Static(ready, listing, listing_cpu, listed, peak_rss_mb(client.pid), cold_phase, warm_phase,
                      cpu_per_read)
    finally:
        await client.close()


def combine(runs: list[Static]) -> Static:
    """Repeated rounds as one: medians, the largest peak RSS."""
    def med(values: list[float]) -> float:
        return statistics.median(values)

    def phase(phases: list[ReadPhase]) -> ReadPhase:
        return ReadPhase(med([p.reads_per_s for p in phases]), med([p.p50_ms for p in phases]),
                         med([p.p99_ms for p in phases]))

    return Static(med([r.ready_s for r in runs]), med([r.listing_s for r in runs]),
                  med([r.listing_cpu_s for r in runs]), min(r.listed for r in runs),
                  max(r.peak_rss_mb for r in runs), phase([r.cold for r in runs]), phase([r.warm for r in runs]),
                  med([r.cpu_per_read_s for r in runs]))


def picks(count: int, reads: int, seed: int) -> tuple[list[int], list[int]]:
    """(cold, warm) file indices for one round: distinct random files, then the same ones reshuffled."""
    rng = random.Random(seed)
    cold = rng.sample(range(count), min(reads, count))
    warm = cold[:]
    rng.shuffle(warm)
    return cold, warm


def _log(peer: str, size: int) -> IO[str]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return open(RESULTS / f"scale-{peer}-{size}.log", "a")  # noqa: SIM115 - closed by the caller's with


def _aggregator_launch(manifest: Path) -> Launch:
    return Launch(sys.executable, ["-m", "aggregator", "--log-level", "WARNING", "serve", str(manifest)])


async def measure_size(size: int, options: argparse.Namespace) -> SizeResult:
    """The static rounds (peers taking turns, the order alternating) and the live phases at one size."""
    root = corpus(size, options.data)
    result = SizeResult(size)
    runs: dict[str, list[Static]] = {SUBJECT: [], FLOOR: []}
    for r in range(options.rounds):
        cold, warm = picks(size, options.reads, r)
        for peer in (SUBJECT, FLOOR) if r % 2 == 0 else (FLOOR, SUBJECT):
            with _log(peer, size) as errlog:
                try:
                    got = await static_round(peer, root, cold, warm, options.in_flight, errlog, options.page_cache)
                except Exception as exc:  # noqa: BLE001 - a failed round is a reported result
                    result.errors.append(f"{peer}, round {r + 1}: {describe(exc)}")
                    print(f"{size:,} round {r + 1} {peer} failed: {describe(exc)}", file=sys.stderr, flush=True)
                    continue
            runs[peer].append(got)
            print(f"{size:,} round {r + 1} {peer}: ready {got.ready_s:.2f}s, listing {got.listing_s:.2f}s "
                  f"({got.listed:,}), cold {got.cold.reads_per_s:,.0f}/s, warm {got.warm.reads_per_s:,.0f}/s, "
                  f"peak RSS {got.peak_rss_mb:.0f} MB", file=sys.stderr, flush=True)
    result.static = {peer: combine(got) for peer, got in runs.items() if got}
    cpu_per_read = result.static[SUBJECT].cpu_per_read_s if SUBJECT in result.static else 0.0
    if options.live_rounds > 0:
        manifest = root.parent / f"{root.name}-live.yaml"
        with _log("aggregator-live", size) as errlog:
            result.live = await scale_live.run(_aggregator_launch, root, manifest, size, options.live_rounds,
                                               options.churn_seconds, options.churn_rate,
                                               cpu_per_read, errlog)
        print(f"{size:,} live: {result.live}", file=sys.stderr, flush=True)
    return result


async def base_rss(options: argparse.Namespace) -> dict[str, float]:
    """Each peer's peak RSS (MB) over a BASE_SIZE-file catalog: what a server takes before its entries."""
    root = corpus(BASE_SIZE, options.data)
    cold, warm = picks(BASE_SIZE, 50, 0)
    out = {}
    for peer in (SUBJECT, FLOOR):
        with _log(peer, BASE_SIZE) as errlog:
            out[peer] = (await static_round(peer, root, cold, warm, options.in_flight, errlog)).peak_rss_mb
    return out


async def profile_memory(size: int, options: argparse.Namespace) -> dict[str, object]:
    """aggregator under tracemalloc (`benchmarks.memory_profile`) at `size`, after ready and a full listing."""
    import json
    import signal

    root = corpus(size, options.data)
    out = RESULTS / f"scale-memory-{size}.json"
    out.unlink(missing_ok=True)
    manifest = PEERS[SUBJECT].launch(root, PAGE_SIZE, None).args[-1]
    launch = Launch(sys.executable, ["-m", "benchmarks.memory_profile", str(out), "--log-level", "WARNING", "serve",
                                     manifest])
    with _log("aggregator-traced", size) as errlog:
        client = await RawClient.spawn(launch, errlog)
        try:
            await client.initialize()
            await client.list_all()
            rss = peak_rss_mb(client.pid)
            os.kill(client.pid, signal.SIGUSR1)
            for _ in range(6000):
                if out.exists():
                    break
                await asyncio.sleep(0.1)
        finally:
            await client.close()
    summary: dict[str, object] = json.loads(out.read_text())
    summary["traced_peak_rss_mb"] = rss
    summary["size"] = size
    return summary


async def run(options: argparse.Namespace) -> tuple[list[SizeResult], dict[str, float], dict[str, object] | None]:
    bases = await base_rss(options)
    results = [await measure_size(size, options) for size in options.sizes]
    profile = await profile_memory(options.profile_memory, options) if options.profile_memory else None
    return results, bases, profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10k,100k,1M", help="comma-separated file counts (10k, 1M, 250000)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh servers per peer and size (medians)")
    parser.add_argument("--live-rounds", type=int, default=5,
                        help="files added and manifest saves timed per size (0: no live phases)")
    parser.add_argument("--churn-seconds", type=float, default=60, help="seconds of churn per size (0: none)")
    parser.add_argument("--churn-rate", type=int, default=100, help="file changes a second during churn")
    parser.add_argument("--reads", type=int, default=2000, help="cold reads per round (then as many warm ones)")
    parser.add_argument("--in-flight", type=int, default=16, help="reads kept in flight on the one pipe")
    parser.add_argument("--page-cache", choices=PAGE_CACHE_STATES, default="held",
                        help="where the cold reads' files are before each server's cold reads: held in the OS page "
                             "cache (read once before) or dropped from it (posix_fadvise DONTNEED: read from disk)")
    parser.add_argument("--quick", action="store_true",
                        help="10k only, 1 round, 3 live rounds, 10 s of churn, 500 reads (about 1 min)")
    parser.add_argument("--profile-memory", type=parse_size, metavar="SIZE",
                        help="also run aggregator under tracemalloc at SIZE files and report where memory goes")
    parser.add_argument("--baseline", action="store_true",
                        help="write the section as the issue 26 baseline (kept beside later runs)")
    parser.add_argument("--data", type=Path, default=CACHE, help=f"where the files are kept (default {CACHE})")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args(argv)
    if args.quick:
        defaults = {"sizes": "10k", "rounds": 1, "live_rounds": 3, "churn_seconds": 10, "reads": 500}
        for name, value in defaults.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    # The servers run with PYTHONDONTWRITEBYTECODE (benchmarks.measure): a module changed since its bytecode was
    # last written would be compiled again at every start, a second or more of "ready" under load.
    import compileall

    import aggregator
    compileall.compile_dir(os.path.dirname(aggregator.__file__), quiet=1)
    command = " ".join(["python -m benchmarks.scale", *(sys.argv[1:] if argv is None else argv)])
    machine = describe_machine()
    started = time.time()
    results, bases, profile = asyncio.run(run(options))
    load_end = os.getloadavg()[0]
    text = section(results, bases, profile, options, command, machine, started, load_end)
    print(text)
    write_section(options.output, text)


if __name__ == "__main__":
    main()
