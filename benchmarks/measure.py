"""Drive one server through the official `mcp` Client over stdio (client cache off) and measure one run.

Phases, in order, on one connection: ready (spawn to the first resources/list answer), the full paginated
listing, a warm-up read of every URI in the warm set, sequential reads, reads 32 in flight, then the server's
peak RSS (VmHWM) while it is still alive.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO

import anyio
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from benchmarks.figures import Figures, percentile
from benchmarks.peers import Launch
from benchmarks.rss import children, new_children, peak_rss_mb

REPO = Path(__file__).resolve().parents[1]


def server_params(launch: Launch) -> StdioServerParameters:
    """Stdio parameters for `launch`, run from the repository root with a minimal, explicit environment."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "FASTMCP_SHOW_SERVER_BANNER": "false", "FASTMCP_LOG_LEVEL": "WARNING"}
    return StdioServerParameters(command=launch.python, args=launch.args, env=env, cwd=str(REPO))


async def full_listing(client: Client) -> tuple[float, int, int]:
    """Follow next_cursor from the first page to the last: (seconds, resources listed, pages)."""
    started = time.perf_counter()
    listed, pages, cursor = 0, 0, None
    while True:
        page = await client.list_resources(cursor=cursor)
        listed += len(page.resources)
        pages += 1
        cursor = page.next_cursor
        if not cursor:
            return time.perf_counter() - started, listed, pages


def text_of(result: types.ReadResourceResult) -> str:
    """The text of a read's first content (raises if the server answered with no text)."""
    first = result.contents[0]
    if not isinstance(first, types.TextResourceContents):
        raise TypeError(f"expected text contents, got {type(first).__name__}")
    return first.text


async def sequential_reads(client: Client, uris: list[str], count: int) -> tuple[float, list[float]]:
    """`count` reads one after another, cycling through `uris`: (reads per second, sorted latencies in seconds)."""
    latencies = []
    started = time.perf_counter()
    for i in range(count):
        t = time.perf_counter()
        await client.read_resource(uris[i % len(uris)])
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return count / elapsed, latencies


async def concurrent_reads(client: Client, uris: list[str], count: int, in_flight: int) -> float:
    """`count` reads (rounded down to a multiple of `in_flight`) from `in_flight` concurrent tasks: reads per second."""
    per_task = count // in_flight

    async def worker(offset: int) -> None:
        for i in range(per_task):
            await client.read_resource(uris[(offset + i) % len(uris)])

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(in_flight):
            tg.start_soon(worker, w)
    return per_task * in_flight / (time.perf_counter() - started)


async def one_run(peer: str, launch: Launch, size: int, mode: str, uris: list[str], expected: str,
                  reads: int, in_flight: int, errlog: IO[str]) -> Figures:
    """Measure one fresh server process; `expected` is the text of `uris[0]`, checked once (a wrong answer fails)."""
    before = children()
    started = time.perf_counter()
    async with Client(stdio_client(server_params(launch), errlog=errlog), mode=mode,  # type: ignore[arg-type]
                      cache=None) as client:
        await client.list_resources()
        ready = time.perf_counter() - started
        pids = new_children(before)

        listing, listed, pages = await full_listing(client)
        got = text_of(await client.read_resource(uris[0]))
        if got != expected:
            raise ValueError(f"{uris[0]} read {got!r}, expected {expected!r}")
        for uri in uris:  # warm-up: whatever the server caches is now cached
            await client.read_resource(uri)
        per_s, latencies = await sequential_reads(client, uris, reads)
        concurrent = await concurrent_reads(client, uris, reads, in_flight)
        rss = max((peak_rss_mb(pid) for pid in pids), default=float("nan"))
    return Figures(peer, size, mode, ready, listing, listed, pages, per_s, percentile(latencies, 0.5) * 1000,
                   percentile(latencies, 0.99) * 1000, concurrent, rss)


async def measure(peer: str, launch: Launch, size: int, mode: str, uris: list[str], expected: str,
                  reads: int = 2000, in_flight: int = 32, timeout_s: float = 180, log: Path | None = None) -> Figures:
    """One run as `Figures`; a failure or a timeout comes back as Figures with `error` set instead of raising.

    The server's stderr goes to `log` (appended), or is discarded.
    """
    with open(log or os.devnull, "a") as errlog:
        try:
            with anyio.fail_after(timeout_s):
                return await one_run(peer, launch, size, mode, uris, expected, reads, in_flight, errlog)
        except TimeoutError:
            return Figures(peer, size, mode, error=f"timed out after {timeout_s:.0f} s")
        except Exception as exc:  # noqa: BLE001 - any failure of a peer is a reported result, not a crash
            return Figures(peer, size, mode, error=f"{type(exc).__name__}: {exc}"[:200])


