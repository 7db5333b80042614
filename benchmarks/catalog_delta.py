"""Micro-benchmark (issue 26): one file added to a big catalog, applied incrementally vs. compiled again.

`python -m benchmarks.catalog_delta 100000 1000000` uses the scale corpora (`python -m benchmarks.scale` makes
them under ~/.cache/aggregator-bench); it writes nothing to them (the added file is a stat result it makes up).
Prints, per size: the full compile (today's relist: walk + build), the build alone over the walked files, and
`apply_files` for one added file (median of runs, and the peak of Python allocations during one): to a freshly
compiled catalog (the first change cuts its entries into chunks) and to one changed before (the steady state).
"""

from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import anyio

from aggregator.catalog_delta import apply_files
from aggregator.compiler import compile_catalog
from aggregator.manifest.load import load_manifest
from aggregator.reload import open_sources
from aggregator.sources import FileInfo

CACHE = Path.home() / ".cache" / "aggregator-bench"


def _peak(fn: object) -> tuple[float, int]:
    """(seconds, peak bytes allocated by Python) of one call."""
    tracemalloc.start()
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    took = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return took, peak


async def _one(files: int, runs: int) -> None:
    manifest = load_manifest(CACHE / f"scale-{files}-live.yaml")
    sources = open_sources(manifest)
    started = time.perf_counter()
    catalog = await compile_catalog(manifest, sources)
    full = time.perf_counter() - started
    key = next(iter(catalog.collections))
    listed = {key: catalog.collections[key]}
    started = time.perf_counter()
    await compile_catalog(manifest, sources, reuse=listed)  # the build alone: entries given, Catalog constructed
    build = time.perf_counter() - started
    catalog.paths_of(key)  # the path index, built once per full compile (C-level)
    catalog.listing_signature  # noqa: B018 (as after a swap: the signature the supervisor compares)
    added = FileInfo("zz-bench/added.md", 2048, time.time())
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        delta = apply_files(catalog, manifest, "files", [added], ())
        times.append(time.perf_counter() - started)
    assert delta.added == {"bench://zz-bench/added.md"} and len(delta.catalog) == len(catalog) + 1
    _, peak = _peak(lambda: apply_files(catalog, manifest, "files", [added], ()))
    removed = statistics.median(
        _peak(lambda: apply_files(delta.catalog, manifest, "files", (), {"zz-bench/added.md"}))[0] for _ in range(3))
    # Past the first change after a full compile (which cuts the flat entries into chunks), changes share them.
    later = FileInfo("zz-bench/later.md", 2048, time.time())
    after = [_peak(lambda: apply_files(delta.catalog, manifest, "files", [later], ()))[0] for _ in range(runs)]
    print(f"{len(catalog):>9,} entries: full compile {full:7.2f} s (build alone {build:6.2f} s); "
          f"apply_files one added {statistics.median(times) * 1000:6.1f} ms (min {min(times) * 1000:.1f}), "
          f"peak Python allocations {peak / 1e6:.1f} MB; one removed {removed * 1000:.1f} ms; "
          f"one added to a catalog already changed once {statistics.median(after) * 1000:.1f} ms")


def main(argv: list[str]) -> None:
    for files in [int(a) for a in argv] or [100_000]:
        anyio.run(_one, files, 9)


if __name__ == "__main__":
    main(sys.argv[1:])
