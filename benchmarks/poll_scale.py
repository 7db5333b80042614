"""A polled remote collection at scale (issue 26), in one process: N objects in an fsspec memory filesystem (a
remote store whose listing costs only Python, so the aggregator's own work shows) beside a local folder of M files.
Each poll is driven by hand through the supervisor's `CatalogUpdates`, the way `Pollers` runs it:

- the listing alone (`Source.list`): the floor any poll pays;
- a poll as it is now (`source_polled`: the source listed, compared, applied in place) when nothing changed, when
  one object changed and when one came, and its compare-and-apply part alone;
- a poll as it was before issue 26 (`relist`: `compile_catalog` over every source, the local folder walked too).

`python -m benchmarks.poll_scale [--objects 100000] [--files 10000] [--rounds 3]` prints medians (seconds of wall
time; the process does nothing else).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import fsspec

from aggregator.catalog_delta import apply_files
from aggregator.live.relisted import listing_changes
from aggregator.live.updates import CatalogUpdates
from aggregator.notify import Notifier
from aggregator.service import ResourceService

BODY = b"# Report\n\n" + b"x" * 500 + b"\n"


async def _timed(rounds: int, step: Callable[[int], Awaitable[object]]) -> float:
    took = []
    for r in range(rounds):
        started = time.perf_counter()
        await step(r)
        took.append(time.perf_counter() - started)
    return statistics.median(took)


async def measure(objects: int, files: int, rounds: int) -> dict[str, float]:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pipe({f"/bench/d{i // 1000:03}/f{i % 1000:03}.md": BODY for i in range(objects)})
    folder = Path(tempfile.mkdtemp(prefix="poll-scale-"))
    for i in range(files):
        (folder / "docs" / f"d{i // 1000:03}").mkdir(parents=True, exist_ok=True)
        (folder / "docs" / f"d{i // 1000:03}" / f"f{i % 1000:03}.md").write_bytes(BODY)
    manifest = folder / "poll.yaml"
    manifest.write_text(f"""version: 1
server: {{name: poll-bench}}
sources:
  store: {{url: "memory://bench", poll: 1h}}
  docs: {{url: "{folder / 'docs'}"}}
collections:
  - {{source: store, glob: "**/*.md", uri: "store://{{path}}"}}
  - {{source: docs, glob: "**/*.md", uri: "docs://{{path}}"}}
""")
    service = await ResourceService.open(manifest)
    updates = CatalogUpdates(service, Notifier())
    figures: dict[str, float] = {"entries": len(service.catalog)}
    try:
        source = service.sources["store"]
        figures["listing alone (the floor)"] = await _timed(rounds, lambda r: source.list("**/*.md"))
        figures["poll, nothing changed"] = await _timed(rounds, lambda r: updates.source_polled("store"))

        async def changed(r: int) -> None:
            fs.pipe_file("/bench/d000/f001.md", BODY + b"changed" * (r + 1))
            delta = await updates.source_polled("store")
            assert delta is not None and delta.updated == {"store://d000/f001.md"} and not delta.added

        figures["poll, one object changed"] = await _timed(rounds, changed)

        async def added(r: int) -> None:
            fs.pipe_file(f"/bench/d000/added-{r}.md", BODY)
            delta = await updates.source_polled("store")
            assert delta is not None and delta.added == {f"store://d000/added-{r}.md"}

        figures["poll, one object added"] = await _timed(rounds, added)
        key = next(k for k in service.catalog.collections if k.source == "store")

        async def compared(r: int) -> None:
            fs.pipe_file("/bench/d000/f002.md", BODY + b"again" * (r + 1))
            listed = {key: await source.list("**/*.md")}
            started = time.perf_counter()
            upserted, removed = listing_changes(service.catalog, listed)
            delta = apply_files(service.catalog, service.manifest, "store", upserted, removed)
            spent.append(time.perf_counter() - started)
            assert delta.updated == {"store://d000/f002.md"}

        spent: list[float] = []
        await _timed(rounds, compared)
        figures["of which compare + apply, listing excluded"] = statistics.median(spent)
        figures["full relist per poll, as before"] = await _timed(rounds, lambda r: updates.relist())
        figures["full relists taken by the polls"] = updates.full_relists
    finally:
        await service.aclose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.poll_scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="objects in the polled store")
    parser.add_argument("--files", type=int, default=10_000, help="files in the local folder beside it")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    figures = asyncio.run(measure(options.objects, options.files, options.rounds))
    print(f"{options.objects:,} polled objects beside {options.files:,} local files, median of {options.rounds}:")
    for name, value in figures.items():
        print(f"  {name}: {value:,.3f}" if isinstance(value, float) else f"  {name}: {value:,}")


if __name__ == "__main__":
    main()
