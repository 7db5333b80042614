"""Reliability under faults: many HTTP clients reading while the manifest breaks, half-saves and a render runs away.

`python -m benchmarks.reliability [--files 2000] [--clients 64] [--seconds 60] [--baseline-seconds 20]`

One `aggregator serve --http` process serves a collection of generated files and a URI template whose render
loops as long as its URI asks. Load processes keep `--clients` modern-wire `resources/read` POSTs in flight over
raw keep-alive connections (the `benchmarks.http_load` requests), each answer checked for the file's text, and
every file read exists in every version of the manifest: a failed read is the server's fault. Two phases, each on
a fresh server:

- steady: the load alone (the figures to compare with);
- faults: the same load while, on a fixed timeline, the manifest is saved broken then good again, saved in two
  chunks (the first a valid manifest without the collection) 0.1 s and 0.5 s apart, and several renders that
  would loop 10^8 times are requested at once. `/healthz` is probed every 100 ms throughout.

Reported per phase: reads/s, p50, p99, failed reads (the goal is 0), the slowest `/healthz`, the server's RSS
before and after, and how the runaway renders ended (an error naming the URI, and after how long).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.http_load import _read_response, request_of
from benchmarks.machine import describe as describe_machine
from benchmarks.measure import _accepting, free_port
from benchmarks.run import DATA
from benchmarks.sections import DOCS, RELIABILITY, write_section
from benchmarks.workload import body_of, generate, uri_of

REPO = Path(__file__).resolve().parents[1]
RUNAWAY_N = 10_000
"""`slow://10000` asks for 10^8 loop iterations: seconds of CPU unless the render budget stops it."""

GOOD = """\
version: 1
server: {{name: reliability}}
sources:
  files: {{url: "{root}"}}
{extra}collections:
  - {{source: files, glob: "**/*.md", uri: "bench://{{path}}", name: "{{path}}"}}
templates:
  - uriTemplate: "slow://{{n}}"
    name: slow
    render: "{{% for i in range(n|int) %}}{{% for j in range(n|int) %}}{{% endfor %}}{{% endfor %}}done"
"""
BROKEN = "version: 1\nsources: [\n  files: {url: \"%s\"\n"


def good_manifest(root: Path, generation: int) -> str:
    """A valid manifest; `generation` adds an inline resource so each good save changes the listing."""
    extra = f'resources:\n  - {{uri: "note://generation", name: "gen{generation}", text: "{generation}"}}\n'
    return GOOD.format(root=root, extra=extra)


@dataclass
class Outcome:
    """What the load processes saw: (start time, latency s) per good read, and failed reads with reasons."""

    reads: list[tuple[float, float]] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)


async def _connection(port: int, indices: list[int], deadline: float, outcome: Outcome, seed: int) -> None:
    """One keep-alive connection reading random files until `deadline`, reconnecting after a failure."""
    rng = random.Random(seed)
    reader = writer = None
    n = 0
    while time.time() < deadline:
        i = rng.choice(indices)
        n += 1
        body, headers = request_of(uri_of(i), n)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        raw = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}Content-Length: {len(body)}\r\n\r\n"
               ).encode() + body
        expected = json.dumps(body_of(i))[1:-1].encode()
        started = time.time()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            writer.write(raw)
            status, answer = await asyncio.wait_for(_read_response(reader), 30)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            outcome.failures.append((started, type(exc).__name__))
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.05)
            continue
        if status != 200 or expected not in answer:
            outcome.failures.append((started, f"HTTP {status}: {answer[:160]!r}"))
            continue
        outcome.reads.append((started, time.time() - started))
    if writer is not None:
        writer.close()


def _load_process(port: int, connections: int, indices: list[int], start_at: float, seconds: float, seed: int,
                  out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    outcome = Outcome()

    async def run() -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + seconds
        await asyncio.gather(*(_connection(port, indices, deadline, outcome, seed * 1000 + c)
                               for c in range(connections)))

    asyncio.run(run())
    out.put((outcome.reads, outcome.failures))


def _healthz_probe(port: int, stop: threading.Event, latencies: list[tuple[float, float]]) -> None:
    """GET /healthz every 100 ms until `stop`: (when it answered, seconds it took); inf when it did not."""
    while not stop.is_set():
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as answer:
                answer.read()
            latencies.append((time.time(), time.perf_counter() - started))
        except OSError:
            latencies.append((time.time(), float("inf")))
        stop.wait(0.1)


@dataclass
class RunawayResult:
    seconds: float
    outcome: str


def _runaway(port: int, results: list[RunawayResult]) -> None:
    """One modern-wire read of `slow://RUNAWAY_N`: how long it took and what came back (error code or 'content')."""
    uri = f"slow://{RUNAWAY_N}"
    body, headers = request_of(uri, 1)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, headers=headers, method="POST")
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            text = answer.read().decode("utf-8", "replace")
    except OSError as exc:
        results.append(RunawayResult(time.perf_counter() - started, type(exc).__name__))
        return
    elapsed = time.perf_counter() - started
    payload = text[text.find("{"):text.rfind("}") + 1] if "{" in text else "{}"
    try:
        message = json.loads(payload)
    except ValueError:
        results.append(RunawayResult(elapsed, "unparsable answer"))
        return
    error = message.get("error")
    outcome = f"error {error.get('code')}: {error.get('message', '')[:80]}" if error else "content"
    results.append(RunawayResult(elapsed, outcome))


def _save_in_two_chunks(path: Path, text: str, gap: float) -> None:
    """Write `text` in place in two chunks `gap` apart; the first chunk ends before `collections:` (valid alone)."""
    cut = text.index("collections:")
    with open(path, "w") as handle:
        handle.write(text[:cut])
        handle.flush()
        time.sleep(gap)
        handle.write(text[cut:])


def _faults(manifest: Path, root: Path, port: int, start_at: float, seconds: float, stop: threading.Event,
            runaways: list[RunawayResult], log: list[str]) -> None:
    """The fault timeline, as fractions of the phase: runaway renders, broken/good saves, two-chunk saves."""
    generation = 1

    def at(fraction: float) -> bool:
        while time.time() < start_at + fraction * seconds:
            if stop.wait(0.02):
                return False
        return True

    def runaway_burst(count: int) -> None:
        for _ in range(count):
            threading.Thread(target=_runaway, args=(port, runaways), daemon=True).start()
        log.append(f"{time.time() - start_at:5.1f}s {count} runaway renders")

    plan: list[tuple[float, str]] = [(0.15, "runaway"), (0.3, "broken"), (0.35, "good"), (0.45, "chunks 0.1"),
                                     (0.6, "chunks 0.5"), (0.7, "runaway"), (0.75, "broken"), (0.8, "good")]
    for fraction, action in plan:
        if not at(fraction):
            return
        if action == "runaway":
            runaway_burst(4)
        elif action == "broken":
            manifest.write_text(BROKEN % root)
            log.append(f"{time.time() - start_at:5.1f}s broken save")
        else:
            generation += 1
            text = good_manifest(root, generation)
            if action == "good":
                manifest.write_text(text)
            else:
                _save_in_two_chunks(manifest, text, float(action.split()[1]))
            log.append(f"{time.time() - start_at:5.1f}s {action} save (generation {generation})")


@dataclass(frozen=True)
class Phase:
    name: str
    reads_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    failure_examples: list[str]
    healthz_max_ms: float
    healthz_max_at: float
    """Seconds into the phase when the slowest /healthz answered."""
    healthz_p99_ms: float
    rss_before_mb: float
    rss_after_mb: float
    runaways: list[RunawayResult]
    timeline: list[str]


def run_phase(name: str, root: Path, files: int, clients: int, processes: int, seconds: float,
              faults: bool) -> Phase:
    """A fresh server, warmed up; `clients` reads in flight for `seconds`, with the fault timeline if `faults`."""
    folder = Path(tempfile.mkdtemp(prefix="reliability-"))
    manifest = folder / "manifest.yaml"
    manifest.write_text(good_manifest(root, 1))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "aggregator", "--log-level", "ERROR", "serve", str(manifest),
                               "--http", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(folder / "server.log", "wb"), cwd=REPO)
    try:
        while not _accepting(port):
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}; see {folder / 'server.log'}")
            time.sleep(0.02)
        indices = list(range(files))
        _drive(port, indices, 4, 1, 1.0, 0, lambda *_: None)  # warm the code paths
        rss_before = psutil.Process(server.pid).memory_info().rss / 2**20
        stop, healthz, runaways, log = threading.Event(), [], [], []  # type: ignore[var-annotated]
        probe = threading.Thread(target=_healthz_probe, args=(port, stop, healthz), daemon=True)
        probe.start()

        def during(start_at: float) -> None:
            if faults:
                threading.Thread(target=_faults, daemon=True,
                                 args=(manifest, root, port, start_at, seconds, stop, runaways, log)).start()

        reads, failures = _drive(port, indices, clients, processes, seconds, 1, during)
        stop.set()
        probe.join(35)
        time.sleep(0.5)
        if server.poll() is not None:
            raise RuntimeError(f"the server died during the phase (exit {server.returncode})")
        rss_after = psutil.Process(server.pid).memory_info().rss / 2**20
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:  # a server stuck in a render does not get to its SIGTERM handler
            server.kill()
            server.wait(15)
    latencies = sorted(lat for _, lat in reads)
    count = len(latencies)
    started_at = min((t for t, _ in reads), default=0.0)
    slowest = max(healthz, key=lambda probe: probe[1], default=(started_at, float("nan")))
    probes = sorted(lat for _, lat in healthz) or [float("nan")]
    return Phase(name, count / seconds, latencies[count // 2] * 1000 if count else float("nan"),
                 latencies[min(count - 1, int(count * 0.99))] * 1000 if count else float("nan"), len(failures),
                 sorted({reason for _, reason in failures})[:3], slowest[1] * 1000, slowest[0] - started_at,
                 probes[min(len(probes) - 1, int(len(probes) * 0.99))] * 1000, rss_before, rss_after, runaways, log)


def _drive(port: int, indices: list[int], clients: int, processes: int, seconds: float, seed: int,
           during: object) -> tuple[list[tuple[float, float]], list[tuple[float, str]]]:
    processes = max(1, min(processes, clients))
    shares = [clients // processes + (1 if p < clients % processes else 0) for p in range(processes)]
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 0.5
    workers = [multiprocessing.Process(target=_load_process,
                                       args=(port, share, indices, start_at, seconds, seed * 100 + p, out))
               for p, share in enumerate(shares)]
    for w in workers:
        w.start()
    during(start_at)  # type: ignore[operator]
    results = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
    return [r for res in results for r in res[0]], [f for res in results for f in res[1]]


def section(phases: list[Phase], files: int, clients: int, processes: int, command: str) -> str:
    lines = [RELIABILITY, "",
             f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {describe_machine()}.",
             "",
             f"One `aggregator serve --http` over {files:,} files; {clients} modern-wire `resources/read` POSTs in "
             f"flight from {processes} load process(es) over raw keep-alive connections, each answer checked; every "
             "file read exists in every manifest version, so any failed read is the server's fault (goal: 0). "
             "`/healthz` probed every 100 ms. The faults phase saves the manifest broken then good (twice), in two "
             "chunks 0.1 s and 0.5 s apart (the first chunk a valid manifest without the collection), and requests "
             f"4 renders of `slow://{RUNAWAY_N}` (10^8 loop iterations) twice. Each phase on a fresh server.", "",
             "| phase | reads/s | p50 (ms) | p99 (ms) | failed reads | /healthz p99, slowest (ms) | "
             "RSS before -> after (MB) |",
             "|---|---|---|---|---|---|---|"]
    for p in phases:
        slowest = (f"{p.healthz_max_ms:.0f} at {p.healthz_max_at:.1f} s" if p.healthz_max_ms != float("inf")
                   else f"no answer in 30 s at {p.healthz_max_at:.1f} s")
        healthz = f"{p.healthz_p99_ms:.0f}, {slowest}"
        lines.append(f"| {p.name} | {p.reads_per_s:,.0f} | {p.p50_ms:.1f} | {p.p99_ms:.1f} | {p.failed} | "
                     f"{healthz} | {p.rss_before_mb:.0f} -> {p.rss_after_mb:.0f} |")
    for p in phases:
        if p.failure_examples:
            lines += ["", f"Failed reads in {p.name}, e.g.: " + "; ".join(f"`{e}`" for e in p.failure_examples)]
        if p.runaways:
            outcomes = sorted({r.outcome for r in p.runaways})
            lines += ["", f"Runaway renders in {p.name}: " + "; ".join(
                f"{sum(r.outcome == o for r in p.runaways)} of {len(p.runaways)} ended after "
                f"{min(r.seconds for r in p.runaways if r.outcome == o):.2f}-"
                f"{max(r.seconds for r in p.runaways if r.outcome == o):.2f} s with `{o}`" for o in outcomes)]
        if p.timeline:
            lines += ["", f"Timeline of {p.name}: " + "; ".join(p.timeline)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=64, help="reads in flight")
    parser.add_argument("--processes", type=int, default=2, help="load-generating processes")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the faults phase")
    parser.add_argument("--baseline-seconds", type=float, default=20.0, help="length of the steady phase (0: none)")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    root = generate(DATA, args.files, prefix="reliability")
    phases = []
    if args.baseline_seconds > 0:
        phases.append(run_phase("steady", root, args.files, args.clients, args.processes, args.baseline_seconds,
                                faults=False))
        print(f"steady: {phases[-1]}", file=sys.stderr)
    phases.append(run_phase("faults", root, args.files, args.clients, args.processes, args.seconds, faults=True))
    print(f"faults: {phases[-1]}", file=sys.stderr)
    command = ("python -m benchmarks.reliability " + " ".join(sys.argv[1:])).strip()
    text = section(phases, args.files, args.clients, args.processes, command)
    print(text)
    write_section(args.output, text)
    if any(p.failed for p in phases):
        sys.exit(1)


if __name__ == "__main__":
    main()
