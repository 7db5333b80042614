"""Drive one server through the official `mcp` Client (client cache off), over stdio or Streamable HTTP on
loopback, and measure one run.

Phases, in order, on one connection: ready (spawn to the first resources/list answer), the full paginated
listing, the first and the middle page alone (median latency of a few requests each), a warm-up read of every
URI in the warm set, sequential reads, reads 32 in flight (with the server's CPU time they cost), then the
server's peak RSS (VmHWM) while it is still alive."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import IO

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from benchmarks.figures import Figures, percentile
from benchmarks.peers import Launch
from benchmarks.rss import children, cpu_seconds, new_children, peak_rss_mb

REPO = Path(__file__).resolve().parents[1]


def server_params(launch: Launch) -> StdioServerParameters:
    """Stdio parameters for `launch`, run from the repository root with a minimal, explicit environment."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONDONTWRITEBYTECODE": "1", "FASTMCP_SHOW_SERVER_BANNER": "false", "FASTMCP_LOG_LEVEL": "WARNING",
           **launch.env}
    return StdioServerParameters(command=launch.python, args=launch.args, env=env, cwd=str(REPO))


async def full_listing(client: Client) -> tuple[float, int, int, str | None]:
    """Follow next_cursor from the first page to the last: (seconds, resources listed, pages, the cursor of the
    page halfway through, None when there is a single page)."""
    started = time.perf_counter()
    listed, cursor = 0, None
    cursors: list[str | None] = [None]
    while True:
        page = await client.list_resources(cursor=cursor)
        listed += len(page.resources)
        cursor = page.next_cursor
        if not cursor:
            return time.perf_counter() - started, listed, len(cursors), cursors[len(cursors) // 2]
        cursors.append(cursor)


async def page_ms(client: Client, cursor: str | None, count: int = 15, budget_s: float = 0.5) -> float:
    """The median latency (ms) of one resources/list request for the page at `cursor`, over up to `count`
    requests (at least 3, fewer than `count` once `budget_s` has passed)."""
    latencies = []
    deadline = time.perf_counter() + budget_s
    for i in range(count):
        t = time.perf_counter()
        await client.list_resources(cursor=cursor)
        latencies.append(time.perf_counter() - t)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return statistics.median(latencies) * 1000


def text_of(result: types.ReadResourceResult) -> str:
    """The text of a read's first content (raises if the server answered with no text)."""
    first = result.contents[0]
    if not isinstance(first, types.TextResourceContents):
        raise TypeError(f"expected text contents, got {type(first).__name__}")
    return first.text


async def sequential_reads(client: Client, uris: list[str], count: int,
                           budget_s: float) -> tuple[float, list[float]]:
    """Up to `count` reads one after another, cycling through `uris`, stopping early once `budget_s` has passed
    (a slow peer then gives a rate over fewer reads): (reads per second, sorted latencies in seconds)."""
    latencies = []
    started = time.perf_counter()
    deadline = started + budget_s
    for i in range(count):
        t = time.perf_counter()
        await client.read_resource(uris[i % len(uris)])
        latencies.append(time.perf_counter() - t)
        if latencies[-1] + t > deadline:
            break
    elapsed = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / elapsed, latencies


async def concurrent_reads(client: Client, uris: list[str], count: int, in_flight: int,
                           budget_s: float) -> tuple[float, int]:
    """Up to `count` reads from `in_flight` concurrent tasks, each task stopping once `budget_s` has passed:
    (reads per second, reads made)."""
    per_task = max(1, count // in_flight)
    done = 0
    started = time.perf_counter()
    deadline = started + budget_s

    async def worker(offset: int) -> None:
        nonlocal done
        for i in range(per_task):
            await client.read_resource(uris[(offset + i) % len(uris)])
            done += 1
            if time.perf_counter() > deadline:
                return

    async with anyio.create_task_group() as tg:
        for w in range(in_flight):
            tg.start_soon(worker, w)
    return done / (time.perf_counter() - started), done


async def one_run(peer: str, launch: Launch, size: int, mode: str, uris: list[str], expected: str,
                  reads: int, in_flight: int, budget_s: float, errlog: IO[str], port: int | None = None) -> Figures:
    """Measure one fresh server process; `expected` is the text of `uris[0]`, checked once (a wrong answer fails).

    `mode` is the client's wire (`legacy`, `auto`), followed by ` http` when the server is launched on `port`.
    """
    if port is not None:
        return await _http_run(peer, launch, size, mode, uris, expected, reads, in_flight, budget_s, errlog, port)
    before = children()
    started = time.perf_counter()
    async with Client(stdio_client(server_params(launch), errlog=errlog), mode=mode,  # type: ignore[arg-type]
                      cache=None) as client:
        await client.list_resources()
        ready = time.perf_counter() - started
        pids = new_children(before)
        return await _phases(client, peer, size, mode, ready, pids, uris, expected, reads, in_flight, budget_s)


async def _http_run(peer: str, launch: Launch, size: int, mode: str, uris: list[str], expected: str, reads: int,
                    in_flight: int, budget_s: float, errlog: IO[str], port: int) -> Figures:
    """The same phases against a server process serving Streamable HTTP on 127.0.0.1:`port`."""
    params = server_params(launch)
    started = time.perf_counter()
    process = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog)
    try:
        while not _accepting(port):
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode} before listening")
            await anyio.sleep(0.005)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode.split()[0], cache=None) as client:
            await client.list_resources()
            ready = time.perf_counter() - started
            return await _phases(client, peer, size, mode, ready, [process.pid], uris, expected, reads, in_flight,
                                 budget_s)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def _accepting(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _phases(client: Client, peer: str, size: int, mode: str, ready: float, pids: list[int], uris: list[str],
                  expected: str, reads: int, in_flight: int, budget_s: float) -> Figures:
    """Listing (whole, then first and middle page alone), a checked read, warm-up, sequential and concurrent
    reads, then the server's peak RSS."""
    cpu_before = cpu_seconds(pids)
    listing, listed, pages, middle = await full_listing(client)
    listing_cpu = cpu_seconds(pids) - cpu_before
    first_page, middle_page = await page_ms(client, None), await page_ms(client, middle)
    got = text_of(await client.read_resource(uris[0]))
    if got != expected:
        raise ValueError(f"{uris[0]} read {got!r}, expected {expected!r}")
    for uri in uris:  # warm-up: whatever the server caches is now cached
        await client.read_resource(uri)
    per_s, latencies = await sequential_reads(client, uris, reads, budget_s)
    cpu_before = cpu_seconds(pids)
    concurrent, done = await concurrent_reads(client, uris, reads, in_flight, budget_s)
    cpu_ms = (cpu_seconds(pids) - cpu_before) * 1000 / max(done, 1)
    rss = max((peak_rss_mb(pid) for pid in pids), default=float("nan"))
    return Figures(peer, size, mode, ready, listing, listed, pages, first_page, middle_page, per_s,
                   percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000, concurrent, rss,
                   cpu_ms, listing_cpu, reads=len(latencies))


async def measure(peer: str, launch: Launch, size: int, mode: str, uris: list[str], expected: str,
                  reads: int = 2000, in_flight: int = 32, budget_s: float = 8.0, timeout_s: float = 180,
                  log: Path | None = None, port: int | None = None) -> Figures:
    """One run as `Figures`; a failure or a timeout comes back as Figures with `error` set instead of raising.

    Each read phase stops after `reads` reads or `budget_s` seconds, whichever comes first.
    The server's stderr goes to `log` (appended), or is discarded.
    """
    with open(log or os.devnull, "a") as errlog:  # noqa: ASYNC230 - a local log, opened before any timing
        try:
            with anyio.fail_after(timeout_s):
                return await one_run(peer, launch, size, mode, uris, expected, reads, in_flight, budget_s, errlog,
                                     port)
        except TimeoutError:
            return Figures(peer, size, mode, error=f"timed out after {timeout_s:.0f} s")
        except Exception as exc:  # noqa: BLE001 - any failure of a peer is a reported result, not a crash
            return Figures(peer, size, mode, error=describe(exc))


def describe(exc: BaseException) -> str:
    """A one-line account of a failure, looking inside exception groups for the first real cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


