"""How long one relist of a big source blocks the event loop (issue 26), in one process: a ticker task sleeps 1 ms in
a loop and records every gap, while the supervisor's `CatalogUpdates` relists one source whose listing changed by
one entry, the way the live loops run it:

- `poll`: a polled collection over N objects in an fsspec memory filesystem (`source_polled`, relisted.relist_source);
- `upstream`: an MCP upstream publishing N resources in one page (benchmarks.upstream_scale's stdlib upstream, which
  adds a resource when `x://bump` is read; `upstream_listed`, relisted.relist_upstream).

Each step of the relist is timed (the source's listing, `listing_changes`, `apply_upstream` / `swap_applied`,
`swap_catalog`) and every gap of the ticker longer than 5 ms is put down to the step it fell in: the longest
stall, the stalled milliseconds per step and the relist's wall time; the process's RSS before the relist and how far
its peak (VmHWM, reset before each relist) rose above that during it, and the RSS once it is over. What start-up
made is frozen out of the collector's way first, as `serve` does.

`python -m benchmarks.relist_stall [--sizes 10k,100k,1M] [--kinds poll,upstream] [--rounds 3]`
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import fsspec

from aggregator.live import relisted
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService

REPO = Path(__file__).resolve().parents[1]
TICK = 0.001
STALL = 0.005
"""A gap of the ticker longer than this counts as a stall (a 1 ms sleep wakes within a few ms on a busy machine)."""


class Ticker:
    """Sleeps `TICK` in a loop, keeping the gaps longer than `STALL` (start, end) on the perf_counter clock."""

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []

    async def run(self) -> None:
        last = time.perf_counter()
        while True:
            await anyio.sleep(TICK)
            now = time.perf_counter()
            if now - last > STALL:
                self.gaps.append((last, now))
            last = now


class Steps:
    """Named intervals of the relist (perf_counter), recorded by wrapping functions in place."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.peaks: list[tuple[float, str, float]] = []
        """(end, step, VmHWM then) of each step ended: where the relist's peak RSS was reached."""
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Time calls of `owner.name` as step `label` (nothing if it has none: another checkout's code)."""
        original = getattr(owner, name, None)
        if original is None:
            return
        if hasattr(original, "__wrapped__") and getattr(original, "_step", None):
            return
        if _is_async(original):
            @functools.wraps(original)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self.ended(label, started)
            wrapper: Any = timed_async
        else:
            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.ended(label, started)
            wrapper = timed
        wrapper._step = True
        in_dict = name in vars(owner) if not isinstance(owner, type) else name in owner.__dict__
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original) if in_dict else delattr(owner, name))

    def ended(self, label: str, started: float) -> None:
        ended = time.perf_counter()
        self.spans.append((label, started, ended))
        self.peaks.append((ended, label, status_mb("VmHWM")))

    def peaked_by(self) -> str:
        """The first step by whose end the relist's peak RSS (within 2%) was reached."""
        top = max((hwm for _, _, hwm in self.peaks), default=0.0)
        return next((label.strip() for _, label, hwm in sorted(self.peaks) if hwm >= 0.98 * top), "?")

    def collections(self) -> None:
        """Record the cyclic collector's passes too (a step of their own, whichever step they fall in)."""
        started = [0.0]

        def phase(what: str, info: dict[str, int]) -> None:
            if what == "start":
                started[0] = time.perf_counter()
            else:
                self.spans.append((f"  gc: a pass of generation {info['generation']}", started[0],
                                   time.perf_counter()))

        gc.callbacks.append(phase)
        self._undo.append(lambda: gc.callbacks.remove(phase))

    def undo(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def blame(self, gap: tuple[float, float]) -> str:
        """The innermost (shortest) step overlapping most of `gap`, else 'other'."""
        best, label = 0.0, "other (between steps)"
        for name, start, end in sorted(self.spans, key=lambda s: s[2] - s[1]):
            overlap = min(end, gap[1]) - max(start, gap[0])
            if overlap > best + 1e-9 and overlap >= 0.5 * (gap[1] - gap[0]):
                return name
            if overlap > best:
                best, label = overlap, name
        return label


def _is_async(fn: Any) -> bool:
    import inspect
    return inspect.iscoroutinefunction(fn)


def status_mb(field: str) -> float:
    """VmHWM (the peak since the last `reset_peak`) or VmRSS of this process, in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


async def stalled(relist: Callable[[], Awaitable[object]], steps: Steps) -> dict[str, Any]:
    """Run `relist` beside the ticker; the longest gap, the stalled ms per step and the wall time."""
    ticker = Ticker()
    steps.spans.clear()
    steps.peaks.clear()
    gc.collect()
    reset_peak()
    before = status_mb("VmRSS")
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.sleep(0.05)
        started = time.perf_counter()
        await relist()
        took = time.perf_counter() - started
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    after = status_mb("VmRSS")
    gaps = [g for g in ticker.gaps if g[1] > started]
    per_step: dict[str, float] = {}
    longest: dict[str, float] = {}
    for gap in gaps:
        name = steps.blame(gap)
        per_step[name] = per_step.get(name, 0.0) + (gap[1] - gap[0])
        longest[name] = max(longest.get(name, 0.0), gap[1] - gap[0])
    step_time: dict[str, float] = {}
    for name, start, end in steps.spans:
        step_time[name] = step_time.get(name, 0.0) + end - start
    worst = max(gaps, key=lambda g: g[1] - g[0], default=None)
    return {"max_gap": max((g[1] - g[0] for g in gaps), default=0.0), "wall": took,
            "max_in": steps.blame(worst).strip() if worst is not None else "-", "stalled": per_step,
            "longest": longest, "steps": step_time, "rss_mb": before, "after_mb": after,
            "peak_mb": status_mb("VmHWM") - before, "peaked_by": steps.peaked_by()}


@contextmanager
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="relist-stall-") as tmp:
        yield Path(tmp)


async def poll_case(size: int, rounds: int) -> list[dict[str, Any]]:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pipe({f"/stall/d{i // 1000:04}/f{i % 1000:03}.md": b"x" for i in range(size)})
    results = []
    with folder() as tmp:
        manifest = tmp / "poll.yaml"
        manifest.write_text("version: 1\nserver: {name: stall}\nsources:\n"
                            "  store: {url: \"memory://stall\", poll: 1h}\n"
                            "collections:\n  - {source: store, glob: \"**/*.md\", uri: \"store://{path}\"}\n")
        service = await ResourceService.open(manifest)
        gc.freeze()  # as `serve` does once started
        updates = CatalogUpdates(service, Notifier())
        steps = Steps()
        steps.wrap(type(service.sources["store"]), "list", "listing (source.list)")
        steps.wrap(relisted, "listing_changes", "comparing (listing_changes)")
        steps.wrap(relisted, "swap_applied", "applying (swap_applied)")
        steps.wrap(relisted, "files_applied", "applying (files_applied)")
        steps.wrap(ResourceService, "swap_catalog", "swapping (swap_catalog)")
        _settling(steps)
        steps.collections()
        try:
            for r in range(rounds):
                fs.pipe_file(f"/stall/added-{r}.md", b"y")

                async def relist() -> None:
                    delta = await updates.source_polled("store")
                    assert delta is not None and delta.added == {f"store://added-{r}.md"}, delta

                results.append(await stalled(relist, steps))
        finally:
            steps.undo()
            await service.aclose()
            fs.store.clear()
            gc.unfreeze()
    return results


async def upstream_case(size: int, rounds: int) -> list[dict[str, Any]]:
    results = []
    with folder() as tmp:
        command = [sys.executable, "-m", "benchmarks.upstream_scale", "--upstream", str(size)]
        manifest = tmp / "up.yaml"
        manifest.write_text("version: 1\nserver: {name: stall}\ndefaults: {ttl: 0s, timeout: 120s}\nsources:\n"
                            f"  up: {{url: 'mcp+stdio:', namespace: up, maxEntries: 2000000, "
                            f"command: {json.dumps(command)}, env: {{PYTHONPATH: '{REPO}'}}}}\n")
        service = await ResourceService.open(manifest)
        gc.freeze()  # as `serve` does once started
        updates = CatalogUpdates(service, Notifier())
        source = service.sources["up"]
        steps = Steps()
        steps.wrap(type(source), "published", "listing (source.published)")
        from aggregator.upstream import lane, pages, records
        from aggregator.sources import mcp as mcp_source
        steps.wrap(lane.Lane, "list_resources", "  listing: the page read (lane)")
        from aggregator.upstream import tap
        steps.wrap(tap, "parsed", "  listing: page decode (tap)")
        try:
            from aggregator.upstream.pieces import Pieces
        except ImportError:  # another checkout's code: pages parsed whole
            pass
        else:
            steps.wrap(Pieces, "advance", "  listing: page decode, a piece")
            steps.wrap(Pieces, "finish", "  listing: page decode, its end")
        steps.wrap(tap.StdoutTap, "feed", "  listing: the tap's lines split")
        from aggregator.upstream import connection
        steps.wrap(connection, "resource_page", "  listing: page parsed")  # main's: called on the loop
        steps.wrap(pages, "resource_page", "  listing: page parsed")
        steps.wrap(records.Packed, "__init__", "  listing: Packed")
        steps.wrap(records.Packed, "records", "  listing: Packed.records")
        _settling(steps)
        steps.wrap(records.ResourceRecords, "under", "  listing: records.under")
        steps.wrap(type(source.values), "resources", "  listing: values.resources")
        steps.wrap(records.ResourceRecords, "__eq__", "  listing: records == kept (digest)")
        steps.wrap(relisted, "listing_changes", "comparing (listing_changes)")
        steps.wrap(relisted, "_upstream_changes", "comparing (_upstream_changes)")
        steps.wrap(relisted, "apply_upstream", "comparing + applying (apply_upstream)")
        steps.wrap(ResourceService, "swap_catalog", "swapping (swap_catalog)")
        steps.collections()
        told = anyio.Event()

        async def heard(paths: object) -> None:  # as pushed.py hears it: the next listing asks the upstream again
            if paths is None:
                told.set()

        source.changes(heard)
        try:
            before = len(service.catalog)
            for r in range(rounds):
                told = anyio.Event()
                await service.read("up+x://bump")
                with anyio.fail_after(60):
                    await told.wait()

                async def relist() -> None:
                    await updates.upstream_listed("up")

                results.append(await stalled(relist, steps))
                assert len(service.catalog) == before + r + 1, (len(service.catalog), before)
        finally:
            steps.undo()
            await service.aclose()
            gc.unfreeze()
    return results


def _settling(steps: Steps) -> None:
    """Time the heap's settling after a big relist (a collection, a freeze) and its trims, where this checkout has
    them."""
    from aggregator import heap
    steps.wrap(heap, "settle", "settling (heap.settle)")
    steps.wrap(heap, "trim", "  heap.trim")


def _size(text: str) -> int:
    text = text.strip().lower()
    factor = {"k": 1_000, "m": 1_000_000}.get(text[-1], 1)
    return int(float(text.rstrip("km")) * factor)


def report(kind: str, size: int, runs: list[dict[str, Any]]) -> None:
    ms = 1000
    gaps = [r["max_gap"] for r in runs]
    print(f"  {kind:8} {size:>9,}  longest stall {statistics.median(gaps) * ms:8.1f} ms (max {max(gaps) * ms:8.1f})"
          f"  relist {statistics.median(r['wall'] for r in runs) * ms:8.1f} ms  RSS {runs[-1]['rss_mb']:6.0f} MB, "
          f"peak +{max(r['peak_mb'] for r in runs):5.0f} MB during (reached by: {runs[-1]['peaked_by']})"
          f"  load {os.getloadavg()[0]:.2f}", flush=True)
    print("      longest stall of each relist: " + ", ".join(f"{r['max_gap'] * ms:.0f} ms in {r['max_in']}"
                                                       for r in runs), flush=True)
    print("      RSS before -> peak -> after each relist (MB): " + ", ".join(
        f"{r['rss_mb']:.0f} -> {r['rss_mb'] + r['peak_mb']:.0f} -> {r['after_mb']:.0f}" for r in runs), flush=True)
    names = sorted({n for r in runs for n in (*r["stalled"], *r["steps"])})
    for name in names:
        stalled_ms = statistics.median(r["stalled"].get(name, 0.0) for r in runs) * ms
        longest_ms = statistics.median(r["longest"].get(name, 0.0) for r in runs) * ms
        step_ms = statistics.median(r["steps"].get(name, 0.0) for r in runs) * ms
        print(f"      {name:40} step {step_ms:8.1f} ms  loop stalled {stalled_ms:8.1f} ms  "
              f"longest {longest_ms:8.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relist_stall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10k,100k,1M")
    parser.add_argument("--kinds", default="poll,upstream")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    cases = {"poll": poll_case, "upstream": upstream_case}

    async def run() -> None:
        print(f"one relist of a source changed by one entry; medians of {options.rounds} (ms; stall = a 1 ms "
              f"sleep's gap over {STALL * 1000:g} ms)")
        for kind in options.kinds.split(","):
            for size in map(_size, options.sizes.split(",")):
                report(kind, size, await cases[kind](size, options.rounds))

    anyio.run(run)


if __name__ == "__main__":
    main()
