"""Streamable HTTP `resources/read` against the bare-ASGI floor (issue 29), on both wires, driven by wrk.

`python -m benchmarks.http_floor [--files 1000] [--rounds 3] [--seconds 5] [--connections 16]`

Per round and wire (2025-11-25 legacy with a session, 2026-07-28 modern), one fresh server of each subject: the
aggregator (its HTTP fast path on), the aggregator with `AGGREGATOR_HTTP_FAST=0` (the SDK serves every read), and
`floor-asgi` (benchmarks/peers/asgi_floor.py), taking turns with the order alternating. Each is first checked to
answer a read of the warm set with the file's text, then wrk (one thread, `--connections` keep-alive connections)
POSTs the same 20 warm reads round-robin for `--seconds`. Reads/s, p50 and p99 come from wrk; any non-2xx answer or
socket error is counted. Prints per round and the medians with the ratios to the floor of the same round, and the
load average (compare ratios, not absolute figures: the machine is shared); writes its section of docs/benchmarks.md.
Needs wrk (`apt-get install wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.http_load import MODERN, request_of, serve
from benchmarks.measure import free_port
from benchmarks.machine import describe as describe_machine
from benchmarks.rss import cpu_seconds
from benchmarks.run import DATA
from benchmarks.sections import DOCS, HTTP_FLOOR, write_section
from benchmarks.workload import body_of, generate, sample_indices, uri_of

LEGACY = "2025-11-25"
SUBJECTS = ("aggregator", "aggregator-sdk", "floor-asgi")
"""aggregator-sdk: the aggregator with its HTTP fast path off (`AGGREGATOR_HTTP_FAST=0`)."""
_ENV_OFF = "AGGREGATOR_HTTP_FAST"


@dataclass(frozen=True)
class Run:
    """One wrk run: reads/s, p50 and p99 in ms, failed answers, server CPU microseconds per read."""

    reads_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    cpu_us: float = 0.0


def _post(port: int, body: dict[str, object], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json, text/event-stream", **headers})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()


def legacy_session(port: int) -> str | None:
    """Open a 2025-11-25 session (initialize, then notifications/initialized); its id, None when there is none."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {},
                       "clientInfo": {"name": "http_floor", "version": "1"}}}
    _, headers, _ = _post(port, init, {})
    session = headers.get("mcp-session-id")
    extra = {"MCP-Protocol-Version": LEGACY, **({"Mcp-Session-Id": session} if session else {})}
    _post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, extra)
    return session


def requests_for(wire: str, indices: list[int], session: str | None) -> list[tuple[bytes, dict[str, str]]]:
    """The warm reads on `wire`: (body, headers) each."""
    if wire == MODERN:
        return [request_of(uri_of(i), n + 1) for n, i in enumerate(indices)]
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": LEGACY, **({"Mcp-Session-Id": session} if session else {})}
    return [(json.dumps({"jsonrpc": "2.0", "id": n + 1, "method": "resources/read",
                         "params": {"uri": uri_of(i)}}).encode(), headers) for n, i in enumerate(indices)]


def check(port: int, requests: list[tuple[bytes, dict[str, str]]], indices: list[int]) -> None:
    """Every warm read answers 200 with the file's text (JSON or one SSE event)."""
    for (body, headers), i in zip(requests, indices, strict=True):
        status, _, answer = _post(port, json.loads(body), {k: v for k, v in headers.items()
                                                            if k not in ("Content-Type", "Accept")})
        if status != 200 or json.dumps(body_of(i))[1:-1].encode() not in answer:
            raise RuntimeError(f"bad answer to a read: HTTP {status} {answer[:200]!r}")


def _lua(requests: list[tuple[bytes, dict[str, str]]]) -> str:
    def quote(text: str) -> str:
        return json.dumps(text)  # a JSON string literal is a valid Lua string literal for this ASCII text

    items = []
    for body, headers in requests:
        fields = ", ".join(f"[{quote(k)}] = {quote(v)}" for k, v in headers.items())
        items.append(f'wrk.format("POST", "/mcp", {{{fields}}}, {quote(body.decode())})')
    return ("local requests = {}\nlocal n = 0\n"
            "init = function(args)\n" + "".join(f"  requests[{k + 1}] = {item}\n" for k, item in enumerate(items))
            + "end\nrequest = function()\n  n = n % #requests + 1\n  return requests[n]\nend\n")


_LATENCY = re.compile(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(port: int, requests: list[tuple[bytes, dict[str, str]]], connections: int, seconds: float,
        pid: int | None = None) -> Run:
    """Run wrk against /mcp with `requests` round-robin; with `pid`, the server's CPU per read too."""
    cpu = cpu_seconds([pid]) if pid is not None else 0.0
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_lua(requests))
    try:
        out = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency",
                              "-s", script.name, f"http://127.0.0.1:{port}/mcp"],
                             capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    finally:
        os.unlink(script.name)
    cpu = cpu_seconds([pid]) - cpu if pid is not None else 0.0
    count = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    latency = {m.group(1): float(m.group(2)) * _UNITS[m.group(3)] for m in _LATENCY.finditer(out)}
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    failed = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    failed += sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return Run(rate, latency["50"], latency["99"], failed, cpu / max(count, 1) * 1e6)


def one(subject: str, wire: str, root: Path, indices: list[int], connections: int, seconds: float) -> Run:
    """A fresh server of `subject`, checked, warmed, then measured on `wire`."""
    port = free_port()
    before = os.environ.get(_ENV_OFF)
    os.environ[_ENV_OFF] = "0" if subject == "aggregator-sdk" else "1"
    try:
        process = serve("floor-asgi" if subject == "floor-asgi" else "aggregator", root, port)
    finally:
        if before is None:
            del os.environ[_ENV_OFF]
        else:
            os.environ[_ENV_OFF] = before
    try:
        session = legacy_session(port) if wire == LEGACY else None
        requests = requests_for(wire, indices, session)
        check(port, requests, indices)
        wrk(port, requests, connections, 1.0)  # warm-up
        return wrk(port, requests, connections, seconds, process.pid)
    finally:
        process.terminate()
        process.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--wires", default=f"{LEGACY},{MODERN}", help=f"of {LEGACY}, {MODERN}")
    parser.add_argument("--subjects", default=",".join(SUBJECTS), help="of " + ", ".join(SUBJECTS))
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    parser.add_argument("--no-write", dest="output", action="store_const", const=None, help="print only")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        parser.error("needs wrk (apt-get install wrk)")
    # An unknown wire was read as the legacy one without its session: every read refused, 400, after the start.
    unknown = [w for w in args.wires.split(",") if w not in (LEGACY, MODERN)]
    unknown += [s for s in args.subjects.split(",") if s not in SUBJECTS]
    if unknown:
        parser.error(f"unknown --wires or --subjects: {', '.join(unknown)}")
    root = generate(DATA, args.files, prefix="catalog")
    indices = sample_indices(args.files)
    subjects = args.subjects.split(",")
    results: dict[tuple[str, str], list[Run]] = {}
    ratios: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    print(f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        for wire in args.wires.split(","):
            got = {}
            for subject in subjects if r % 2 == 0 else reversed(subjects):
                got[subject] = one(subject, wire, root, indices, args.connections, args.seconds)
                results.setdefault((wire, subject), []).append(got[subject])
            floor = got.get("floor-asgi")
            line = []
            for subject, run in got.items():
                text = (f"{subject} {run.reads_per_s:,.0f}/s p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms "
                        f"{run.cpu_us:.0f} us CPU")
                if floor is not None and subject != "floor-asgi":
                    pair = (run.reads_per_s / floor.reads_per_s, run.p99_ms / floor.p99_ms, floor.cpu_us / run.cpu_us)
                    ratios.setdefault((wire, subject), []).append(pair)
                    text += f" ({pair[0]:.2f}x rate, {pair[1]:.2f}x p99, {pair[2]:.2f}x CPU)"
                line.append(text + (f" FAILED {run.failed}" if run.failed else ""))
            print(f"round {r + 1} {wire} load {os.getloadavg()[0]:.1f}: " + " | ".join(line), flush=True)
    command = "python -m benchmarks.http_floor " + " ".join(sys.argv[1:] if argv is None else argv)
    text = section(args, results, ratios, command.strip())
    print("\n" + text)
    if args.output is not None:
        write_section(args.output, text)


def section(args: argparse.Namespace, results: dict[tuple[str, str], list[Run]],
            ratios: dict[tuple[str, str], list[tuple[float, float, float]]], command: str) -> str:
    """The Markdown section for docs/benchmarks.md: medians per wire and subject, and the ratios to the floor."""
    med = statistics.median
    lines = [HTTP_FLOOR, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {describe_machine()}, "
             f"{os.getloadavg()[0]:.1f} at the end (other work shares the machine: compare ratios, each taken within "
             "one round).", "",
             f"{args.files:,} files; wrk, one thread, {args.connections} keep-alive connections POSTing the same 20 "
             "warm `resources/read` requests round-robin, on the 2025-11-25 wire (an initialized session, SSE "
             "answers: the server's default) and the 2026-07-28 wire (JSON answers), each subject a fresh server "
             f"per round and wire, {args.rounds} rounds of {args.seconds:g} s, medians. `floor-asgi` is a bare ASGI "
             "app on uvicorn with httptools (benchmarks/peers/asgi_floor.py); `aggregator-sdk` is the aggregator "
             "with its fast path off (`AGGREGATOR_HTTP_FAST=0`). Ratios are medians of the per-round ratios to the "
             "floor; CPU per read is the server process's user+system time over the reads wrk counted.", "",
             "| wire | subject | reads/s | p50 (ms) | p99 (ms) | server CPU per read (us) | reads/s / floor "
             "| p99 / floor | floor CPU / CPU | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (wire, subject), runs in results.items():
        pairs = ratios.get((wire, subject))
        shown = [f"{med(p[k] for p in pairs):.2f}x" if pairs else "" for k in range(3)]
        lines.append(f"| {wire} | {subject} | {med(x.reads_per_s for x in runs):,.0f} | "
                     f"{med(x.p50_ms for x in runs):.2f} | {med(x.p99_ms for x in runs):.2f} | "
                     f"{med(x.cpu_us for x in runs):.0f} | {' | '.join(shown)} | {sum(x.failed for x in runs)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
