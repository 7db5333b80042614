"""Where a compiled catalog's memory goes, per listed entry: `python -m benchmarks.catalog_census MANIFEST [--trace]`.

Compiles the manifest's catalog in this process (the server's imports done first) and prints: the compile's wall and
CPU time; the process's RSS growth and peak growth over the compile divided by the entries; with `--trace`, the
traced (tracemalloc) live and peak bytes an entry and the source lines holding most; and a census of what the
catalog keeps (each object counted once): the URI list, the URI strings, the column arrays, the explicit entries and
what they point to that no other entry shares. Entries built again for a page are not kept, so not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterable
from typing import Any


def _rss_mb() -> dict[str, float]:
    with open("/proc/self/status") as status:
        return {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in status)
                if k in ("VmRSS", "VmHWM")}


def census(catalog: Any) -> dict[str, int]:
    """Bytes the catalog's entries keep, by kind (objects shared by many entries, like a collection's Display or
    an interned type name, counted once)."""
    seen: set[int] = set()
    out: dict[str, int] = {}

    def add(kind: str, objects: Iterable[object]) -> None:
        for o in objects:
            if o is not None and id(o) not in seen:
                seen.add(id(o))
                out[kind] = out.get(kind, 0) + sys.getsizeof(o)

    rows = catalog.entries
    add("URI list (catalog._uris)", [catalog._uris])
    add("URI strings", catalog._uris)
    for name in ("_which", "_sizes", "_mtimes"):
        if hasattr(rows, name):
            add(f"column {name[1:]}", [getattr(rows, name)])
    explicit = rows.explicit.values() if hasattr(rows, "explicit") else rows
    add("entry objects kept (explicit rows)", explicit)
    for field in ("name", "path", "title", "mime_type", "size", "mtime"):
        add(f"explicit entries' {field}", (getattr(e, field) for e in explicit))
    if not hasattr(rows, "uris"):  # entries kept as a tuple of Entry (before catalog_rows)
        add("entry container", [rows])
    add("collections' containers", [c for c in catalog.collections.values() if isinstance(c, (list, tuple))])
    return out


async def _compile(path: str, trace: bool) -> None:
    from aggregator.compiler import compile_catalog
    from aggregator.manifest import load_manifest
    from aggregator.reload import open_sources
    import aggregator.cli  # noqa: F401 - the server's own imports, so they are not counted as the catalog's
    import aggregator.server  # noqa: F401

    manifest = load_manifest(path)
    sources = open_sources(manifest)
    gc.collect()
    gc.disable()  # as `serve` does while it starts
    before = _rss_mb()
    if trace:
        tracemalloc.start(1)
    wall, cpu = time.perf_counter(), time.process_time()
    catalog = await compile_catalog(manifest, sources)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = _rss_mb()
    n = max(1, len(catalog))
    print(f"{len(catalog):,} entries compiled in {wall:.2f} s ({cpu:.2f} s CPU); RSS {before['VmRSS']:.0f} -> "
          f"{after['VmRSS']:.0f} MB: {(after['VmRSS'] - before['VmRSS']) * 2**20 / n:.0f} B an entry kept, "
          f"{(after['VmHWM'] - before['VmRSS']) * 2**20 / n:.0f} B at the peak")
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        print(f"traced: {current / n:.0f} B an entry live, {peak / n:.0f} B at the traced peak")
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:8]:
            frame = stat.traceback[0]
            print(f"  {stat.size / n:7.1f} B  {stat.count / n:5.2f} blocks an entry  "
                  f"{frame.filename.rsplit('/aggregator/', 1)[-1]}:{frame.lineno}")
        tracemalloc.stop()
    kept = census(catalog)
    print("what the catalog keeps (B an entry):")
    for kind, size in sorted(kept.items(), key=lambda kv: -kv[1]):
        print(f"  {size / n:7.1f}  {kind}")
    print(f"  {sum(kept.values()) / n:7.1f}  in all")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.catalog_census", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest")
    parser.add_argument("--trace", action="store_true", help="also trace allocations (slower; where they come from)")
    args = parser.parse_args(argv)
    asyncio.run(_compile(args.manifest, args.trace))


if __name__ == "__main__":
    main()
