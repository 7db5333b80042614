"""What an upstream's entry costs the gateway's memory (issue 26 item 4): RSS of `aggregator serve` publishing one
upstream of N entries under a namespace, minus the same gateway over an upstream of none, per entry; for this
checkout and a peer (`--peer`, e.g. /work/main) in the same run. `--profile OUT` also writes where the live Python
allocations are (`benchmarks.memory_profile`, one frame a trace) for this checkout at the largest N.

`python -m benchmarks.upstream_rows [--entries 100000,1000000] [--peer /work/main] [--page 10000]`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from benchmarks.rss import children, new_children, peak_rss_mb
from benchmarks.upstream_scale import REPO, manifest, memory, rss_mb


async def profile(path: Path, out: Path) -> None:
    """The live allocations (by line and by file) of this checkout's gateway once it listed everything."""
    server = StdioServerParameters(command=sys.executable, args=["-m", "benchmarks.memory_profile", str(out), "serve",
                                                                 str(path)], env={"PYTHONPATH": str(REPO)},
                                   cwd=str(REPO))
    before = children()
    async with Client(server, mode="auto", cache=None) as client:
        pid = new_children(before)[0]
        await anyio.sleep(6.0)
        cursor, first = None, True
        while first or cursor is not None:
            first = False
            cursor = (await client.list_resources(cursor=cursor)).next_cursor
        os.kill(pid, signal.SIGUSR1)
        while not out.exists():
            await anyio.sleep(0.5)
        print(f"  traced, rss {rss_mb(pid):.0f} MB, peak {peak_rss_mb(pid):.0f} MB")
    summary = json.loads(out.read_text())
    print(f"  traced total {summary['total'] / 2**20:.0f} MB")
    for where, size, count, code in summary["lines"]:
        print(f"  {size / 2**20:8.1f} MB {count:>9,}  {where:40} {code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="100000,1000000")
    parser.add_argument("--peer", type=Path, default=Path("/work/main"))
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--only", choices=("peer", "this"))
    parser.add_argument("--page", type=int, default=0, help="the upstream's page size (default: one page)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.entries.split(",")]
    codes = [(name, code) for name, code in (("peer", args.peer), ("this", REPO)) if args.only in (None, name)]

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            floor = {name: (await memory(code, manifest(folder, 0, "")))["rss_mb"] for name, code in codes}
            print("floor (no entries): " + ", ".join(f"{name} {mb:.0f} MB" for name, mb in floor.items()))
            for n in sizes:
                for name, code in codes:
                    got = await memory(code, manifest(folder, n, "", args.page))
                    per = (got["rss_mb"] - floor[name]) * 2**20 / n
                    print(f"  {n:>9,} {name:5} listed {got['listed']:>9,}  rss {got['rss_mb']:6.0f} MB  "
                          f"peak {got['peak_mb']:6.0f} MB  {per:6.0f} B/entry  ready {got['ready_s']:5.1f} s", flush=True)
            if args.profile:
                await profile(manifest(folder, sizes[-1], "", args.page), args.profile)

    anyio.run(run)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
