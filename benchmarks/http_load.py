"""Server capacity over Streamable HTTP on the modern wire, driven by a light load generator.

`python -m benchmarks.http_load [--files 10000] [--rounds 3] [--seconds 4] [--in-flight 32]`

The official `mcp` client spends more CPU on each read than the servers do, so on a 2-core machine the HTTP
figures of `benchmarks.run` (client and server sharing the cores) measure the client as much as the server. Here
an asyncio load process sends pre-built modern-wire `resources/read` POSTs (body, `MCP-Protocol-Version`,
`Mcp-Method` and `Mcp-Name` headers, as the official client sends them) over raw keep-alive connections, checks
every answer carries the file's text, and counts reads/s, p50 and p99 at 1 and at N in flight. The aggregator and
the floor run on the same files, interleaved, one fresh server per round; the section it writes in
docs/benchmarks.md gives medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.machine import describe as describe_machine
from benchmarks.measure import _accepting, free_port
from benchmarks.peers import PEERS
from benchmarks.rss import cpu_seconds
from benchmarks.run import DATA
from benchmarks.sections import DOCS, HTTP_LOAD, write_section
from benchmarks.workload import body_of, generate, sample_indices, uri_of

MODERN = "2026-07-28"
WORKERS = "aggregator, 2 workers"
SUBJECTS = ("aggregator", WORKERS, "floor")


def request_of(uri: str, request_id: int) -> tuple[bytes, dict[str, str]]:
    """A modern-wire `resources/read` for `uri`: its JSON body and the headers that must match it."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "http_load", "version": "1"}}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "resources/read",
                       "params": {"uri": uri, "_meta": meta}}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": MODERN, "Mcp-Method": "resources/read", "Mcp-Name": uri}
    return body, headers


def _raw_request(port: int, uri: str, request_id: int) -> bytes:
    """The bytes of one HTTP/1.1 keep-alive POST carrying a modern-wire read of `uri`."""
    body, headers = request_of(uri, request_id)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response: its status and body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in fields:
        return status, await reader.readexactly(int(fields["content-length"]))
    chunks = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunks.append(await reader.readexactly(size + 2))
        if size == 0:
            return status, b"".join(c[:-2] for c in chunks)


async def _connection_loop(port: int, indices: list[int], deadline: float, latencies: list[float],
                           errors: list[str]) -> None:
    """One keep-alive connection reading the warm set round-robin until `deadline`; checks every answer."""
    requests = [(_raw_request(port, uri_of(i), n + 1), json.dumps(body_of(i))[1:-1].encode())
                for n, i in enumerate(indices)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = 0
    try:
        while time.perf_counter() < deadline:
            raw, expected = requests[n % len(requests)]
            n += 1
            started = time.perf_counter()
            writer.write(raw)
            status, answer = await _read_response(reader)
            if status != 200 or expected not in answer:
                errors.append(f"HTTP {status}: {answer[:200]!r}")
                continue
            latencies.append(time.perf_counter() - started)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        errors.append(type(exc).__name__)
    finally:
        writer.close()


def _worker(port: int, connections: int, indices: list[int], start_at: float, seconds: float,
            out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """A load process: one event loop driving `connections` connections; reports latencies and errors."""
    latencies: list[float] = []
    errors: list[str] = []

    async def run() -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(_connection_loop(port, indices, deadline, latencies, errors)
                               for _ in range(connections)))

    asyncio.run(run())
    out.put((latencies, errors[:5], len(errors)))


@dataclass(frozen=True)
class Load:
    """One load phase against one server: reads/s, latency percentiles (ms), server CPU per read (ms)."""

    in_flight: int
    reads_per_s: float
    p50_ms: float
    p99_ms: float
    server_cpu_ms: float
    errors: int


def drive(port: int, pid: int | list[int], in_flight: int, processes: int, seconds: float,
          indices: list[int]) -> Load:
    """Keep `in_flight` reads outstanding for `seconds` from `processes` load processes; the CPU per read is that of
    `pid` (or every pid given: replicas and their balancer) and its children."""
    processes = max(1, min(processes, in_flight))
    shares = [in_flight // processes + (1 if p < in_flight % processes else 0) for p in range(processes)]
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 0.3  # every process begins together
    workers = [multiprocessing.Process(target=_worker, args=(port, share, indices, start_at, seconds, out))
               for share in shares]
    for w in workers:
        w.start()
    time.sleep(max(0.0, start_at - time.time()))
    tops = pid if isinstance(pid, list) else [pid]
    servers = [p for top in tops for p in (top, *(c.pid for c in psutil.Process(top).children()))]  # --workers forks
    cpu_before = cpu_seconds(servers)
    results = [out.get(timeout=seconds + 60) for _ in workers]
    cpu_used = cpu_seconds(servers) - cpu_before
    for w in workers:
        w.join()
    latencies = sorted(lat for result in results for lat in result[0])
    errors = sum(result[2] for result in results)
    if errors:
        print(f"  {errors} failed reads, e.g. {[e for r in results for e in r[1]][:3]}", file=sys.stderr)
    count = len(latencies)
    if not count:
        raise RuntimeError("no read succeeded")
    return Load(in_flight, count / seconds, latencies[count // 2] * 1000,
                latencies[min(count - 1, int(count * 0.99))] * 1000, cpu_used / count * 1000, errors)


def serve(peer: str, root: Path, port: int) -> subprocess.Popen[bytes]:
    """Start `peer` serving `root` over HTTP on `port`, once it accepts connections."""
    launch = PEERS["aggregator" if peer == WORKERS else peer].launch(root, 100, port)
    extra = ["--stateless", "--workers", "2"] if peer == WORKERS else []
    process = subprocess.Popen([launch.python, *launch.args, *extra], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])
    while not _accepting(port):
        if process.poll() is not None:
            raise RuntimeError(f"{peer} exited with {process.returncode} before listening")
        time.sleep(0.01)
    return process


def one_round(peer: str, root: Path, files: int, in_flights: list[int], processes: int,
              seconds: float) -> list[Load]:
    """A fresh server: a warm-up, then one load phase per in-flight level."""
    port = free_port()
    process = serve(peer, root, port)
    try:
        indices = sample_indices(files)
        drive(port, process.pid, 4, 1, 0.5, indices)  # warm the caches (of every worker) and the code paths
        return [drive(port, process.pid, n, processes, seconds, indices) for n in in_flights]
    finally:
        process.terminate()
        process.wait(10)


def median_load(loads: list[Load]) -> Load:
    """Per-field medians of several rounds at one in-flight level."""
    return Load(loads[0].in_flight, *(statistics.median(getattr(x, f) for x in loads)
                                      for f in ("reads_per_s", "p50_ms", "p99_ms", "server_cpu_ms")),
                sum(x.errors for x in loads))


def section(files: int, rounds: int, seconds: float, processes: int, results: dict[str, list[Load]],
            command: str) -> str:
    """The Markdown section for docs/benchmarks.md."""
    lines = [HTTP_LOAD, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {describe_machine()}.",
             "",
             f"{files:,} files; every read is a modern-wire (2026-07-28) `resources/read` POST to `/mcp` from "
             f"{processes} asyncio load process(es) over raw keep-alive connections (one per read in flight), the "
             "answer checked for the file's text; the warm set is the same 20 files the main report reads. Medians "
             f"of {rounds} interleaved rounds of {seconds:g} s, one fresh server per round; ratios to the floor. "
             "The load generator needs far less CPU per read than the official client, so these figures show what "
             "the server can serve on this machine when the client is not the bottleneck; the `auto http` rows of "
             "the main report show what one official client gets.", "",
             "| peer | in flight | reads/s | p50 (ms) | p99 (ms) | server CPU per read (ms) | failed reads |",
             "|---|---|---|---|---|---|---|"]
    floor = {load.in_flight: load for load in results.get("floor", [])}
    for peer, loads in results.items():
        for load in loads:
            ratio = floor.get(load.in_flight) if peer != "floor" else None
            rate = f"{load.reads_per_s:,.0f}" + (f" ({load.reads_per_s / ratio.reads_per_s:.2f}x)" if ratio else "")
            verdict = ""
            if peer.startswith("aggregator"):
                target = 900 if load.in_flight > 1 else 400
                verdict = " pass" if load.reads_per_s >= target else " FAIL"
                verdict += f" (>= {target})"
            lines.append(f"| {peer} | {load.in_flight} | {rate}{verdict} | {load.p50_ms:.2f} | {load.p99_ms:.2f} | "
                         f"{load.server_cpu_ms:.2f} | {load.errors} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each load phase")
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--processes", type=int, default=1, help="load-generating processes")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    root = generate(DATA, args.files, prefix="catalog")
    levels = [1, args.in_flight]
    rounds: dict[str, list[list[Load]]] = {peer: [] for peer in SUBJECTS}
    for r in range(args.rounds):
        for peer in SUBJECTS if r % 2 == 0 else reversed(SUBJECTS):
            loads = one_round(peer, root, args.files, levels, args.processes, args.seconds)
            rounds[peer].append(loads)
            print(f"round {r + 1} {peer}: " + ", ".join(f"{x.in_flight} in flight {x.reads_per_s:,.0f}/s"
                                                          for x in loads), file=sys.stderr)
    results = {peer: [median_load([loads[i] for loads in runs]) for i in range(len(levels))]
               for peer, runs in rounds.items()}
    command = "python -m benchmarks.http_load " + " ".join(sys.argv[1:])
    text = section(args.files, args.rounds, args.seconds, args.processes, results, command.strip())
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
