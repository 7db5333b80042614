"""Upstreams at scale (issue 26 item 4): what one big upstream page costs the gateway's memory, and what a flood of
list_changed costs its CPU, with the code of another checkout (`--peer`, e.g. /work/main) measured in the same run.

`python -m benchmarks.upstream_scale [--entries 1450000] [--flood-seconds 10] [--peer /work/main]`
`python -m benchmarks.upstream_scale --only beside --folder-files 100000 [--rounds 5]`

For memory the upstream is a stdlib-only JSON-RPC loop over stdio (`--upstream` runs it): the legacy handshake,
one resources/list page of all its entries (prebuilt, about 50 MB at 1.45M), reads answered from memory. For the
flood it is tests/upstream_server.py (`UPSTREAM_FLOOD`). The gateway (`aggregator serve` over stdio, the official
client in front) publishes each under a namespace.

- memory: peak RSS (VmHWM), RSS 6 s after the client connected (`served`: the upstream is listed once, before the
  gateway answers, its memory trimmed then; nothing relists it) and after the client listed everything, for the
  peer (its own cap), this checkout with maxEntries 10,000, and this checkout with the default cap (1,000,000).
  Ready: connected and listed.
- flood: the gateway's CPU seconds and the upstream's listings during `--flood-seconds` of 1,000 list_changed a
  second over a small upstream (`--flood-entries` more), for the peer and this checkout.
- beside: an upstream's list_changed beside a folder of `--folder-files` files (tests/upstream_server.py with
  `UPSTREAM_CHANGES`: reading `test://add/{name}` lists a new resource and tells list_changed): per round, from the
  read to the gateway's own list_changed (legacy wire), and the gateway's CPU seconds over that window; median
  latency and mean CPU of `--rounds`, the peer and this checkout, and their ratio. Each round starts once the
  relisting pace (of the last round's list_changed) let go.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from benchmarks.rss import children, cpu_seconds, new_children, peak_rss_mb

REPO = Path(__file__).resolve().parents[1]


# ---- the upstream (stdlib only) ----

def upstream_main(entries: int, page: int = 0) -> None:
    """Serve `entries` resources x://r/{i} in one page (or pages of `page`) on stdin/stdout until stdin ends; a read
    of x://bump adds one."""
    out = sys.stdout.buffer
    listings = 0
    items = [b'{"uri":"x://listings","name":"listings"}'] + [b'{"uri":"x://r/%d","name":"r%d"}' % (i, i)
                                                             for i in range(entries)]
    page = page or len(items)

    def send(raw: bytes) -> None:
        out.write(raw + b"\n")
        out.flush()

    def reply(rid: Any, result: dict[str, Any]) -> None:
        send(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = json.loads(line)
        method, rid = message.get("method"), message.get("id")
        if rid is None:
            continue
        if method == "initialize":
            reply(rid, {"protocolVersion": "2025-11-25", "serverInfo": {"name": "raw", "version": "1"},
                        "capabilities": {"resources": {"listChanged": True}}})
        elif method == "resources/list":
            start = int((message.get("params") or {}).get("cursor") or 0)
            listings += start == 0
            more = b',"nextCursor":"%d"' % (start + page) if start + page < len(items) else b""
            send(b'{"jsonrpc":"2.0","id":%s,"result":{"resources":[%s]%s}}' % (
                json.dumps(rid).encode(), b",".join(items[start:start + page]), more))
        elif method == "resources/templates/list":
            reply(rid, {"resourceTemplates": []})
        elif method == "resources/read":
            uri = message["params"]["uri"]
            if uri == "x://bump":  # one resource more in the next listing (benchmarks.relist_stall)
                items.append(b'{"uri":"x://bump/%d","name":"bump"}' % len(items))
                send(b'{"jsonrpc":"2.0","method":"notifications/resources/list_changed"}')
            text = str(listings) if uri == "x://listings" else f"text of {uri}"
            reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]})
        elif method == "ping":
            reply(rid, {})
        else:
            send(json.dumps({"jsonrpc": "2.0", "id": rid,
                             "error": {"code": -32601, "message": "Method not found"}}).encode())


# ---- the gateway ----

def manifest(folder: Path, entries: int, settings: str, page: int = 0) -> Path:
    command = [sys.executable, "-m", "benchmarks.upstream_scale", "--upstream", str(entries), "--upstream-page",
               str(page)]
    path = folder / f"m{abs(hash((entries, settings, page)))}.yaml"
    path.write_text(f"version: 1\nserver: {{name: gw}}\ndefaults: {{ttl: 0s, timeout: 60s}}\nsources:\n"
                    f"  up: {{url: 'mcp+stdio:', namespace: up, command: {json.dumps(command)}, "
                    f"env: {{PYTHONPATH: '{REPO}'}}{settings}}}\n")
    return path


def gateway(code: Path, path: Path) -> StdioServerParameters:
    """`aggregator serve` with the package of checkout `code` first on the path (`-m` puts the working folder
    before PYTHONPATH: it runs there)."""
    return StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", str(path)],
                                 env={"PYTHONPATH": str(code)}, cwd=str(code))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def text(client: Client, uri: str) -> str:
    return str((await client.read_resource(uri)).contents[0].text)  # type: ignore[union-attr]


async def memory(code: Path, path: Path) -> dict[str, float]:
    """Ready time, listed entries, peak RSS and RSS once listed, of one gateway."""
    before = children()
    started = time.monotonic()
    async with Client(gateway(code, path), mode="auto", cache=None) as client:
        pid = new_children(before)[0]
        await anyio.sleep(6.0)  # settled: the start's one listing (and its trim) is done before the client connects
        served = rss_mb(pid)
        listed, cursor = 0, None
        first = True
        while first or cursor is not None:
            first = False
            page = await client.list_resources(cursor=cursor)
            listed += len(page.resources)
            cursor = page.next_cursor
        ready = time.monotonic() - started
        await text(client, "up+x://r/1")
        await anyio.sleep(1.0)
        return {"ready_s": ready, "listed": listed, "peak_mb": peak_rss_mb(pid), "served_mb": served,
                "rss_mb": rss_mb(pid)}


def flood_manifest(folder: Path, entries: int, seconds: float) -> Path:
    """The gateway over tests/upstream_server.py telling list_changed 1,000 times a second for `seconds` (an SDK
    server: it tells them as fast as asked, where the raw loop above is slowed by its own GIL)."""
    command = [sys.executable, str(REPO / "tests" / "upstream_server.py"), "stdio"]
    env = {"PYTHONPATH": str(REPO), "UPSTREAM_RESOURCES": str(entries), "UPSTREAM_FLOOD": str(int(seconds * 1000)),
           "UPSTREAM_FLOOD_SECONDS": f"{seconds:g}"}
    path = folder / "flood.yaml"
    path.write_text(f"version: 1\nserver: {{name: gw}}\ndefaults: {{ttl: 0s, timeout: 60s}}\nsources:\n"
                    f"  up: {{url: 'mcp+stdio:', namespace: up, command: {json.dumps(command)}, "
                    f"env: {json.dumps(env)}}}\n")
    return path


async def flood(code: Path, path: Path) -> dict[str, float]:
    """The gateway's CPU and the upstream's listings while the upstream floods (the read of its flood resource
    lasts as long as the flood)."""
    before = children()
    async with Client(gateway(code, path), mode="auto", cache=None) as client:
        pid = new_children(before)[0]
        await anyio.sleep(2.0)  # settled after start
        listed = int(await text(client, "up+test://listings"))
        cpu, started = cpu_seconds([pid]), time.monotonic()
        told = int(await text(client, "up+test://flood/go"))
        spent, took = cpu_seconds([pid]) - cpu, time.monotonic() - started
        await anyio.sleep(2.0)  # the queued relist
        listings = int(await text(client, "up+test://listings")) - listed
        return {"cpu_s": spent, "seconds": took, "listings": listings, "told": told}


def beside_manifest(folder: Path, files: int) -> Path:
    """The gateway over a folder of `files` files and tests/upstream_server.py with UPSTREAM_CHANGES (namespace up);
    the folder is made once and shared by both runs."""
    docs = folder / "docs"
    if not docs.exists():
        for i in range(0, files, 1000):
            part = docs / f"d{i // 1000:04}"
            part.mkdir(parents=True)
            for j in range(i, min(i + 1000, files)):
                (part / f"f{j}.md").write_bytes(b"# f\n")
    command = [sys.executable, str(REPO / "tests" / "upstream_server.py"), "stdio"]
    env = {"PYTHONPATH": str(REPO), "UPSTREAM_CHANGES": "1"}
    path = folder / "beside.yaml"
    path.write_text(f"version: 1\nserver: {{name: gw}}\ndefaults: {{ttl: 0s, timeout: 60s}}\nsources:\n"
                    f"  docs: {{url: '{docs}'}}\n"
                    f"  up: {{url: 'mcp+stdio:', namespace: up, command: {json.dumps(command)}, "
                    f"env: {json.dumps(env)}}}\n"
                    "collections:\n  - {source: docs, glob: '**/*.md', uri: 'docs://{path}'}\n")
    return path


async def beside(code: Path, path: Path, rounds: int) -> dict[str, float]:
    """Median latency (s) from an upstream change to the gateway's list_changed, and the gateway's mean CPU seconds
    over that window, over `rounds` (each after the pace let go of the last)."""
    told = anyio.Event()

    async def heard(message: Any) -> None:
        if type(message).__name__ == "ResourceListChangedNotification":
            told.set()

    before = children()
    latencies: list[float] = []
    cpus: list[float] = []
    async with Client(gateway(code, path), mode="legacy", cache=None, message_handler=heard) as client:
        pid = new_children(before)[0]
        await anyio.sleep(5.0)  # settled after start (the upstream was listed once then; no listener relists it)
        for i in range(rounds):
            told = anyio.Event()
            cpu, started = cpu_seconds([pid]), time.monotonic()
            await text(client, f"up+test://add/bench{i}")
            with anyio.fail_after(300):
                await told.wait()
            took = time.monotonic() - started
            latencies.append(took)
            cpus.append(cpu_seconds([pid]) - cpu)
            await anyio.sleep(max(1.5, 2.5 * took))  # past RelistPace's gap: the next round relists at once
        listed = 0
        cursor = None
        while True:
            page = await client.list_resources(cursor=cursor)
            listed += sum(1 for r in page.resources if str(r.uri).startswith("up+test://added/bench"))
            cursor = page.next_cursor
            if cursor is None:
                break
        assert listed == rounds, listed
    return {"latency_s": statistics.median(latencies), "cpu_s": sum(cpus) / rounds}  # CPU: clock ticks, summed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-page", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=1_450_000)
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--peer", type=Path, default=Path("/work/main"), help="another checkout to compare with")
    parser.add_argument("--flood-entries", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--only", choices=("beside",), help="run only this phase")
    parser.add_argument("--folder-files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.upstream is not None:
        upstream_main(args.upstream, args.upstream_page)
        return
    here: Path = REPO

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            if args.only == "beside":
                print(f"beside: an upstream's list_changed beside a folder of {args.folder_files:,} files "
                      f"({args.rounds} rounds; load {os.getloadavg()[0]:.2f})")
                path = beside_manifest(folder, args.folder_files)
                measured = {name: await beside(code, path, args.rounds) for name, code in (("peer", args.peer),
                                                                                            ("this", here))}
                for name, figures in measured.items():
                    print(f"  {name:6} upstream change -> list_changed {figures['latency_s'] * 1000:8.1f} ms  "
                          f"gateway cpu {figures['cpu_s'] * 1000:8.1f} ms", flush=True)
                peer, this = measured["peer"], measured["this"]
                print(f"  ratio peer/this: latency {peer['latency_s'] / this['latency_s']:.1f}x  "
                      f"cpu {peer['cpu_s'] / max(this['cpu_s'], 1e-3):.1f}x  (load {os.getloadavg()[0]:.2f})")
                return
            if not args.skip_memory:
                print(f"memory, one page of {args.entries:,} entries (MB; ready = connected and listed)")
                for name, code, settings in (("peer", args.peer, ""), ("this, maxEntries 10,000", here,
                                                                        ", maxEntries: 10000"),
                                             ("this, default cap", here, "")):
                    got = await memory(code, manifest(folder, args.entries, settings))
                    print(f"  {name:26} listed {got['listed']:>9,}  peak {got['peak_mb']:7.0f}  "
                          f"served {got['served_mb']:7.0f}  after a full listing {got['rss_mb']:7.0f}  "
                          f"ready {got['ready_s']:6.1f} s", flush=True)
            print(f"flood: 1,000 list_changed/s for {args.flood_seconds:g} s, {args.flood_entries:,} entries")
            for name, code in (("peer", args.peer), ("this", here)):
                got = await flood(code, flood_manifest(folder, args.flood_entries, args.flood_seconds))
                print(f"  {name:26} gateway cpu {got['cpu_s']:6.2f} s over {got['seconds']:5.1f} s  upstream "
                      f"listings {got['listings']:5.0f}  list_changed told {got['told']:,}", flush=True)

    anyio.run(run)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
