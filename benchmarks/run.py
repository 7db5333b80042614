"""`python -m benchmarks.run [--quick | --full] [--sizes 10000] [--only aggregator,floor] [--modes legacy,auto]
[--transports stdio,http] [--http-modes auto]`

Generates the workloads, runs every chosen peer on the same files in the same run (interleaved, one fresh server
per run), prints the report and writes docs/benchmarks.md (keeping the sections of the side benchmarks:
templates, live, remote) and docs/benchmarks.png.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from aggregator.manifest.model import DEFAULT_PAGE_SIZE

from benchmarks.figures import Figures, combine
from benchmarks.machine import describe
from benchmarks.measure import free_port, measure
from benchmarks.peers import PEERS, Peer, fastmcp_versions
from benchmarks.report import render
from benchmarks.sections import write_main
from benchmarks.workload import body_of, generate, sample_indices, uri_of

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Preset:
    """The defaults of --quick and --full: catalog sizes, runs per figure, reads and seconds per read phase, and
    the wires run over HTTP."""

    sizes: tuple[int, ...]
    repeat: int
    reads: int
    budget_s: float
    http_modes: tuple[str, ...]


QUICK = Preset((1_000, 10_000), repeat=1, reads=600, budget_s=1.5, http_modes=("auto",))
FULL = Preset((1_000, 10_000, 100_000), repeat=3, reads=2_000, budget_s=8.0, http_modes=("legacy", "auto"))
DEFAULT_PEERS = "aggregator,aggregator-annotated,floor,floor-annotated,sdk_mcpserver,fastmcp"


@dataclass(frozen=True)
class Options:
    """What to run: catalog sizes, peers, wires, repetitions and the per-run budgets."""

    sizes: list[int]
    peers: list[str]
    modes: list[str]
    http_modes: list[str]
    repeat: int
    page_size: int
    reads: int
    budget_s: float
    uncapped: bool
    output: Path
    plot: Path | None
    transports: list[str]


def parse_args(argv: list[str] | None = None) -> tuple[Options, str]:
    """Options from the command line, and the command line itself as the report shows it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--quick", action="store_true",
                       help="1,000 and 10,000 files, 1 run each, 600 reads or 1.5 s per read phase, HTTP on the "
                       "modern wire only (the default)")
    scope.add_argument("--full", action="store_true",
                       help="1,000, 10,000 and 100,000 files, 3 runs each, 2,000 reads or 8 s per read phase, "
                       "HTTP on both wires")
    parser.add_argument("--sizes", help="comma-separated file counts (overrides --quick/--full)")
    parser.add_argument("--only", default=DEFAULT_PEERS, help=f"comma-separated peers, of: {', '.join(PEERS)}")
    parser.add_argument("--modes", default="legacy,auto", help="client modes (wires): legacy, auto or both")
    parser.add_argument("--http-modes", help="the wires run over HTTP (quick: auto, full: legacy,auto)")
    parser.add_argument("--transports", default="stdio,http", help="stdio, http or both (HTTP: Streamable HTTP on "
                        "loopback, for the peers that serve it)")
    parser.add_argument("--repeat", type=int, help="runs per peer, size and wire; figures are medians")
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                        help="resources per list page (aggregator, floor, fastmcp; MCPServer does not paginate); "
                        f"default {DEFAULT_PAGE_SIZE}, aggregator's own default, so the figures are what a user gets")
    parser.add_argument("--reads", type=int, help="reads per read phase")
    parser.add_argument("--budget", type=float, help="seconds at most per read phase (quick: 1.5, full: 8)")
    parser.add_argument("--uncapped", action="store_true", help="run capped peers at every size")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "benchmarks.png", help="PNG path")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    unknown = [p for p in args.only.split(",") if p not in PEERS]
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    preset = FULL if args.full else QUICK
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")] if args.sizes else list(preset.sizes)
    http_modes = args.http_modes.split(",") if args.http_modes else list(preset.http_modes)
    options = Options(sizes, args.only.split(","), args.modes.split(","), http_modes,
                      max(1, args.repeat or preset.repeat), args.page_size, args.reads or preset.reads,
                      args.budget or preset.budget_s, args.uncapped, args.output,
                      None if args.no_plot else args.plot, args.transports.split(","))
    return options, "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv)


def skip_reason(peer: Peer, size: int, uncapped: bool) -> str | None:
    """Why `peer` does not run at `size` (unavailable, or above its cap unless `uncapped`), or None."""
    reason = peer.unavailable()
    if reason:
        return f"unavailable: {reason}"
    if not uncapped and peer.max_size is not None and size > peer.max_size:
        return f"capped at {peer.max_size:,} files: {peer.cap_reason}"
    return None


def peer_notes(options: Options) -> list[str]:
    """One line per chosen peer for the report: what it is, and any cap or unavailability."""
    notes = []
    for name in options.peers:
        peer = PEERS[name]
        note = f"**{name}**: {peer.summary}"
        if name == "fastmcp" and fastmcp_versions():
            note += f" ({fastmcp_versions()})"
        skipped = sorted({reason for size in options.sizes
                          if (reason := skip_reason(peer, size, options.uncapped))})
        if skipped:
            note += " - " + "; ".join(skipped)
        notes.append(note)
    return notes


def log_path(peer: str, size: int, mode: str) -> Path:
    """Where one run's server stderr goes."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{peer}-{size}-{mode.replace(' ', '-')}.log"


def progress(figures: Figures, elapsed: float) -> None:
    """One line on stderr per finished run."""
    detail = (figures.error or f"ready {figures.ready_s:.2f}s, listing {figures.listing_s:.3f}s, "
              f"{figures.reads_per_s:,.0f} reads/s, 32 in flight {figures.concurrent_reads_per_s:,.0f}/s, "
              f"peak RSS {figures.peak_rss_mb:.0f} MB")
    print(f"[{elapsed:6.1f}s] {figures.peer} {figures.size:,} {figures.mode}: {detail}", file=sys.stderr, flush=True)


async def run(options: Options) -> list[Figures]:
    """Every run, interleaved so a slow spell of the machine hits all peers alike; figures combined per peer."""
    results: list[Figures] = []
    clock = time.perf_counter()
    for size in options.sizes:
        root = generate(DATA, size, prefix="catalog")
        indices = sample_indices(size)
        uris, expected = [uri_of(i) for i in indices], body_of(indices[0])
        chosen = {name: PEERS[name] for name in options.peers
                  if not skip_reason(PEERS[name], size, options.uncapped)}
        for transport in options.transports:
            over = {name: peer for name, peer in chosen.items() if transport == "stdio" or peer.http}
            for wire in options.modes if transport == "stdio" else options.http_modes:
                mode = wire if transport == "stdio" else f"{wire} {transport}"
                runs: dict[str, list[Figures]] = {name: [] for name in over}
                for name in over:  # each invocation starts the servers' logs afresh
                    log_path(name, size, mode).unlink(missing_ok=True)
                for _ in range(options.repeat):
                    for name, peer in over.items():
                        port = free_port() if transport == "http" else None
                        figures = await measure(name, peer.launch(root, options.page_size, port), size, mode, uris,
                                                expected, reads=options.reads, budget_s=options.budget_s,
                                                log=log_path(name, size, mode), port=port)
                        progress(figures, time.perf_counter() - clock)
                        runs[name].append(figures)
                results.extend(combine(r) for r in runs.values())
    return results


def main(argv: list[str] | None = None) -> None:
    """Run, print the report, write the Markdown and the plot."""
    options, command = parse_args(argv)
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    machine = describe()
    results = anyio.run(run, options)
    plot_ref = None
    if options.plot:
        from benchmarks.plot import draw

        draw(results, options.plot)
        plot_ref = options.plot.name if options.plot.parent == options.output.parent else str(options.plot)
    text = render(results, machine, started, command, peer_notes(options), plot_ref, options.reads)
    write_main(options.output, text)
    print(text)


if __name__ == "__main__":
    main()
