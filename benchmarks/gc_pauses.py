"""Micro-benchmark (issue 26): the cyclic collector's pauses with a big catalog, frozen (`aggregator.heap`) or not.

`python -m benchmarks.gc_pauses 100000 1000000` serves the scale corpus of each size in process (one collection
`**/*.md`) frozen once open as `serve` does, relists it whole (`refresh_listing`), first with `heap.settle` off
(`heap.FREEZE_AT` past the size) then on, each in its own process, and takes: the time of a full collection
(`gc.collect()` once the relist's garbage is gone, what CPython runs on its own as survivors pile up); then a
workload of file changes (one added and removed again, `CatalogUpdates.files_changed`) with listing pages walked
between them, timing every collection the interpreter ran by itself (`gc.callbacks`): how many full ones, the
longest and the total; and the process's RSS at the end. Both modes in one run, on the same corpus, so the ratio holds under load.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from aggregator import heap
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.watch import Change
from benchmarks.scale_corpus import Journal, corpus
from benchmarks.workload import relative_path

CHANGES = 300
PAGES = 20  # listing pages walked after each change: short-lived Entries, as clients listing make


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))


class _Pauses:
    """Every collection the interpreter runs while installed: (generation, ms)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seen.append((info["generation"], (time.perf_counter() - self._started) * 1000))


async def _one(files: int, freeze: bool) -> dict[str, float]:
    root = corpus(files)
    journal = Journal(root)
    heap_at, heap.FREEZE_AT = heap.FREEZE_AT, heap.FREEZE_AT if freeze else files + 1
    gc.collect()
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "manifest.yaml"
        manifest.write_text(f"version: 1\nserver: {{name: gc-pauses}}\nsources:\n  files: {{url: {root}}}\n"
                            'collections:\n  - {source: files, glob: "**/*.md", uri: "bench://{path}"}\n')
        service = await ResourceService.open(manifest)
        gc.freeze()  # as `serve` does once started
        pauses = _Pauses()
        try:
            await service.refresh_listing()  # a catalog built whole again (an upstream's list_changed, a full relist)
            gc.collect()  # what the relist left; then a full pass as the interpreter runs one, median of three
            passes = []
            for _ in range(3):
                started = time.perf_counter()
                gc.collect()
                passes.append((time.perf_counter() - started) * 1000)
            full_ms = sorted(passes)[1]
            updates = CatalogUpdates(service, Notifier())
            added = relative_path(0).rsplit("/", 1)[0] + "/added-gc.md"
            gc.callbacks.append(pauses)
            for _ in range(CHANGES):
                journal.touch(added).write_text("# added\n")
                await updates.files_changed("files", {(Change.added, added)})
                (root / added).unlink()
                await updates.files_changed("files", {(Change.deleted, added)})
                cursor = None
                for _ in range(PAGES):
                    page = service.list_page(cursor)
                    cursor = page.page.next_cursor
            gc.callbacks.remove(pauses)
            full = [ms for generation, ms in pauses.seen if generation == 2]
            return {"full collection (ms)": full_ms, "full passes run by themselves": len(full),
                    "longest full pass (ms)": max(full, default=0.0),
                    "longest pause, any generation (ms)": max((ms for _, ms in pauses.seen), default=0.0),
                    "total pause (ms)": sum(ms for _, ms in pauses.seen), "RSS at the end (MB)": _rss_mb()}
        finally:
            if pauses in gc.callbacks:
                gc.callbacks.remove(pauses)
            journal.repair()
            heap.FREEZE_AT = heap_at
            await service.aclose()


def _in_own_process(size: int, freeze: bool) -> dict[str, float]:
    """`_one` in a fresh interpreter (what one mode freezes or leaves behind must not count in the other)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gc_pauses", "--one", str(size), str(int(freeze))],
                          check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(anyio.run(_one, int(argv[1]), argv[2] == "1")))
        return
    sizes = [int(a) for a in argv] or [100_000]
    results = {(size, freeze): _in_own_process(size, freeze) for size in sizes for freeze in (False, True)}
    names = list(next(iter(results.values())))
    columns = [f"{size:,} {'frozen' if freeze else 'not'}" for size, freeze in results]
    print(f"{f'{CHANGES} changes, {PAGES} pages each':<38}" + "".join(f"{c:>18}" for c in columns))
    for name in names:
        print(f"{name:<38}" + "".join(f"{figures[name]:>18.1f}" for figures in results.values()))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main(sys.argv[1:])
