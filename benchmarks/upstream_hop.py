"""Reads through one hop vs direct and vs the relay floors, over three upstreams (benchmarks/hop_peers.py): the
official client reads from the upstream over stdio (`direct`), through the relay floor (a stdlib process copying the
bytes both ways: the least a hop costs) and the JSON relay floor (the same, parsing and encoding every message: the
least a gateway that reads what it relays costs) and the same on an event loop (the loop relay floor), and through an
aggregator whose source is that upstream (`one hop`:
McpSource over aggregator.upstream, the outer cache off, every read crosses both; `one hop, cached`: on).

`python -m benchmarks.upstream_hop [--reads 600] [--rounds 3] [--modes legacy,auto] [--upstreams ...] [--write]`
prints a table (`--write`: also its section of docs/benchmarks.md). Each round starts every peer afresh, then
interleaves their reads in blocks (50 reads of each peer in turn), so that load from elsewhere falls on all alike;
a row is the median of its rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import anyio
import psutil
from mcp import Client, StdioServerParameters

from benchmarks.documents import cpu_ns
from benchmarks.hop_peers import PEERS, UPSTREAMS, peers
from benchmarks.measure import sequential_reads
from benchmarks.rss import children, new_children
from benchmarks.sections import DOCS, UPSTREAM, write_section
from benchmarks.workload import generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
TARGET = 1.3
BLOCK = 50
"""Reads of one peer in a row before the next peer's: a server woken for a single read between three others' would
be measured cold (its CPU a read about three times a warm one's); a block is short beside a burst of load."""
"""Issue 29's target for one uncached hop: at most this many times the direct read's median."""


@dataclass(frozen=True, slots=True)
class Run:
    """One fresh server's figures: CPU microseconds per read of the server the client talks to (`outer`) and of
    the processes it started (`inner`: the upstream behind a relay or a gateway, 0 for `direct`), which a loaded
    machine disturbs less than latency does."""

    ready: float
    rate: float
    """Reads per second of one client reading one at a time (one over the mean read)."""
    median_ms: float
    outer_us: float
    inner_us: float


@dataclass(frozen=True, slots=True)
class Opened:
    """One peer started for a round: its client, URIs, readiness and processes (itself, and those it started)."""

    client: Client
    uris: list[str]
    ready: float
    outer: list[int]
    inner: list[int]


async def start(stack: AsyncExitStack, params: StdioServerParameters, mode: str) -> Opened:
    """Start one peer, list it and read every resource once (both levels' caches warm)."""
    started = time.perf_counter()
    before = children()
    client = await stack.enter_async_context(Client(params, mode=mode, cache=None))
    uris = [r.uri for r in (await client.list_resources()).resources]
    ready = time.perf_counter() - started
    await sequential_reads(client, uris, len(uris), 30.0)
    outer = new_children(before)
    return Opened(client, uris, ready, outer, [c.pid for pid in outer for c in psutil.Process(pid).children()])


async def measure(params: dict[str, StdioServerParameters], mode: str, reads: int) -> dict[str, Run]:
    """One round: every peer started afresh, one after another, then their reads interleaved in blocks (BLOCK reads
    of each peer in turn), so that what the rest of the machine does falls on all of them alike."""
    async with AsyncExitStack() as stack:
        opened = {name: await start(stack, each, mode) for name, each in params.items()}
        cpu = {name: (cpu_ns(peer.outer), cpu_ns(peer.inner)) for name, peer in opened.items()}
        latencies: dict[str, list[float]] = {name: [] for name in opened}
        for block in range(0, reads, BLOCK):
            for name, peer in opened.items():
                for i in range(block, min(block + BLOCK, reads)):
                    started = time.perf_counter()
                    await peer.client.read_resource(peer.uris[i % len(peer.uris)])
                    latencies[name].append(time.perf_counter() - started)
        runs = {}
        for name, peer in opened.items():
            outer, inner = cpu_ns(peer.outer) - cpu[name][0], cpu_ns(peer.inner) - cpu[name][1]
            spent = latencies[name]
            runs[name] = Run(peer.ready, len(spent) / sum(spent), statistics.median(spent) * 1000,
                             outer / len(spent) / 1e3, inner / len(spent) / 1e3)
    return runs


def middle(runs: list[Run]) -> Run:
    """Each figure's median over the rounds."""
    return Run(*(statistics.median(getattr(run, field) for run in runs) for field in Run.__slots__))


def row(mode: str, upstream: str, name: str, run: Run, direct: Run, relay: Run) -> str:
    return (f"| {mode} | {upstream} | {name} | {run.ready:.2f} | {run.rate:,.0f} | {run.median_ms:.2f} "
            f"| {run.median_ms / direct.median_ms:.2f} | {run.median_ms / relay.median_ms:.2f} | {run.outer_us:.0f} "
            f"| {run.inner_us:.0f} | {(run.outer_us + run.inner_us) / direct.outer_us:.2f} |")


def summary(mode: str, upstream: str, figures: dict[str, Run]) -> str:
    """One line of what the floors show for one upstream and wire."""
    direct, relay, parsed, looped, hop = (figures[name] for name in (
        "direct", "relay floor", "JSON relay floor", "loop relay floor", "one hop"))
    budget = (TARGET * direct.median_ms - relay.median_ms) * 1000
    return (f"- {mode}, {upstream}: direct {direct.median_ms:.2f} ms; the relay floor "
            f"{relay.median_ms / direct.median_ms:.2f}x direct, the JSON relay floor "
            f"{parsed.median_ms / direct.median_ms:.2f}x, the loop relay floor "
            f"{looped.median_ms / direct.median_ms:.2f}x; one hop {hop.median_ms / direct.median_ms:.2f}x "
            f"direct, {hop.median_ms / relay.median_ms:.2f}x the relay floor. {TARGET}x direct leaves a gateway "
            f"{budget:.0f} us a read beyond the relay floor; ours spends {hop.outer_us:.0f} us of CPU a read (the "
            f"relay {relay.outer_us:.0f}, the JSON relay {parsed.outer_us:.0f}, the loop relay "
            f"{looped.outer_us:.0f}, the upstream serving it directly {direct.outer_us:.0f})")


def measure_all(upstreams: list[str], modes: list[str], reads: int, rounds: int, root: Path
                ) -> tuple[list[str], list[str]]:
    """The table's rows, per wire and upstream every peer's figures (medians over `rounds` fresh starts), and a
    summary line per wire and upstream."""
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for name in upstreams:
                params = peers(UPSTREAMS[name], root, Path(tmp))
                runs: dict[str, list[Run]] = {peer: [] for peer in PEERS}
                for _ in range(rounds):
                    for peer, run in anyio.run(measure, params, mode, reads).items():
                        runs[peer].append(run)
                figures = {peer: middle(found) for peer, found in runs.items()}
                for peer in PEERS:
                    rows.append(row(mode, name, peer, figures[peer], figures["direct"], figures["relay floor"]))
                    print(rows[-1], flush=True)
                lines.append(summary(mode, name, figures))
    return rows, lines


def missing(name: str) -> str | None:
    """Why upstream `name` cannot run here (said on stderr), or None."""
    reason = UPSTREAMS[name].unavailable()
    if reason:
        print(f"skipping {name}: {reason}", file=sys.stderr)
    return reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="legacy,auto")
    parser.add_argument("--upstreams", default=",".join(UPSTREAMS))
    parser.add_argument("--write", action="store_true", help=f"write its section of {DOCS}")
    args = parser.parse_args()
    upstreams = [name for name in args.upstreams.split(",") if not missing(name)]
    root = generate(DATA, 1_000)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = ["| wire | upstream | peer | ready (s) | reads/s | median read (ms) | x direct | x relay floor "
            "| CPU/read: server (us) | upstream (us) | both, x direct |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(rows))
    measured, lines = measure_all(upstreams, args.modes.split(","), args.reads, args.rounds, root)
    rows += measured
    print("\n".join(lines))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.write:
        command = " ".join(["python -m benchmarks.upstream_hop", *sys.argv[1:]])
        write_section(DOCS, f"""{UPSTREAM}

Run {started} with `{command}` (load average {load_before} at the start, {load} at the end; 2 cores shared with
other work): the official client reads {args.reads} times (one read at a time, URIs in turn) from each upstream
of benchmarks/hop_peers.py over stdio: {"; ".join(f"`{name}`: {UPSTREAMS[name].summary}" for name in upstreams)}.
Each is read directly (`direct`), through the relay floor (`relay floor`: benchmarks/peers/relay.py, a stdlib
process that starts the upstream and copies bytes both ways, parsing nothing: the least code that makes a stdio
hop), through the JSON relay floor (`JSON relay floor`: benchmarks/peers/json_relay.py, the same relay parsing each
message and encoding it again: the least a gateway that reads what it relays does), through the same on an event
loop (`loop relay floor`: benchmarks/peers/loop_relay.py, uvloop's pipe callbacks instead of a thread a direction,
as the aggregator is built), and through an aggregator
whose only source is that upstream (`mcp+stdio:`, the `mcp` kind; its collection
serves the upstream's resources as `bench://{{path}}`) with its own cache off (`one hop`: every read crosses both
servers) and on (`one hop, cached`: reads stop at the outer cache when the upstream lets it keep them). Every
resource is read once first. A row is the median of {args.rounds} rounds; each round starts the six peers of an
upstream afresh, then interleaves their reads in blocks (50 reads of each peer in turn, one client each), so that
load from elsewhere on the machine falls on all six alike. `ready` is from starting the server to its first listing;
`reads/s` is one over the mean read; `x direct` and `x relay floor` are the median read over
theirs for the same upstream and wire; `CPU/read` is the user+system CPU of the process the client talks to
(`server`) and of the processes it started (`upstream`) per measured read, `both, x direct` their sum over
`direct`'s.

{chr(10).join(rows)}

{chr(10).join(lines)}

What the floors show: a hop as such (two more pipes, one more process woken twice a read) costs little latency: the
relay floor stays within about 1.0-1.15x direct for all three upstreams, and the JSON relay floor (the relay parsing
each message and encoding it again with orjson, checking and rewriting nothing) within about 1.0-1.15x too. On these
machines (2 vCPUs of a VM) the client, the gateway and the upstream take turns on one CPU (`perf stat`: one
migration in 5 s, two context switches a read), so the latency a gateway adds is about its CPU a read, and the
machine's speed varied by up to 1.5x between runs minutes apart (the same direct read 0.81, 1.01 and 1.11 ms): the
ratios within one run are the figures.

2026-11-28, fourth session: the gateway's instructions a relayed read, counted with callgrind (the gateway alone,
collection on for 1,000 sequential reads only, legacy wire; a count does not move with the machine's load), went
over our aggregator from 364k to 237k and over server-everything from 576k to 420k. Five costs stood out:
the read's chain of closures was a reference cycle (a lane waiter held its callback, whose closure held the `Sent`
holding the waiter), so every read left about 57 objects to the cycle collector (18k instructions a read); the
per-read value objects were frozen dataclasses, whose `__init__` sets each field through `object.__setattr__`, about
10x a plain slotted one's (51k); asyncio's selector, handles and pipe transports run in Python, and `serve` now runs
on uvloop when it is installed (the `fast` extra, part of `server`; 45k); an upstream's text was encoded to UTF-8
and decoded back (24k over server-everything's non-ASCII documents); and the upstream's line went through
the line splitter's buffer, three copies of each answer (10-19k). The direct read of our aggregator from its
cache went from 252k to 175k instructions. In an A/B on one machine (600 reads, 3 rounds, legacy wire, the code
before this session run from a worktree with the same venv) the uncached hop went from 1.36x to 1.28x direct over
our aggregator and from 1.49x to 1.33x over server-everything (1.26x and 1.32x with this session's code on asyncio's
loop; both before the line splitter's shortcut). What is left over the fast upstreams is the layers of the read
(resolution and access, the cache's single flight, the upstream's answer checked as the SDK's model would, the
content typed, the result sieved and encoded), about 2,900 bytecodes and 120 Python calls a read, none of them most
of it.

2026-11-28, fifth session: callgrind counts (as above, 1,000 sequential reads) went down again: the gateway's
relayed read over our aggregator from 237k to 176k instructions (legacy; modern 188k), over server-everything from
420k to 301k, and our direct read from cache from 172k to 115k. The changes: a read's result is built in the shape
the SDK's sieve gives (`mcp_shapes.ReadResult`) and put on the wire without being sieved again; each layer of a
relayed read is one object whose bound methods are its callbacks (stdio_fast `_Relayed`, handlers `_Relay`, the
cache's flight in reads/relayed.py, the lane's `Sent` in upstream/relaying.py), not closures over 50 cells; a
relayed text is no longer encoded to UTF-8 (only answers orjson parsed, which hold no lone surrogate; 51k over
server-everything's 1-12 KB documents); the tap takes uvloop's pipe too; an upstream's valid mimeTypes and
`is_text_mime` are remembered; a listed URI's target is kept once resolved (at most 4,096 a catalog: a URI read
again resolves in one lookup); and a fresh copy is served before a read builds its loaders. The timings did not
follow: in the run above our direct read is 0.57 ms (0.62 before) and the hop over it 1.58x, because the upstream
behind any relay spends more CPU a read than when read directly (111 us direct, 122 behind the relay floor, 171
behind the gateway: three processes taking turns on two CPUs) and the gateway's 176k instructions still cost 229
us. With the official client's direct read at 0.57 ms, 1.3x leaves a gateway about 170 us, its CPU included.

2026-11-28, sixth session: a relayed read is one object (`aggregator/stdio_relay.py`: the stdio path's running
read, the lane's waiter and the cache's flight at once) over a plan made once per URI and snapshot
(`reads/relayed.py`: the target, limits, cache key and the upstream's route), and an answer that equals the last one
of its URI but for its text (compared as parsed) is written into that answer's line with its text cut out, without
being checked, typed, sieved and encoded again. The gateway's instructions a relayed read (callgrind, as above) went
over our aggregator from 176k to 110k (legacy; modern 188k to 121k) and over server-everything from 301k to 240k;
about 1,400 bytecodes and 50 Python calls a read are left (the request's parse and checks, the lane's send with its
cap, deadline and write, the tap's claim of the answer, the flight, the lease, the access count). In an A/B run on
this machine (the code before this session from a worktree with the same venv, 800 reads, 5 rounds, load about 1.3,
interleaved with direct, the JSON relay floor and the loop relay floor) the uncached hop went over our aggregator
from 1.53x to 1.43x direct on both wires (the gateway and the upstream together 118-122 us of CPU a read before,
102-103 us after), and over server-everything from 1.35-1.44x to 1.22-1.32x (the JSON relay floor 1.05-1.07x in
those runs). With the six peers of the table above the same code measures 1.38-1.50x over server-everything: ratios
of reads this short (0.16-0.33 ms) move by about 0.1 with what else runs. Over our own aggregator the relay floors
themselves measure 1.21-1.32x here, so 1.3x leaves a gateway about 15 us a read beyond the loop relay floor. The loop
relay floor (uvloop's callbacks parsing and encoding every message, nothing else) spends 33k instructions a read over our
aggregator, and a minimal gateway on uvloop that also renumbers reads and checks and renames their answers 47k
(about 1.2x direct in the same kind of run): 1.3x over our aggregator would need a gateway at roughly 75k, two
thirds of ours now. Compiling the four upstream modules of the read (answers, lane, relaying, tap) with mypyc took
14.5k off 175k in a trial (not adopted: a build step and a C compiler for every install).

Since 2026-11-28 (second session) an uncached read through the gateway is relayed in callbacks
(`aggregator/reads/relayed.py`): taken from stdin's pipe callback, sent on the lean lane at once, and answered from
the callback that brings the upstream's answer, through the same layers without awaiting them (no task, two fewer
turns of the event loop, no coroutine chain). And a read's result of the shape our handler builds is sieved without
the SDK's models (`wire_results.read_sieved`, held to the SDK's sieve by a property test), on both sides of the hop.
The gateway's instructions a read (callgrind, collection on only for 500 sequential reads, legacy wire, over our
aggregator) went from 506k to 454k with the relay; its CPU a read in this table from 243-256 us (the same table
earlier that day) to 185-209 us. The upstream's share fell too: our aggregator's modern-wire read (the wire the
gateway speaks to it) knows a repeated `_meta` envelope by comparison and takes the `serverInfo` stamp once, and
with the sieve a warm read costs 395k instructions instead of 482k (legacy 360k instead of 380k); behind the gateway
it spent 164-172 us of CPU a read before, 127-138 us now. The median read moved less than the ratios suggest: the
direct read got cheaper as well (0.33-0.34 ms instead of 0.36-0.41), and the noise between runs is of the same order
(an A/B of relayed against awaited reads interleaved in one run: 0.60 against 0.67 ms).

The outer cache keeps what the upstream lets it keep (`aggregator/sources/mcp.py`: its `ttlMs` caps our ttl, its
`cacheScope: private` is never kept nor shared). Our aggregator answers `public` with its ttl, so `one hop, cached`
stops at the outer cache. The SDK's `MCPServer` sets no hints and so answers `ttlMs: 0, cacheScope: private` on the
modern wire (the SDK's defaults, sent as its word), which is the wire the gateway speaks to it: nothing may be kept,
and a cached hop costs what an uncached one does. server-everything speaks only 2025-11-25, which has no hints:
the source's ttl applies and `one hop, cached` stops at the outer cache.

An uncached hop over stdio asks upstream on a lean lane (`aggregator/upstream/lane.py`: the request written to the
pipe and its answer claimed where the pipe delivers it, `upstream/tap.py`, checked on the wire's dict,
`answers.read_answer`), past the SDK client's dispatcher, models and tasks (through the SDK's client the gateway
spent 625-750 us of CPU a read, 2026-11-25, load 8). Since 2026-11-28 a read through the gateway takes four turns
of the event loop instead of seven: the client's request is taken where stdin's pipe delivers it
(`FastReads.tap`), the upstream's answer in its pipe's own callback (asyncio's subprocess protocol deferred it one
turn), and the read leaves the in-flight map without a done callback; and a read of an `mcp` source is no longer
hashed (the digest served only revalidation, which read the whole resource again anyway). Instructions a read
(callgrind, the gateway alone, legacy wire): over our aggregator 762k before, 628k after (the upstream aggregator
serving the read directly: 417k before, 332k after, the stdin tap serving every stdio read); over server-everything
1.13M before the hash went, 1.00M after, most of it the JSON and UTF-8 coding of its 1-12 KB documents.
""")


if __name__ == "__main__":
    main()
