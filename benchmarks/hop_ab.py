"""An A/B of one uncached hop: the gateway of this checkout against the gateway of another (`--other`, a checkout or
worktree using this one's venv), over one upstream of benchmarks/hop_peers.py, interleaved in blocks with the
upstream read directly and through the loop relay floor (`upstream_hop.measure`), so that what else the machine
does falls on all four alike. Ratios of reads this short move with the machine: compare the two gateways in one run.

`python -m benchmarks.hop_ab --other PATH [--upstream everything] [--mode legacy] [--reads 800] [--rounds 5]`
prints, per peer, the median read, its median per-round ratio to direct (and each round's), and its CPU a read.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import anyio
from mcp import StdioServerParameters

from benchmarks.hop_peers import UPSTREAMS, peers
from benchmarks.upstream_hop import DATA, Run, measure, missing
from benchmarks.workload import generate


def gateways(upstream: str, other: Path, root: Path, folder: Path) -> dict[str, StdioServerParameters]:
    """Direct, the loop relay floor, this checkout's gateway (`this`) and `other`'s (`other`), cache off."""
    found = peers(UPSTREAMS[upstream], root, folder)
    hop = found["one hop"]
    theirs = StdioServerParameters(command=hop.command, args=hop.args, env={**(hop.env or {}),
                                                                           "PYTHONPATH": str(other)}, cwd=str(other))
    return {"direct": found["direct"], "loop relay floor": found["loop relay floor"], "this": hop, "other": theirs}


def report(runs: dict[str, list[Run]]) -> list[str]:
    """A line per peer: its median read, its per-round ratios to direct (median, then each) and CPU a read."""
    lines = []
    for name, each in runs.items():
        ratios = [run.median_ms / direct.median_ms for run, direct in zip(each, runs["direct"])]
        lines.append(f"{name:17s} median {statistics.median(r.median_ms for r in each):.3f} ms, "
                     f"{statistics.median(ratios):.2f}x direct (rounds {' '.join(f'{q:.2f}' for q in ratios)}), "
                     f"CPU {statistics.median(r.outer_us for r in each):.0f} us a read")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other checkout (its aggregator/ is imported)")
    parser.add_argument("--upstream", default="everything", choices=sorted(UPSTREAMS))
    parser.add_argument("--mode", default="legacy", choices=["legacy", "auto"])
    parser.add_argument("--reads", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if missing(args.upstream):
        raise SystemExit(1)
    root = generate(DATA, 1_000)
    with tempfile.TemporaryDirectory() as tmp:
        params = gateways(args.upstream, args.other.resolve(), root, Path(tmp))
        runs: dict[str, list[Run]] = {name: [] for name in params}
        for _ in range(args.rounds):
            for name, run in anyio.run(measure, params, args.mode, args.reads).items():
                runs[name].append(run)
    print(f"{args.upstream}, {args.mode} wire, {args.reads} reads, {args.rounds} rounds")
    print("\n".join(report(runs)))


if __name__ == "__main__":
    main()
