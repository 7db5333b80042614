"""Micro-benchmark (issue 26): what one watched-folder change costs the server, step by step, at a catalog size.

`python -m benchmarks.change_costs 10000 100000` serves the scale corpora (`python -m benchmarks.scale` or
`scale_corpus.corpus(N)` makes them under ~/.cache/aggregator-bench) in process, one collection `**/*.md` with
`index: true`, one URI subscribed, and times (median of runs, ms) what the live path runs for one change:
- one file added: `CatalogUpdates.files_changed` (invalidate, `uris_for`, stat, `apply_files`, swap) and its parts
  `uris_for` alone and the search indexer's next pass (every other file known to the index, as a kept index file);
- an editor's temporary file that came and went (never listed);
- stat of 100 changed paths (`stat_paths`);
- a folder of 10,000 files moved into the folder and out again (`files_changed` naming the folder, as a watcher does);
- the manifest saved with one more resource (`ResourceService.reload`, guarded, the folder watched: what a save costs
  the server from the file read to the swap; `--save` times this alone, beside one file added);
- a metadata search (`MetadataSearch`) of the catalog after one file added (its table built on the last one's)
  beside the first search (the table built whole); `--search` times these alone.
The files it adds are journaled (`scale_corpus.Journal`) and removed after; the moved folder is kept beside the
corpora (`moved-10000/`) for the next run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from aggregator.catalog_delta import stat_paths
from aggregator.live.updates import CatalogUpdates
from aggregator.manifest.model import SearchSettings
from aggregator.notify import Notifier
from aggregator.search_indexer import Indexer
from aggregator.search_meta import MetadataSearch
from aggregator.search_query import query_terms
from aggregator.service import ResourceService
from aggregator.watch import Change
from benchmarks.scale_corpus import CACHE, Journal, body, corpus
from benchmarks.workload import relative_path

MOVED = 10_000
RUNS = 7


def _moved_folder(base: Path) -> Path:
    """A folder of MOVED files (100 a folder) beside the corpora, on their file system (a rename moves it)."""
    folder = base / f"moved-{MOVED}"
    if not folder.exists():
        building = base / f"moved-{MOVED}.partial"
        for i in range(MOVED):
            path = building / f"m{i // 100:03}" / f"g{i % 100:02}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body(i))
        building.rename(folder)
    return folder


async def _ms(step: Callable[[], Awaitable[object]], runs: int = RUNS,
              between: Callable[[], Awaitable[object]] | None = None) -> float:
    """The median of `runs` timings (ms) of `step`, with `between` (untimed) after each."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await step()
        times.append((time.perf_counter() - started) * 1000)
        if between is not None:
            await between()
    return statistics.median(times)


async def _one(files: int, only: str = "") -> dict[str, float]:
    root = corpus(files)
    journal = Journal(root)
    moved = _moved_folder(CACHE)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "manifest.yaml"
        manifest.write_text(f"version: 1\nserver: {{name: change-costs}}\nsources:\n  files: {{url: {root}}}\n"
                            'collections:\n  - {source: files, glob: "**/*.md", uri: "bench://{path}", index: true}\n')
        service = await ResourceService.open(manifest)
        try:
            if only == "--search":
                return await _searches(service, journal)
            return await (_saves(service, journal) if only == "--save" else _measure(service, root, journal, moved))
        finally:
            journal.repair()
            if (root / "moved").exists():
                (root / "moved").rename(moved)
            await service.aclose()


async def _measure(service: ResourceService, root: Path, journal: Journal, moved: Path) -> dict[str, float]:
    notifier = Notifier()
    notifier._listens[object()] = frozenset({"bench://" + relative_path(0)})  # one subscriber: uris_for runs
    updates = CatalogUpdates(service, notifier)
    indexer = Indexer(service, SearchSettings(index_bytes=1 << 40))
    await indexer._open()
    indexer._known = {e.uri: (f"{e.mtime}:{e.size}", e.size or 0) for e in service.catalog.entries}
    await indexer.index_once()  # settled: every listed file known, as from a kept index file
    folder = relative_path(0).rsplit("/", 1)[0]
    counter = iter(range(1_000_000))
    figures: dict[str, float] = {}
    added: list[str] = []

    async def add() -> None:
        path = f"{folder}/added-{next(counter)}.md"
        journal.touch(path).write_text("# added\n")
        added.append(path)
        await updates.files_changed("files", {(Change.added, path)})

    async def remove_added() -> None:
        path = added.pop()
        (root / path).unlink()
        await updates.files_changed("files", {(Change.deleted, path)})

    figures["one file added: files_changed"] = await _ms(add, between=remove_added)

    async def uris_for() -> None:
        service.uris_for("files", {relative_path(5)}, notifier.subscribed_uris())

    figures["uris_for one path"] = await _ms(uris_for)

    async def index_pass() -> None:
        await indexer.index_once()

    async def add_untimed() -> None:
        await add()

    await add_untimed()
    figures["search index pass after one added"] = await _ms(index_pass, between=add_untimed)

    async def temporary() -> None:
        path = f"{folder}/.f000.md.swp"
        journal.touch(path).write_text("x")
        await updates.files_changed("files", {(Change.added, path)})
        (root / path).unlink()
        await updates.files_changed("files", {(Change.deleted, path)})

    figures["editor's temporary file came and went"] = await _ms(temporary)
    some = [relative_path(i) for i in range(0, 100 * 97, 97)]
    src = service.sources["files"]
    figures["stat of 100 paths"] = await _ms(lambda: stat_paths(src, some))

    async def move_in() -> None:
        os.rename(moved, root / "moved")
        await updates.files_changed("files", {(Change.added, "moved")})

    async def move_out() -> None:
        os.rename(root / "moved", moved)
        await updates.files_changed("files", {(Change.deleted, "moved")})

    ins, outs = [], []
    for _ in range(3):
        ins.append(await _ms(move_in, 1))
        outs.append(await _ms(move_out, 1))
    figures[f"folder of {MOVED:,} moved in"] = statistics.median(ins)
    figures[f"folder of {MOVED:,} moved out"] = statistics.median(outs)
    figures["full relists"] = updates.full_relists
    return {**figures, **await _saves(service, journal), **await _searches(service, journal)}


async def _saves(service: ResourceService, journal: Journal) -> dict[str, float]:
    """A save adding one resource, timed from reading the manifest to the swap (the folder watched, so its
    collection is kept), beside one file added (the peer: a change of one entry) in the same run."""
    manifest = Path(service.manifest.path)
    text, counter = manifest.read_text(), iter(range(1_000_000))
    updates = CatalogUpdates(service, Notifier())
    added = relative_path(0).rsplit("/", 1)[0] + "/added-save.md"

    async def save() -> None:
        n = next(counter)
        resources = "".join(f'  - {{uri: "note://marker-{i}", name: "m{i}", text: "{i}"}}\n' for i in range(n + 1))
        manifest.write_text(f"{text}resources:\n{resources}")
        await service.reload(watched={"files"}, guard=True)

    async def add() -> None:
        journal.touch(added).write_text("# added\n")
        await updates.files_changed("files", {(Change.added, added)})

    async def remove() -> None:
        (journal.root / added).unlink()
        await updates.files_changed("files", {(Change.deleted, added)})

    return {"manifest saved, one resource added: reload": await _ms(save, RUNS * 2),
            "peer: one file added (files_changed)": await _ms(add, RUNS * 2, between=remove)}


async def _searches(service: ResourceService, journal: Journal) -> dict[str, float]:
    """The first metadata search of the catalog (its table built whole), then one after each file added (the table
    built on the last one's: the blocks the change touched)."""
    search, terms = MetadataSearch(), query_terms("document md")
    updates = CatalogUpdates(service, Notifier())
    counter = iter(range(1_000_000))
    folder = relative_path(0).rsplit("/", 1)[0]

    async def first() -> None:
        await MetadataSearch().search(service.catalog, terms, None, "", 10)

    async def searched() -> None:
        await search.search(service.catalog, terms, None, "", 10)

    async def add() -> None:
        path = f"{folder}/added-search-{next(counter)}.md"
        journal.touch(path).write_text("# added\n")
        await updates.files_changed("files", {(Change.added, path)})

    await searched()
    await add()
    return {"metadata search after one file added": await _ms(searched, RUNS, between=add),
            "peer: the same search, nothing changed": await _ms(searched, RUNS),
            "peer: first metadata search (table built whole)": await _ms(first, 3)}


def main(argv: list[str]) -> None:
    only = next((a for a in argv if a.startswith("--")), "")
    sizes = [int(a) for a in argv if not a.startswith("--")] or [10_000, 100_000]
    results = {size: anyio.run(_one, size, only) for size in sizes}
    names = list(next(iter(results.values())))
    print(f"{'per change (ms, median)':<42}" + "".join(f"{size:>12,}" for size in sizes))
    for name in names:
        print(f"{name:<42}" + "".join(f"{results[size][name]:>12.1f}" for size in sizes))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main(sys.argv[1:])
