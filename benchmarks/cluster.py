"""Replicas on one Redis (`server.cluster`): `serve --http` replicas (tests/replicas.py) behind HAProxy
(deploy/haproxy.cfg), a redis-server of the benchmark's own, a polled HTTP source on loopback (tests/http_server.py).

`python -m benchmarks.cluster [--quick]` measures, and writes its section of docs/benchmarks.md:
1. modern-wire reads/s, p50/p99 and CPU per read (replicas + HAProxy) for 1, 2 and 3 replicas behind HAProxy, beside
   1 replica direct and `--workers 2` on one host (the raw load generator of benchmarks.http_load);
2. fan-out: a change on the polled source -> `updated` on 100 and 1,000 raw `subscriptions/listen` streams spread
   over 3 replicas through HAProxy; latency, first-to-last spread, duplicates and misses;
3. upstream GETs per 1,000 cold reads spread over 3 replicas, shared cache on vs off (single-flight on);
4. a manifest edit -> every replica's /healthz reporting the same new sha256.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.http_load import MODERN, Load, _read_response, drive, request_of
from benchmarks.machine import describe as describe_machine
from benchmarks.run import DATA
from benchmarks.sections import CLUSTER, DOCS, write_section
from benchmarks.workload import generate, sample_indices
from tests.http_server import Upstream, serve
from tests.replicas import RedisServer, cluster, redis_server, replicas

FILES = 1_000
HOT = "api://hot"
UPDATED = b'"notifications/resources/updated"'


class _Stamped(Counter[str]):
    """The upstream's request counter, also noting when each request for the hot file arrived (perf_counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.hot: list[float] = []

    def __setitem__(self, key: str, value: int) -> None:
        if key.endswith(" hot.md"):
            self.hot.append(time.perf_counter())
        super().__setitem__(key, value)


@dataclass
class Setup:
    """What every measurement shares: the generated files, the upstream HTTP server, Redis, a scratch folder."""

    files: Path
    upstream: Upstream
    redis: RedisServer
    root: Path
    poll_ms: int
    runs: int = 0

    def manifest(self, *, shared_cache: bool = True, name: str = "m") -> Path:
        """A manifest in a folder of its own with a fresh Redis key prefix (no key of an earlier run is seen)."""
        self.runs += 1
        folder = self.root / f"{name}-{self.runs}"
        folder.mkdir()
        prefix = f"bench-{uuid.uuid4().hex[:12]}"
        path = folder / "manifest.yaml"
        path.write_text(f"""version: 1
server:
  name: cluster-bench
  reloadSettle: 0s
  cluster: {{redis: "{self.redis.url}", prefix: {prefix}, sharedCache: {str(shared_cache).lower()}, singleFlight: true}}
defaults: {{ttl: 5m, maxBytes: 10MiB}}
sources:
  files: {{url: "{self.files}"}}
  api: {{url: "http://127.0.0.1:{self.upstream.port}/base", allowPrivateNetwork: true, poll: {self.poll_ms}ms, timeout: 10s}}
collections:
  - {{source: files, glob: "**/*.md", uri: "bench://{{path}}", name: "{{path}}"}}
resources:
  - {{uri: "{HOT}", name: hot, source: api, path: hot.md}}
templates:
  - {{uriTemplate: "api://raw/{{+path}}", name: raw, source: api, path: "{{path}}"}}
""")
        (folder / "logs").mkdir()
        return path


@contextmanager
def setup(poll_ms: int) -> Iterator[Setup]:
    with tempfile.TemporaryDirectory(prefix="aggregator-cluster-") as tmp, serve() as upstream, \
            redis_server(Path(tmp)) as redis:
        upstream.files["hot.md"] = b"# hot\n\nversion 0\n"
        upstream.hits = _Stamped()
        yield Setup(generate(DATA, FILES, prefix="cluster"), upstream, redis, Path(tmp), poll_ms)


# 1. Throughput ----------------------------------------------------------------------------------------------------

THROUGHPUT = ("1 replica, direct", "1 replica, --workers 2, direct", "1 replica behind HAProxy",
              "2 replicas behind HAProxy", "3 replicas behind HAProxy")


def _load(s: Setup, subject: str, in_flight: int, seconds: float) -> Load:
    indices = sample_indices(FILES)
    manifest = s.manifest(name="load")
    logs = manifest.parent / "logs"
    if "direct" in subject:
        args = ["--stateless", "--workers", "2"] if "workers" in subject else []
        with replicas(manifest, 1, logs, args=args) as (one,):
            drive(one.port, one.process.pid, 8, 1, 1.0, indices)  # warm: every worker's cache, the code paths
            return drive(one.port, [one.process.pid], in_flight, 1, seconds, indices)
    count = int(subject[0])
    with cluster(manifest, count, logs) as c:
        pids = [r.process.pid for r in c.replicas] + [c.balancer.process.pid]
        drive(c.balancer.port, pids, 8, 1, 1.0, indices)
        return drive(c.balancer.port, pids, in_flight, 1, seconds, indices)


def throughput(s: Setup, rounds: int, in_flight: int, seconds: float) -> dict[str, list[Load]]:
    """Each subject `rounds` times, interleaved (the order reversed every other round)."""
    results: dict[str, list[Load]] = {name: [] for name in THROUGHPUT}
    for r in range(rounds):
        for subject in THROUGHPUT if r % 2 == 0 else reversed(THROUGHPUT):
            load = _load(s, subject, in_flight, seconds)
            results[subject].append(load)
            print(f"round {r + 1} {subject}: {load.reads_per_s:,.0f} reads/s", file=sys.stderr)
    return results


# 2. Fan-out -------------------------------------------------------------------------------------------------------


def _listen_request(port: int, uri: str, request_id: str) -> bytes:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "cluster-bench", "version": "1"}}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen",
                       "params": {"notifications": {"resourceSubscriptions": [uri]}, "_meta": meta}}).encode()
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n"
            f"Mcp-Method: subscriptions/listen\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class Stream:
    """One raw listen stream: when each `updated` arrived (perf_counter seconds)."""

    arrivals: list[float] = field(default_factory=list)
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    error: str = ""


async def _stream(port: int, n: int, stream: Stream, stop: asyncio.Event) -> None:
    """Open a listen stream through `port` and note every `updated` until `stop` (scanning the raw bytes: each SSE
    event arrives whole in one chunk, which is what the server writes)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, TimeoutError) as exc:
        stream.error = type(exc).__name__
        stream.acked.set()
        return
    try:
        writer.write(_listen_request(port, HOT, f"listen-{n}"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            stream.error = head.split(b"\r\n", 1)[0].decode("latin-1")
            return
        tail = b""
        while not stop.is_set():
            read = asyncio.ensure_future(reader.read(65536))
            stopped = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                break
            stopped.cancel()
            data = read.result()
            now = time.perf_counter()
            if not data:
                stream.error = stream.error or "closed"
                break
            buffer = tail + data
            if b"data:" in buffer:
                stream.acked.set()  # the first frame: the listen request's acknowledgment
            stream.arrivals.extend([now] * buffer.count(UPDATED))
            tail = buffer[-(len(UPDATED) - 1):]
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
        stream.error = type(exc).__name__
    finally:
        stream.acked.set()
        writer.close()


@dataclass
class FanOut:
    streams: int
    changes: int
    latencies_ms: list[float]
    """change -> each stream's `updated`, every stream of every change."""
    from_poll_ms: list[float]
    """the lease holder's detecting poll (its request reaching the upstream) -> each stream's `updated`."""
    spreads_ms: list[float]
    """first -> last stream's `updated`, per change."""
    duplicates: int
    misses: int
    failed_streams: int


async def _fan_out(port: int, streams: int, changes: int, upstream: Upstream, poll_s: float) -> FanOut:
    stop = asyncio.Event()
    state = [Stream() for _ in range(streams)]
    tasks = []
    for n, stream in enumerate(state):
        tasks.append(asyncio.ensure_future(_stream(port, n, stream, stop)))
        if n % 50 == 49:
            await asyncio.sleep(0.05)  # opening 1,000 at once would measure the accept queue, not the bus
    await asyncio.wait_for(asyncio.gather(*(s.acked.wait() for s in state)), 120)
    await asyncio.sleep(poll_s * 4 + 1)  # interests written, the lease holder's baseline poll done
    latencies: list[float] = []
    from_poll: list[float] = []
    spreads: list[float] = []
    polls = upstream.hits.hot if isinstance(upstream.hits, _Stamped) else []
    for change in range(changes):
        live = [s for s in state if not s.error]
        await asyncio.sleep(random.uniform(0, poll_s))  # at a random phase of the poll interval
        upstream.files["hot.md"] = f"# hot\n\nversion {time.time_ns()}\n".encode()
        started = time.perf_counter()
        deadline = started + poll_s * 2 + 10
        while time.perf_counter() < deadline and any(len(s.arrivals) <= change for s in live):
            await asyncio.sleep(0.01)
        await asyncio.sleep(poll_s * 3)  # a duplicate would come within a few polls
        firsts = [s.arrivals[change] for s in live if len(s.arrivals) > change]
        latencies.extend((t - started) * 1000 for t in firsts)
        detected = min((t for t in polls if t > started), default=None)
        if detected is not None:
            from_poll.extend((t - detected) * 1000 for t in firsts)
        if firsts:
            spreads.append((max(firsts) - min(firsts)) * 1000)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    live = [s for s in state if not s.error or s.arrivals]
    return FanOut(streams, changes, latencies, from_poll, spreads,
                  duplicates=sum(max(0, len(s.arrivals) - changes) for s in state),
                  misses=sum(max(0, changes - len(s.arrivals)) for s in live),
                  failed_streams=sum(1 for s in state if s.error and s.error != "closed"))


# 3. Upstream requests per 1,000 cold reads ------------------------------------------------------------------------


async def _cold_reads(ports: list[int], uris: list[tuple[str, int]], in_flight: int) -> int:
    """Read every (uri, replica index) pair, `in_flight` at a time over keep-alive connections; failed reads."""
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for item in uris:
        queue.put_nowait(item)
    failed = 0

    async def worker() -> None:
        nonlocal failed
        connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        try:
            while not queue.empty():
                uri, replica = queue.get_nowait()
                port = ports[replica]
                if port not in connections:
                    connections[port] = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = connections[port]
                body, headers = request_of(uri, 1)
                head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                writer.write(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}Content-Length: {len(body)}"
                             f"\r\n\r\n".encode() + body)
                status, answer = await asyncio.wait_for(_read_response(reader), 30)
                if status != 200 or b'"contents"' not in answer:
                    failed += 1
        finally:
            for _, writer in connections.values():
                writer.close()

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return failed


@dataclass
class Upstreams:
    label: str
    reads: int
    files: int
    gets: int
    other: int
    failed: int


def upstream_requests(s: Setup, shared_cache: bool, reads: int, in_flight: int) -> Upstreams:
    """`reads` reads of reads/3 distinct cold files, each read once on each of 3 replicas, in random order."""
    label = f"shared cache {'on' if shared_cache else 'off'}"
    tag = uuid.uuid4().hex[:8]
    count = -(-reads // 3)
    for i in range(count):
        s.upstream.files[f"cold/{tag}/{i}.md"] = f"# cold file {i}\n\n{'text ' * 200}\n".encode()
    pairs = [(f"api://raw/cold/{tag}/{i}.md", r) for i in range(count) for r in range(3)][:reads]
    random.Random(7).shuffle(pairs)
    manifest = s.manifest(shared_cache=shared_cache, name="cold")
    with replicas(manifest, 3, manifest.parent / "logs") as group:
        before = dict(s.upstream.hits)
        failed = asyncio.run(_cold_reads([r.port for r in group], pairs, in_flight))
        delta = {k: v - before.get(k, 0) for k, v in s.upstream.hits.items() if tag in k}
    gets = sum(v for k, v in delta.items() if k.startswith("GET "))
    return Upstreams(label, len(pairs), count, gets, sum(delta.values()) - gets, failed)


# 4. Manifest digest convergence -----------------------------------------------------------------------------------


async def _digests(bases: list[str]) -> list[str]:
    import httpx2 as httpx

    async with httpx.AsyncClient(timeout=5) as client:
        answers = await asyncio.gather(*(client.get(f"{base}/healthz") for base in bases))
    return [str(a.json().get("manifest", {}).get("sha256", "")) for a in answers]


async def _converge(manifest: Path, bases: list[str], rounds: int) -> list[float]:
    """Milliseconds from an edit of the shared manifest until every replica reports the same, new sha256."""
    times: list[float] = []
    for n in range(rounds):
        old = set(await _digests(bases))
        manifest.write_text(manifest.read_text() + f"# edit {n}\n")
        started = time.perf_counter()
        deadline = started + 30
        while time.perf_counter() < deadline:
            now = await _digests(bases)
            if len(set(now)) == 1 and now[0] and now[0] not in old:
                times.append((time.perf_counter() - started) * 1000)
                break
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError(f"replicas did not converge within 30 s: {now}")
        await asyncio.sleep(0.5)
    return times


# Report -----------------------------------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def run(quick: bool) -> dict[str, Any]:
    rounds, seconds, changes, poll_ms = (1, 3.0, 3, 250) if quick else (3, 5.0, 10, 250)
    fan_sizes = (100, 1000)
    with setup(poll_ms) as s:
        results: dict[str, Any] = {"poll_ms": poll_ms, "rounds": rounds, "seconds": seconds, "in_flight": 32}
        results["throughput"] = throughput(s, rounds, 32, seconds)
        results["upstream"] = [upstream_requests(s, shared, 1000, 16) for shared in (True, False)]
        manifest = s.manifest(name="fan")
        with cluster(manifest, 3, manifest.parent / "logs") as c:
            results["fan_out"] = []
            for streams in fan_sizes:
                fan = asyncio.run(_fan_out(c.balancer.port, streams, changes, s.upstream, poll_ms / 1000))
                print(f"fan-out {streams}: p50 {_p(fan.latencies_ms, 0.5):.0f} ms, dup {fan.duplicates}, "
                      f"miss {fan.misses}, failed {fan.failed_streams}", file=sys.stderr)
                results["fan_out"].append(fan)
            results["digest"] = asyncio.run(_converge(manifest, [r.base for r in c.replicas], 3 if quick else 10))
    return results


def section(results: dict[str, Any], command: str) -> str:
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    poll = results["poll_ms"]
    lines = [CLUSTER, "",
             f"Run {started} with `{command}` on {describe_machine()}. **This machine has 2 cores** shared by the "
             "replicas, HAProxy, Redis, the upstream and the load generator: more replicas cannot add capacity "
             "here, so the rows below show what a replica and the balancer cost, not scaling. Every replica runs "
             "with `server.cluster` on, against a redis-server of the benchmark's own, behind HAProxy configured "
             "by deploy/haproxy.cfg (tests/replicas.py).", "",
             f"Reads: the raw modern-wire load generator of `benchmarks.http_load`, {results['in_flight']} reads "
             f"in flight over keep-alive connections, the 20 warm files of a {FILES:,}-file local collection, "
             f"{results['rounds']} round(s) of {results['seconds']:g} s (medians), one fresh set of processes per "
             "round. CPU per read sums user+system time of every replica (and its forks) and of HAProxy. These reads "
             "are warm local files, answered from each replica's own cache: Redis is not on their path, so the rows "
             "show the cost of the balancer and of more processes.", "",
             "| setup | reads/s | p50 (ms) | p99 (ms) | CPU per read, replicas + HAProxy (ms) | efficiency: reads "
             "per CPU second (vs direct) | failed |", "|---|---|---|---|---|---|---|"]
    base = statistics.median(x.server_cpu_ms for x in results["throughput"]["1 replica, direct"])
    for name, loads in results["throughput"].items():
        med = {f: statistics.median(getattr(x, f) for x in loads)
               for f in ("reads_per_s", "p50_ms", "p99_ms", "server_cpu_ms")}
        lines.append(f"| {name} | {med['reads_per_s']:,.0f} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
                     f"{med['server_cpu_ms']:.2f} | {1000 / med['server_cpu_ms']:,.0f} "
                     f"({base / med['server_cpu_ms']:.2f}x) | {sum(x.errors for x in loads)} |")
    lines += ["", f"Fan-out: 3 replicas behind HAProxy, N raw `subscriptions/listen` streams opened through it "
              f"(round-robin, so about N/3 per replica), each subscribed to `{HOT}` of an HTTP source polled every "
              f"{poll} ms (one lease holder polls, the change bus carries the event to the other replicas). A "
              "change is the upstream file's new content (new ETag); the latency runs from that change to each "
              f"stream's `updated`, so it includes the wait for the next poll (0 to {poll} ms; changes made at a random phase); "
              "from the detecting poll, it starts when the lease holder's request for the file reaches the upstream "
              "(its round trip, the change bus hop and the fan-out to every stream). Spread: first to "
              "last stream of one change. Duplicates and misses are counted over every stream and change.", "",
              "| listen streams | changes | change -> updated p50 (ms) | p99 (ms) | detecting poll -> updated p50 "
              "(ms) | p99 (ms) | spread p50 (ms) | spread max (ms) | duplicates | misses | streams failed |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fan in results["fan_out"]:
        lines.append(f"| {fan.streams:,} | {fan.changes} | {_p(fan.latencies_ms, 0.5):.0f} | "
                     f"{_p(fan.latencies_ms, 0.99):.0f} | {_p(fan.from_poll_ms, 0.5):.0f} | "
                     f"{_p(fan.from_poll_ms, 0.99):.0f} | {_p(fan.spreads_ms, 0.5):.0f} | "
                     f"{max(fan.spreads_ms, default=float('nan')):.0f} | {fan.duplicates} | {fan.misses} | "
                     f"{fan.failed_streams} |")
    lines += ["", "Upstream requests: 3 replicas, each read sent straight to its replica; ~333 distinct cold files "
              "of the HTTP source (URI template), each read once on every replica, in random order, 16 in flight; "
              "single-flight on.", "",
              "| shared cache | reads | distinct files | upstream GETs | GETs per 1,000 reads | other upstream "
              "requests | failed reads |", "|---|---|---|---|---|---|---|"]
    for u in results["upstream"]:
        lines.append(f"| {u.label.removeprefix('shared cache ')} | {u.reads:,} | {u.files:,} | {u.gets:,} | "
                     f"{u.gets * 1000 / u.reads:,.0f} | {u.other} | {u.failed} |")
    digest = results["digest"]
    lines += ["", "Manifest edit -> every replica's /healthz reporting the same new `manifest.sha256` (3 replicas "
              "hot-reloading the one file they share, `reloadSettle: 0s`, /healthz polled every 10 ms):", "",
              "| edits | p50 (ms) | max (ms) |", "|---|---|---|",
              f"| {len(digest)} | {statistics.median(digest):.0f} | {max(digest):.0f} |", "", _reading(results), ""]
    return "\n".join(lines)


def _reading(results: dict[str, Any]) -> str:
    """The paragraph reading the figures (written from them, so it stays true on a rerun)."""
    med = {name: {f: statistics.median(getattr(x, f) for x in loads) for f in ("reads_per_s", "server_cpu_ms")}
           for name, loads in results["throughput"].items()}
    direct, workers, one, three = (med["1 replica, direct"], med["1 replica, --workers 2, direct"],
                                   med["1 replica behind HAProxy"], med["3 replicas behind HAProxy"])
    fans = {fan.streams: fan for fan in results["fan_out"]}
    small, large = fans[min(fans)], fans[max(fans)]
    on, off = (next(u for u in results["upstream"] if u.label.endswith(state)) for state in ("on", "off"))
    wrong = sum(f.duplicates + f.misses for f in fans.values())
    return (
        f"Reading: on 2 cores, 3 replicas behind HAProxy serve {three['reads_per_s'] / direct['reads_per_s']:.2f}x "
        f"the reads/s of one replica reached directly, at {three['server_cpu_ms']:.2f} ms of CPU per read against "
        f"{direct['server_cpu_ms']:.2f} ms (HAProxy alone in front of one replica: "
        f"{one['server_cpu_ms']:.2f} ms), i.e. {direct['server_cpu_ms'] / three['server_cpu_ms']:.2f}x the "
        "efficiency. "
        + ("A replica is one Python process, so a second one can use the second core, and that is all the extra "
           "reads/s are; " if three["reads_per_s"] > direct["reads_per_s"] * 1.05 else
           "The second core is already busy with the load generator, HAProxy and Redis, so more replicas add no "
           "reads/s here; ")
        + "the balancer and the extra processes cost CPU that more cores would pay from idle ones, and this run "
        "says nothing about how far replicas scale (the machine may also be shared with other runs: see the load "
        "average above). On one host, `--workers 2` (no balancer: "
        f"two forks accepting on one shared socket) serves {workers['reads_per_s']:,.0f} reads/s, "
        f"{workers['reads_per_s'] / three['reads_per_s']:.2f}x the 3 replicas behind HAProxy, at "
        f"{workers['server_cpu_ms']:.2f} ms per read: replicas are for more hosts and rolling deploys, not for "
        "more cores of one host. A change on the polled "
        f"source reached {small.streams:,} streams {_p(small.from_poll_ms, 0.5):.0f} ms (p50) after the lease "
        f"holder's detecting poll and {large.streams:,} streams {_p(large.from_poll_ms, 0.5):.0f} ms after it (the "
        f"last of the {large.streams:,} {_p(large.spreads_ms, 0.5):.0f} ms after the first, with the load "
        "generator reading every stream on the same 2 cores); from the edit itself the wait for the next poll "
        "dominates (half the interval on average); "
        + ("every stream got exactly one `updated` per change. " if wrong == 0 else
           f"{wrong} duplicate or missing `updated` were seen (see the table). ")
        + f"With the shared cache, 1,000 cold reads spread over 3 replicas cost {on.gets * 1000 / on.reads:.0f} "
        f"upstream GETs (one per distinct file); without it {off.gets * 1000 / off.reads:,.0f} (one per file per "
        f"replica). A manifest edit is served by every replica within {max(results['digest']):.0f} ms.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s, 3 changes, 3 edits (under 2 min)")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    results = run(args.quick)
    text = section(results, " ".join(["python -m benchmarks.cluster", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
