"""Replicas behind a balancer (tests/replicas.py: `serve --http` replicas, deploy/haproxy.cfg, deploy/nginx.conf):
modern-wire read throughput direct to one replica and through HAProxy and nginx to 3, the latency of `updated` on a
listen stream with and without HAProxy's `option http-no-delay`, and legacy calls lost without the stick lines.
`python -m benchmarks.replicas [--seconds 5 --rounds 20]` prints them and writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from benchmarks.sections import DOCS, REPLICAS, write_section
from tests.replicas import HAPROXY_CFG, Cluster, cluster, legacy_failures, replicas

MANIFEST = """version: 1
server: {name: replicas-bench, reloadSettle: 0s}
sources:
  docs: {url: ./docs}
collections:
  - {source: docs, glob: "*.md", uri: "docs://{path}"}
"""
CLIENTS = 8


def _folder(root: Path) -> Path:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "a.md").write_text("# A\n" + "text " * 200)
    (root / "manifest.yaml").write_text(MANIFEST)
    return root / "manifest.yaml"


def _without(config: Path, lines: tuple[str, ...], target: Path) -> Path:
    """`config` minus the lines whose stripped text starts with one of `lines`."""
    text = config.read_text().splitlines(keepends=True)
    target.write_text("".join(line for line in text if not line.strip().startswith(lines)))
    return target


async def _throughput(url: str, seconds: float) -> float:
    """Modern-wire reads per second from CLIENTS clients reading one resource in a loop for `seconds`."""
    done = 0

    async def reader() -> None:
        nonlocal done
        async with Client(url, mode="auto", cache=None) as client:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                await client.read_resource("docs://a.md")
                done += 1

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CLIENTS):
            tg.start_soon(reader)
    return done / (time.perf_counter() - started)


async def _updated_latency(url: str, target: Path, rounds: int) -> list[float]:
    """Milliseconds from writing a subscribed file to its `updated` on a modern listen stream, per round."""
    latencies: list[float] = []
    async with Client(url, mode="auto", cache=None) as client:
        async with client.listen(resource_subscriptions=["docs://a.md"]) as stream:
            await anyio.sleep(0.5)
            events = stream.__aiter__()
            for i in range(rounds):
                started = time.perf_counter()
                target.write_text(f"# A\nedit {i}\n")
                with anyio.fail_after(10):
                    while not isinstance(await events.__anext__(), ResourceUpdated):
                        pass
                latencies.append((time.perf_counter() - started) * 1000)
                await anyio.sleep(0.2)  # past the watcher's debounce: one write, one event
    return latencies


@contextmanager
def _behind(root: Path, count: int, **options: Any) -> Iterator[Cluster]:
    logs = root / f"logs-{time.monotonic_ns()}"
    logs.mkdir()
    with cluster(root / "manifest.yaml", count, logs, **options) as c:
        yield c


def run(seconds: float, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {"throughput": {}, "updated": {}, "legacy": {}}
    with tempfile.TemporaryDirectory(prefix="aggregator-replicas-") as tmp:
        root = Path(tmp)
        _folder(root)
        target = root / "docs" / "a.md"
        logs = root / "direct"
        logs.mkdir()
        with replicas(root / "manifest.yaml", 1, logs) as (one,):
            results["throughput"]["1 replica, direct"] = anyio.run(_throughput, one.url, seconds)
            results["updated"]["1 replica, direct"] = anyio.run(_updated_latency, one.url, target, rounds)
        for balancer in ("haproxy", "nginx"):
            with _behind(root, 3, balancer=balancer) as c:
                results["throughput"][f"3 replicas behind {balancer}"] = anyio.run(_throughput, c.url, seconds)
                results["updated"][f"3 replicas behind {balancer}"] = anyio.run(_updated_latency, c.url, target,
                                                                                rounds)
                if balancer == "haproxy":
                    results["legacy"]["deploy/haproxy.cfg"] = anyio.run(legacy_failures, c.url)
                else:
                    results["legacy"]["deploy/nginx.conf"] = anyio.run(legacy_failures, c.url)
        delayed = _without(HAPROXY_CFG, ("option http-no-delay",), root / "delayed.cfg")
        with _behind(root, 3, config=delayed) as c:
            results["updated"]["3 replicas behind haproxy without http-no-delay"] = anyio.run(
                _updated_latency, c.url, target, rounds)
        plain = _without(HAPROXY_CFG, ("stick ", "stick-table "), root / "plain.cfg")
        with _behind(root, 3, config=plain) as c:
            results["legacy"]["deploy/haproxy.cfg without its stick lines"] = anyio.run(legacy_failures, c.url)
    return results


def section(results: dict[str, Any], command: str) -> str:
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    throughput = [f"| {name} | {value:.0f} |" for name, value in results["throughput"].items()]
    updated = [f"| {name} | {statistics.median(v):.0f} | {sorted(v)[max(0, int(len(v) * 0.9) - 1)]:.0f} | "
               f"{max(v):.0f} | {len(v)} |" for name, v in results["updated"].items()]
    legacy = [f"| {name} | {failed} of 100 |" for name, failed in results["legacy"].items()]
    return "\n".join([
        REPLICAS, "",
        f"Run {started} with `{command}`: `serve --http` replicas on loopback (tests/replicas.py), the balancer "
        f"configured by deploy/haproxy.cfg or deploy/nginx.conf, the load generator on the same machine. "
        f"Throughput: {CLIENTS} modern-wire clients reading one cached resource in a loop. `updated`: a subscribed "
        "file written, until its `updated` arrives on a modern listen stream through the balancer. Legacy: 5 "
        "sessions of 20 reads each.", "",
        "| modern-wire reads | reads/s |", "|---|---|", *throughput, "",
        "| write -> updated on a listen stream (ms) | median | p90 | max | rounds |", "|---|---|---|---|---|",
        *updated, "",
        "| legacy calls through | failed |", "|---|---|", *legacy, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="each throughput run")
    parser.add_argument("--rounds", type=int, default=20, help="writes timed to `updated`, per setup")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    text = section(run(args.seconds, args.rounds), " ".join(["python -m benchmarks.replicas", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
