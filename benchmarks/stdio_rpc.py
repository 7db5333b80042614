"""A raw MCP client over a server process's stdio: newline-delimited JSON-RPC on the 2025-11-25 (legacy) wire.

Cheap enough on the client side to measure a server at 1,000,000 resources (the official client validates every
listed resource several times, which would be most of a full listing's time), and it keeps any number of requests
in flight on the one pipe. Notifications are kept with their arrival time and can be waited for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from benchmarks.figures import percentile
from benchmarks.measure import server_params
from benchmarks.peers import Launch

LINE_LIMIT = 64 * 2**20  # one list page of 500 entries is ~60 KB; a 2 KB read ~2.2 KB


class RpcError(Exception):
    """The server answered a request with a JSON-RPC error."""


@dataclass
class Notifications:
    """Server notifications by method: their arrival times (perf_counter), and an event set on each arrival."""

    times: dict[str, list[float]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def count(self, method: str) -> int:
        return len(self.times.get(method, ()))

    def add(self, method: str) -> None:
        self.times.setdefault(method, []).append(time.perf_counter())
        self.arrived.set()


class RawClient:
    """One server process and its pipes; `spawn` starts it, `close` ends it (stdin closed, then terminate)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid = process.pid
        self.notifications = Notifications()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._reader = asyncio.create_task(self._read_loop())

    @classmethod
    async def spawn(cls, launch: Launch, errlog: IO[str] | int = asyncio.subprocess.DEVNULL) -> RawClient:
        """Start `launch` (from the repository root, minimal environment) and return its client, not yet
        initialized."""
        params = server_params(launch)
        process = await asyncio.create_subprocess_exec(
            params.command, *params.args, env=params.env, cwd=params.cwd, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=errlog, limit=LINE_LIMIT)
        return cls(process)

    async def _read_loop(self) -> None:
        assert self.process.stdout is not None
        try:
            while line := await self.process.stdout.readline():
                message = json.loads(line)
                future = self._pending.pop(message["id"], None) if "id" in message else None
                if future is None:
                    self.notifications.add(message.get("method", "?"))
                elif "error" in message:
                    future.set_exception(RpcError(json.dumps(message["error"])[:300]))
                else:
                    future.set_result(message["result"])
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"server {self.pid} closed its stdout"))

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 600) -> Any:
        """Send one request and wait for its result (RpcError on an error answer)."""
        if self._reader.done():
            raise ConnectionError(f"server {self.pid} has exited")
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        self._send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}})
        assert self.process.stdin is not None
        await self.process.stdin.drain()
        return await asyncio.wait_for(future, timeout)

    async def initialize(self) -> None:
        """The legacy handshake: initialize, then notifications/initialized."""
        await self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                          "clientInfo": {"name": "scale-bench", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def list_all(self) -> list[str]:
        """Every listed URI, following nextCursor from the first page to the last."""
        uris: list[str] = []
        cursor = None
        while True:
            page = await self.request("resources/list", {"cursor": cursor} if cursor else {})
            uris.extend(resource["uri"] for resource in page["resources"])
            cursor = page.get("nextCursor")
            if not cursor:
                return uris

    async def read_text(self, uri: str) -> str:
        """The text of the first content of one resources/read."""
        return str((await self.request("resources/read", {"uri": uri}))["contents"][0]["text"])

    async def wait_for(self, method: str, count: int, timeout: float) -> float:
        """Wait until `count` notifications of `method` have arrived; the arrival time of the `count`-th."""
        deadline = time.perf_counter() + timeout
        while self.notifications.count(method) < count:
            self.notifications.arrived.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"no {method} within {timeout:.0f} s")
            try:
                await asyncio.wait_for(self.notifications.arrived.wait(), left)
            except TimeoutError:
                continue
        return self.notifications.times[method][count - 1]

    async def close(self) -> None:
        """Close stdin (a stdio server's cue to exit), then terminate if it lingers."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.terminate()
            await self.process.wait()
        self._reader.cancel()


@dataclass(frozen=True)
class ReadPhase:
    """Reads kept `in_flight` at once: reads per second over the phase's wall time, and latency percentiles (ms)."""

    reads_per_s: float
    p50_ms: float
    p99_ms: float


async def pipelined(client: RawClient, uris: list[str], in_flight: int,
                    check: Callable[[str, str], None] | None = None) -> ReadPhase:
    """Read every URI once, `in_flight` requests at a time on the one pipe; `check(uri, text)` each answer."""
    latencies: list[float] = []
    queue = iter(uris)

    async def worker() -> None:
        for uri in queue:
            started = time.perf_counter()
            text = await client.read_text(uri)
            latencies.append(time.perf_counter() - started)
            if check:
                check(uri, text)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return ReadPhase(len(latencies) / elapsed, percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000)

