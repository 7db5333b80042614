"""Latency of the live catalog over stdio: manifest save -> list_changed (10,000-resource manifest), and
subscribed file write -> updated. `python -m benchmarks.live [--rounds 20]` prints them and writes its section of
docs/benchmarks.md."""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from benchmarks.sections import DOCS, LIVE, write_section
from benchmarks.workload import generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"


def manifest_text(root: Path, marker: int, settle: str | None = "0s") -> str:
    """One source and one collection over `root`, and a text resource named by `marker` (a save that changes it
    changes the listing); `settle` is `server.reloadSettle` (None: the default)."""
    server = f"{{name: live-bench, reloadSettle: {settle}}}" if settle else "{name: live-bench}"
    return (f"version: 1\nserver: {server}\nsources:\n  files: {{url: {root}}}\n"
            'collections:\n  - {source: files, glob: "**/*.md", uri: "bench://{path}", name: "{path}"}\n'
            f'resources:\n  - {{uri: "note://marker-{marker}", name: marker, text: "{marker}"}}\n')


def save(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp~")
    tmp.write_text(text)
    os.replace(tmp, path)


async def run(rounds: int) -> dict[str, list[float]]:
    root = generate(DATA, 10_000)
    manifest = DATA / "live-10000.yaml"
    save(manifest, manifest_text(root, 0))
    arrived: dict[str, anyio.Event] = {"list_changed": anyio.Event(), "updated": anyio.Event()}
    stamps: dict[str, float] = {}

    async def on_message(message: Any) -> None:
        kind = {"ResourceListChangedNotification": "list_changed",
                "ResourceUpdatedNotification": "updated"}.get(type(message).__name__)
        if kind:
            stamps[kind] = time.perf_counter()
            arrived[kind].set()

    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "--log-level", "WARNING", "serve",
                                                                  str(manifest)],
                                   env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    results: dict[str, list[float]] = {"save -> list_changed (ms)": [], "write -> updated (ms)": []}
    async with Client(params, mode="legacy", cache=None, message_handler=on_message) as client:
        await client.list_resources()
        await anyio.sleep(0.5)
        for i in range(1, rounds + 1):
            arrived["list_changed"] = anyio.Event()
            started = time.perf_counter()
            save(manifest, manifest_text(root, i))
            with anyio.fail_after(10):
                await arrived["list_changed"].wait()
            results["save -> list_changed (ms)"].append((stamps["list_changed"] - started) * 1000)
            await anyio.sleep(0.3)
        target = root / "d0000" / "f000.md"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.subscribe_resource("bench://d0000/f000.md")
        for i in range(rounds):
            arrived["updated"] = anyio.Event()
            started = time.perf_counter()
            target.write_text(f"# Document 0\n\nedit {i}\n")
            with anyio.fail_after(10):
                await arrived["updated"].wait()
            results["write -> updated (ms)"].append((stamps["updated"] - started) * 1000)
            await anyio.sleep(0.2)
    return results


def section(results: dict[str, list[float]], command: str) -> str:
    """The report's section: one row per latency."""
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    rows = [f"| {name} | {statistics.median(values):.0f} | {sorted(values)[max(0, int(len(values) * 0.9) - 1)]:.0f} "
            f"| {max(values):.0f} | {len(values)} |" for name, values in results.items()]
    return "\n".join([
        LIVE, "",
        f"Run {started} with `{command}`: aggregator over stdio (legacy wire) on a 10,000-file manifest; the "
        "manifest is saved atomically and the time to `notifications/resources/list_changed` taken, then a "
        "subscribed file is written and the time to `notifications/resources/updated` taken. The manifest sets "
        "`reloadSettle: 0s` so the figure is the reload itself: by default a reload first waits for the files to "
        "stay unchanged for 500 ms (a half-written save never goes live), which adds that much to every save.", "",
        "| latency | median | p90 | max | rounds |", "|---|---|---|---|---|", *rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    text = section(anyio.run(run, args.rounds), " ".join(["python -m benchmarks.live", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
