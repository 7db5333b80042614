"""Drive one server through the official MCP client over stdio and measure it.

Figures: launch to first answer, full paginated listing, sequential and concurrent cached reads, peak RSS.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

import anyio
import psutil
from mcp import Client, StdioServerParameters

from benchmarks.workload import uri_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Figures:
    peer: str
    size: int
    mode: str
    ready_s: float
    listing_s: float
    listed: int
    reads_per_s: float
    p50_ms: float
    p99_ms: float
    concurrent_reads_per_s: float
    peak_rss_mb: float


def _peak_rss_mb(parent: psutil.Process) -> float:
    """VmHWM (peak resident set) of the server child process."""
    peaks = []
    for child in parent.children(recursive=True):
        try:
            with open(f"/proc/{child.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        peaks.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return max(peaks, default=float("nan"))


async def measure(peer: str, command: list[str], size: int, mode: str, reads: int = 2000,
                  concurrency: int = 32) -> Figures:
    params = StdioServerParameters(command=sys.executable, args=command,
                                   env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": REPO}, cwd=REPO)
    started = time.perf_counter()
    async with Client(params, mode=mode, cache=None) as client:  # type: ignore[arg-type]
        await client.list_resources()
        ready = time.perf_counter() - started

        started = time.perf_counter()
        listed, cursor = 0, None
        while True:
            page = await client.list_resources(cursor=cursor)
            listed += len(page.resources)
            cursor = page.next_cursor
            if not cursor:
                break
        listing = time.perf_counter() - started

        uris = [uri_of(i * 7919 % size) for i in range(20)]
        for uri in uris:  # warm the server's cache
            await client.read_resource(uri)
        latencies = []
        started = time.perf_counter()
        for i in range(reads):
            t = time.perf_counter()
            await client.read_resource(uris[i % len(uris)])
            latencies.append(time.perf_counter() - t)
        sequential = reads / (time.perf_counter() - started)

        async def worker(offset: int) -> None:
            for i in range(reads // concurrency):
                await client.read_resource(uris[(offset + i) % len(uris)])

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in range(concurrency):
                tg.start_soon(worker, w)
        concurrent = (reads // concurrency) * concurrency / (time.perf_counter() - started)
        rss = _peak_rss_mb(psutil.Process())

    latencies.sort()
    return Figures(peer, size, mode, ready, listing, listed, sequential,
                   statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000,
                   concurrent, rss)
