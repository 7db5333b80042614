"""The scale benchmark's live phases, on one aggregator over stdio (legacy wire, raw client) serving a corpus:
a file added -> `list_changed`, the manifest saved -> `list_changed`, then churn (adds, edits and deletes at a
steady rate while reads go on) and whether the final listing equals a fresh walk of the folder.

Every file it touches goes through the corpus journal first (`scale_corpus.Journal`), and is put back after.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from benchmarks.figures import percentile
from benchmarks.live import manifest_text, save
from benchmarks.peers import Launch
from benchmarks.rss import cpu_seconds, peak_rss_mb
from benchmarks.scale_corpus import Journal, body, walk_uris
from benchmarks.stdio_rpc import RawClient, RpcError
from benchmarks.workload import relative_path, uri_of

LIST_CHANGED = "notifications/resources/list_changed"
TIMEOUT_S = 180  # a change at 1,000,000 files on main relists the whole folder: tens of seconds, or never
READ_RATE = 100  # reads a second during churn, one at a time
READ_SET = 200  # files read during churn, never touched by it


@dataclass
class Churn:
    """What churn did and what it cost: `changes` by kind over `seconds`; `notifications` list_changed received from
    its start until the server went quiet; server CPU (cores) over the churn window, and the bookkeeping's share of
    churn plus catch-up (reads' estimated CPU taken out) per churn second; reads made during churn and their p50 /
    p99 / max (ms) and failures; `catch_up_s` from the last change to the last list_changed; whether the final listing
    equals a fresh walk (`missing` and `extra` URIs otherwise)."""

    seconds: float = 0.0
    changes: dict[str, int] = field(default_factory=dict)
    notifications: int = 0
    cores_during: float = float("nan")
    bookkeeping_cores: float = float("nan")
    reads: int = 0
    read_p50_ms: float = float("nan")
    read_p99_ms: float = float("nan")
    read_max_ms: float = float("nan")
    read_failures: int = 0
    catch_up_s: float = float("nan")
    listing_equal: bool = False
    missing: int = 0
    extra: int = 0


@dataclass
class Live:
    """Latencies (ms) of each round of a file added and of a manifest saved until list_changed; the churn; the live
    server's peak RSS (MB) at the end; what failed."""

    add_ms: list[float] = field(default_factory=list)
    save_ms: list[float] = field(default_factory=list)
    churn: Churn | None = None
    peak_rss_mb: float = float("nan")
    errors: list[str] = field(default_factory=list)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def _quiet(client: RawClient, quiet_s: float, limit_s: float = TIMEOUT_S) -> float:
    """Wait until no list_changed arrived for `quiet_s` (at most `limit_s`); the time of the last one, or NaN."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        seen = client.notifications.count(LIST_CHANGED)
        await asyncio.sleep(quiet_s)
        if client.notifications.count(LIST_CHANGED) == seen:
            break
    times = client.notifications.times.get(LIST_CHANGED)
    return times[-1] if times else float("nan")


async def _change_rounds(client: RawClient, rounds: int, change: Callable[[int], None], latencies: list[float]) -> None:
    """`rounds` times: make one change (`change(round)`), time it to the next list_changed (ms, into `latencies`),
    then let the server go quiet for half that long (a late second notification does not count for the next
    round)."""
    for r in range(rounds):
        before = client.notifications.count(LIST_CHANGED)
        started = time.perf_counter()
        change(r)
        arrived = await client.wait_for(LIST_CHANGED, before + 1, TIMEOUT_S)
        latencies.append((arrived - started) * 1000)
        await _quiet(client, max(0.3, latencies[-1] / 2000))


def last_error(log: str) -> str:
    """The last ERROR line the server logged (its message, cut short), or ''."""
    try:
        lines = [line for line in Path(log).read_text(errors="replace").splitlines() if " ERROR " in line
                 or line.startswith(("aggregator.", "TimeoutError", "OSError"))]
    except OSError:
        return ""
    return lines[-1].split(" ERROR ", 1)[-1][:300] if lines else ""


async def run(launch_of: Callable[[Path], Launch], root: Path, manifest: Path, count: int, rounds: int, churn_s: float,
              churn_rate: int, cpu_per_read_s: float, errlog: IO[str]) -> Live:
    """The live phases on one fresh aggregator serving `manifest` (over `root`, `count` files); `launch_of(manifest)`
    gives its command. A phase that fails (no list_changed in time) is recorded in `errors` with the server's last
    logged error, and the next phase runs. The corpus is repaired afterwards, whatever happened."""
    journal = Journal(root)
    live = Live()
    save(manifest, manifest_text(root, 0, settle=None))
    client = await RawClient.spawn(launch_of(manifest), errlog)
    rng = random.Random(26)
    added = [relative_path(rng.randrange(count)).rsplit("/", 1)[0] + f"/added-{r}.md" for r in range(rounds)]

    async def deleted() -> None:  # the added files gone again in one batch, before the next phase
        before = client.notifications.count(LIST_CHANGED)
        for path in added:
            (root / path).unlink(missing_ok=True)
        await client.wait_for(LIST_CHANGED, before + 1, TIMEOUT_S)

    async def churned() -> None:
        quiet_s = max(2.0, 2 * statistics.median(live.add_ms or [TIMEOUT_S * 1000]) / 1000)
        live.churn = await churn(client, journal, count, churn_s, churn_rate, cpu_per_read_s, quiet_s)

    phases = {
        "file added": lambda: _change_rounds(client, rounds, lambda r: _write(journal.touch(added[r]), body(r)),
                                             live.add_ms),
        "added files deleted": deleted,
        "manifest saved": lambda: _change_rounds(
            client, rounds, lambda r: save(manifest, manifest_text(root, r + 1, settle=None)), live.save_ms),
        **({"churn": churned} if churn_s > 0 else {}),
    }
    try:
        await client.initialize()
        await client.request("resources/list")
        await _quiet(client, 0.5)
        for name, phase in phases.items():
            try:
                await phase()
            except (TimeoutError, ConnectionError, RpcError) as exc:
                logged = last_error(errlog.name)
                live.errors.append(f"{name}: {exc}" + (f" (the server logged: {logged})" if logged else ""))
        live.peak_rss_mb = peak_rss_mb(client.pid)
    finally:
        await client.close()
        journal.repair()
    return live


async def churn(client: RawClient, journal: Journal, count: int, seconds: float, rate: int, cpu_per_read_s: float,
                quiet_s: float) -> Churn:
    """Adds, edits and deletes in turn, `rate` a second for `seconds`, while one read at a time goes on READ_RATE
    times a second over files churn never touches; then wait for the server to go quiet and compare its listing
    with a fresh walk."""
    rng = random.Random(100)
    read_set = rng.sample(range(count), min(READ_SET, count // 10))
    untouchable = set(read_set)
    changes = {"add": 0, "edit": 0, "delete": 0}
    figures = Churn(seconds=seconds, changes=changes)
    latencies: list[float] = []
    failures = 0
    stop = asyncio.Event()

    async def reader() -> None:
        nonlocal failures
        n, start = 0, time.perf_counter()
        while not stop.is_set():
            i = read_set[n % len(read_set)]
            t = time.perf_counter()
            try:
                text = await client.read_text(uri_of(i))
                latencies.append(time.perf_counter() - t)
                failures += text != body(i)
            except Exception:  # noqa: BLE001 - a failed read is a figure here
                failures += 1
            n += 1
            await asyncio.sleep(max(0.0, start + n / READ_RATE - time.perf_counter()))

    def change(n: int) -> None:
        kind = ("add", "edit", "delete")[n % 3]
        if kind == "add" or len(untouchable) > count * 0.9:  # a long churn of a small folder: adds only, at last
            kind = "add"
            relative = relative_path(rng.randrange(count)).rsplit("/", 1)[0] + f"/churn-{n:07}.md"
            _write(journal.touch(relative), body(n))
        else:
            i = rng.randrange(count)
            while i in untouchable:
                i = rng.randrange(count)
            untouchable.add(i)  # each corpus file changes once: an edit never lands on a deleted file
            path = journal.touch(relative_path(i))
            if kind == "edit":
                _write(path, body(i) + f"\nedited by churn change {n}\n")
            else:
                path.unlink()
        changes[kind] += 1

    notified_before = client.notifications.count(LIST_CHANGED)
    cpu_start = cpu_seconds([client.pid])
    reading = asyncio.create_task(reader())
    started = time.perf_counter()
    total = int(seconds * rate)
    for n in range(total):
        await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
        change(n)
    last_change = time.perf_counter()
    stop.set()
    await reading
    cpu_end = cpu_seconds([client.pid])
    figures.cores_during = (cpu_end - cpu_start) / (last_change - started)
    last_notice = await _quiet(client, quiet_s)
    cpu_quiet = cpu_seconds([client.pid])
    figures.notifications = client.notifications.count(LIST_CHANGED) - notified_before
    figures.catch_up_s = max(0.0, last_notice - last_change) if figures.notifications else float("nan")
    reads_cpu = len(latencies) * cpu_per_read_s
    figures.bookkeeping_cores = (cpu_quiet - cpu_start - reads_cpu) / (last_change - started)
    latencies.sort()
    figures.reads, figures.read_failures = len(latencies), failures
    if latencies:
        figures.read_p50_ms = percentile(latencies, 0.5) * 1000
        figures.read_p99_ms = percentile(latencies, 0.99) * 1000
        figures.read_max_ms = latencies[-1] * 1000
    listed = {uri for uri in await client.list_all() if uri.startswith("bench://")}
    walked = walk_uris(journal.root)
    figures.listing_equal = listed == walked
    figures.missing, figures.extra = len(walked - listed), len(listed - walked)
    return figures

