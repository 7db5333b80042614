"""What tracing costs a read (issue 29): reads/s and server CPU per read with tracing off and on, against the floors,
over stdio and Streamable HTTP in the same run; and the OpenTelemetry calls a read makes with tracing off.

`python -m benchmarks.tracing_cost [--size 10k] [--reads 2000] [--files 1000] [--seconds 5] [--rounds 3]`

Per round, fresh servers taking turns (the order alternating): over stdio (as benchmarks.stdio_floor: cold then warm
reads, 16 in flight, legacy wire) the aggregator with tracing off, the same with tracing on, and `floor-stdlib`; over
HTTP, per wire (as benchmarks.http_floor: wrk, 16 connections, 20 warm reads), the aggregator with tracing off (its
fast path serves the reads), with tracing on (every read goes through the SDK and its request span), with the fast
path off and tracing off (`aggregator-sdk`: what stepping aside costs without any span), and `floor-asgi`. Tracing
on is the default OTLP http/protobuf exporter (`OTEL_EXPORTER_OTLP_ENDPOINT`) to a sink in this process that
answers 200 to every export, with the default batch processor; server CPU includes its export thread.

Then, with tracing off, each server is run under a profiler hook that counts calls into `opentelemetry` modules:
for a run of reads and one without, the difference per read (0: no span, not even a no-op one, on the read path).
Prints the tables (Markdown) and the load average, and writes its section of docs/benchmarks.md (`--no-write`:
print only); docs/tracing.md quotes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks import http_floor
from benchmarks.http_floor import LEGACY, check, legacy_session, requests_for, wrk
from benchmarks.http_load import MODERN
from benchmarks.machine import describe as describe_machine
from benchmarks.measure import _accepting, free_port
from benchmarks.peers import PEERS, Launch
from benchmarks.run import DATA
from benchmarks.scale import PAGE_SIZE, checker, parse_size, picks
from benchmarks.scale_corpus import CACHE, corpus, set_page_cache
from benchmarks.sections import DOCS, TRACING, write_section
from benchmarks.stdio_floor import Round, one_round
from benchmarks.stdio_rpc import RawClient, pipelined
from benchmarks.workload import generate, sample_indices, uri_of

OFF, ON = "aggregator", "aggregator-traced"


@contextmanager
def sink() -> Iterator[int]:
    """An OTLP/HTTP receiver on loopback that drops what it is sent (200, empty body); its port."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with `values` for the block (servers started in it inherit them)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _traced(port: int) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}


async def stdio_rounds(args: argparse.Namespace, otlp: int) -> dict[str, list[Round]]:
    root = corpus(args.size, args.data)
    runs: dict[str, list[Round]] = {OFF: [], ON: [], "floor-stdlib": []}
    for r in range(args.rounds):
        cold, warm = picks(args.size, args.reads, r)
        set_page_cache(root, cold, "held")
        base = PEERS["aggregator"].launch(root, PAGE_SIZE, None)
        launches: dict[str, str | Launch] = {OFF: base, ON: replace(base, env=_traced(otlp)),
                                             "floor-stdlib": "floor-stdlib"}
        order = list(launches) if r % 2 == 0 else list(reversed(launches))
        got = {}
        for name in order:
            got[name] = await one_round(launches[name], root, cold, warm, 16)
            runs[name].append(got[name])
        print(f"stdio round {r + 1} load {os.getloadavg()[0]:.1f}: " + " | ".join(
            f"{n} cold {x.cold_rps:,.0f}/s {x.cold_us:.0f} us warm {x.warm_rps:,.0f}/s {x.warm_us:.0f} us"
            for n, x in got.items()), flush=True)
    return runs


HTTP_SUBJECTS = (OFF, ON, "aggregator-sdk", "floor-asgi")


def http_rounds(args: argparse.Namespace, otlp: int) -> dict[tuple[str, str], list[http_floor.Run]]:
    root = generate(DATA, args.files, prefix="catalog")
    indices = sample_indices(args.files)
    runs: dict[tuple[str, str], list[http_floor.Run]] = {}
    for r in range(args.rounds):
        for wire in (LEGACY, MODERN):
            got = {}
            for name in HTTP_SUBJECTS if r % 2 == 0 else reversed(HTTP_SUBJECTS):
                with environ(**(_traced(otlp) if name == ON else {})):
                    got[name] = http_floor.one(OFF if name == ON else name, wire, root, indices, 16, args.seconds)
                runs.setdefault((wire, name), []).append(got[name])
            print(f"http round {r + 1} {wire} load {os.getloadavg()[0]:.1f}: " + " | ".join(
                f"{n} {x.reads_per_s:,.0f}/s p99 {x.p99_ms:.2f} ms {x.cpu_us:.0f} us" for n, x in got.items()),
                flush=True)
    return runs


# --- OpenTelemetry calls per read, tracing off -----------------------------------------------------------------

_COUNTING = """
import atexit, os, runpy, sys, threading
calls = [0]
def hook(frame, event, arg):
    if event == "call" and "/opentelemetry/" in frame.f_code.co_filename:
        calls[0] += 1
sys.setprofile(hook)
threading.setprofile(hook)
atexit.register(lambda: os.write(2, b"otel-calls %d\\n" % calls[0]))
sys.argv = ["aggregator", *sys.argv[1:]]
runpy.run_module("aggregator", run_name="__main__", alter_sys=True)
"""
"""`python -c` that runs the aggregator with a hook counting calls into opentelemetry modules, printed at exit."""


def _calls(stderr: str) -> int:
    return int(stderr.rsplit("otel-calls ", 1)[1].split()[0])


async def stdio_calls(root: Path, reads: int, fast: bool) -> int:
    base = PEERS["aggregator"].launch(root, PAGE_SIZE, None)
    launch = Launch(base.python, ["-c", _COUNTING, *base.args[2:]], {"AGGREGATOR_STDIO_FAST": "1" if fast else "0"})
    with tempfile.TemporaryFile("w+") as errlog:
        client = await RawClient.spawn(launch, errlog)
        try:
            await client.initialize()
            indices = [i * 7919 % 1000 for i in range(reads)]
            if indices:
                await pipelined(client, [uri_of(i) for i in indices], 4, checker(indices))
        finally:
            await client.close()
        errlog.seek(0)
        return _calls(errlog.read())


def http_calls(root: Path, wire: str, reads: int, fast: bool) -> int:
    port = free_port()
    base = PEERS["aggregator"].launch(root, PAGE_SIZE, port)
    with tempfile.TemporaryFile("w+") as errlog:
        process = subprocess.Popen([base.python, "-c", _COUNTING, *base.args[2:]], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=errlog, cwd=Path(__file__).resolve().parents[1],
                                   env={**os.environ, "AGGREGATOR_HTTP_FAST": "1" if fast else "0"})
        try:
            while not _accepting(port):
                if process.poll() is not None:
                    raise RuntimeError("the counted server exited before listening")
                time.sleep(0.05)
            indices = sample_indices(1000)
            requests = requests_for(wire, indices, legacy_session(port) if wire == LEGACY else None)
            check(port, requests, indices)  # with sessions, the SDK's first read teaches the path the session
            for _ in range(reads // len(indices)):
                check(port, requests, indices)
        finally:
            process.terminate()
            process.wait(300)  # under the hook, a graceful exit can take a while on a loaded machine
        errlog.seek(0)
        return _calls(errlog.read())


def otel_calls(args: argparse.Namespace) -> list[str]:
    """Markdown rows: calls into opentelemetry per read, tracing off, fast path on and off."""
    stdio_root, http_root = corpus(1000, args.data), generate(DATA, args.files, prefix="catalog")
    rows = []
    n = 400
    for fast in (True, False):
        per = (asyncio.run(stdio_calls(stdio_root, n, fast)) - asyncio.run(stdio_calls(stdio_root, 0, fast))) / n
        rows.append(f"| stdio | {'on' if fast else 'off'} | {per:.1f} |")
    for wire in (LEGACY, MODERN):
        for fast in (True, False):
            per = (http_calls(http_root, wire, n, fast) - http_calls(http_root, wire, 0, fast)) / n
            rows.append(f"| HTTP {wire} | {'on' if fast else 'off'} | {per:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=10_000, help="stdio corpus size")
    parser.add_argument("--reads", type=int, default=2000, help="stdio cold (and warm) reads per round")
    parser.add_argument("--files", type=int, default=1000, help="HTTP corpus size")
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk seconds per HTTP run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", type=Path, default=CACHE)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: stdio, http, calls")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    parser.add_argument("--no-write", dest="output", action="store_const", const=None, help="print only")
    args = parser.parse_args(argv)
    skip = set(args.skip.split(","))
    med = statistics.median
    start_load = os.getloadavg()[0]
    print(f"load average at start {start_load:.2f}; {describe_machine()}", flush=True)
    command = ("python -m benchmarks.tracing_cost " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    out = [TRACING, "", f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on "
           f"{describe_machine()}; load average {start_load:.1f} at the start, LOAD_END at the end (other work shares "
           "the machine: compare within a table, each ratio taken within one round). Tracing on: the default OTLP "
           "http/protobuf exporter and batch processor, to a local sink answering 200; server CPU includes the export "
           "thread. `aggregator-sdk`: the fast path off (`AGGREGATOR_HTTP_FAST=0`), tracing off. Medians of "
           f"{args.rounds} rounds; docs/tracing.md says what the figures mean.", ""]
    with sink() as otlp:
        if "stdio" not in skip:
            runs = asyncio.run(stdio_rounds(args, otlp))
            floor = runs["floor-stdlib"]
            out += [f"stdio: {args.size:,} files, {args.reads} cold reads then the same warm, 16 in flight, "
                    "legacy wire (as benchmarks.stdio_floor).", "",
                    "| stdio (legacy wire, 16 in flight) | cold reads/s | cold CPU us/read | warm reads/s | "
                    "warm CPU us/read | warm reads/s / floor |", "|---|---|---|---|---|---|"]
            for name, rounds in runs.items():
                ratio = med(x.warm_rps / f.warm_rps for x, f in zip(rounds, floor, strict=True))
                out.append(f"| {name} | {med(x.cold_rps for x in rounds):,.0f} | {med(x.cold_us for x in rounds):.0f}"
                           f" | {med(x.warm_rps for x in rounds):,.0f} | {med(x.warm_us for x in rounds):.0f} | "
                           f"{ratio:.2f}x |")
            out.append("")
        if "http" not in skip:
            http = http_rounds(args, otlp)
            out += [f"HTTP: {args.files:,} files, wrk, {16} keep-alive connections, 20 warm reads round-robin, "
                    f"{args.seconds:g} s a run (as benchmarks.http_floor).", "",
                    "| HTTP wire | subject | reads/s | p50 (ms) | p99 (ms) | server CPU us/read | reads/s / floor |",
                    "|---|---|---|---|---|---|---|"]
            for (wire, name), wire_runs in http.items():
                floor_runs = http[(wire, "floor-asgi")]
                ratio = med(x.reads_per_s / f.reads_per_s for x, f in zip(wire_runs, floor_runs, strict=True))
                out.append(f"| {wire} | {name} | {med(x.reads_per_s for x in wire_runs):,.0f} | "
                           f"{med(x.p50_ms for x in wire_runs):.2f} | {med(x.p99_ms for x in wire_runs):.2f} | "
                           f"{med(x.cpu_us for x in wire_runs):.0f} | {ratio:.2f}x |")
            out.append("")
    if "calls" not in skip:
        out += ["Calls into `opentelemetry` modules per read with tracing off (a profiler hook; 400 reads against "
                "none):",
                "", "| transport | fast path | calls into opentelemetry per read, tracing off |", "|---|---|---|",
                *otel_calls(args), ""]
    text = "\n".join(out).replace("LOAD_END", f"{os.getloadavg()[0]:.1f}") + "\n"
    print("\n" + text)
    if args.output is not None:
        write_section(args.output, text)


if __name__ == "__main__":
    main(sys.argv[1:])
