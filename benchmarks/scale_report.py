"""The scale benchmark's section of docs/benchmarks.md: per size, aggregator beside the stdlib floor with ratios and
issue 26's targets (reported, never asserted), the live latencies, churn, and where memory goes when profiled."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aggregator.watch import DEBOUNCE_MS

from benchmarks.sections import SCALE, SCALE_BASELINE

if TYPE_CHECKING:
    from benchmarks.scale import SizeResult, Static
    from benchmarks.scale_live import Churn

SUBJECT, FLOOR = "aggregator", "floor-stdlib"
# Issue 26's targets at 1,000,000 files; the table shows the verdict at every size.
READY_VS_FLOOR = 1.5
RSS_VS_FLOOR = 1.2
LISTING_VS_FLOOR = 1.5
READS_VS_SMALLEST = 0.9
ADD_BEYOND_SETTLE_MS = 300
SAVE_MS = 1000
CHURN_CORES = 0.5
CHURN_READ_P99_MS = 50


PAGE_CACHE_TEXT = {
    "held": "Before each server's cold reads their files are read once into the OS page cache, for both peers "
            "and every size alike (so no peer pays the disk for the other, and a large catalog is not read from "
            "the disk where a small one is read from memory).",
    "dropped": "Before each server's cold reads their files are dropped from the OS page cache (posix_fadvise "
               "DONTNEED), for both peers and every size alike: cold reads go to the disk."}


def verdict(ok: bool | None, bound: str) -> str:
    """`pass`/`FAIL` with the bound, or '' when there is nothing to judge."""
    return "" if ok is None else f"{'pass' if ok else 'FAIL'} ({bound})"


def _ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def static_rows(result: SizeResult, smallest: SizeResult, bases: dict[str, float]) -> list[str]:
    """One row per figure at one size: aggregator, the floor, their ratio and the target's verdict."""
    size, small = result.size, smallest.static
    if SUBJECT not in result.static or FLOOR not in result.static:
        return [f"| {size:,} | every round of {', '.join(p for p in (SUBJECT, FLOOR) if p not in result.static)} "
                f"failed: {'; '.join(result.errors)[:400]} | | | | |"]
    agg, floor = result.static[SUBJECT], result.static[FLOOR]

    def per_entry(peer: str, s: Static) -> float:
        return (s.peak_rss_mb - bases[peer]) * 2**20 / size

    def reads(phase: Any) -> str:
        return f"{phase.reads_per_s:,.0f} ({phase.p50_ms:.1f} / {phase.p99_ms:.1f})"

    def scaled(pick: Callable[[Static], Any]) -> tuple[float, float]:
        return (_ratio(pick(agg).reads_per_s, pick(small[SUBJECT]).reads_per_s),
                _ratio(pick(floor).reads_per_s, pick(small[FLOOR]).reads_per_s))

    rows: list[tuple[str, str, str, float, str]] = []

    def row(name: str, a: str, f: str, ratio: float, target: str = "") -> None:
        rows.append((name, a, f, ratio, target))

    ready = _ratio(agg.ready_s, floor.ready_s)
    row("ready (s)", f"{agg.ready_s:.2f}", f"{floor.ready_s:.2f}", ready,
        verdict(ready <= READY_VS_FLOOR, f"<= {READY_VS_FLOOR}x floor"))
    listing = _ratio(agg.listing_s, floor.listing_s)
    row(f"full listing (s; {agg.listed:,} / {floor.listed:,} listed)", f"{agg.listing_s:.2f}",
        f"{floor.listing_s:.2f}", listing, verdict(listing <= LISTING_VS_FLOOR, f"<= {LISTING_VS_FLOOR}x floor"))
    row("server CPU in the full listing (s)", f"{agg.listing_cpu_s:.2f}", f"{floor.listing_cpu_s:.2f}",
        _ratio(agg.listing_cpu_s, floor.listing_cpu_s))
    rss = _ratio(agg.peak_rss_mb, floor.peak_rss_mb)
    row("peak RSS (MB)", f"{agg.peak_rss_mb:,.0f}", f"{floor.peak_rss_mb:,.0f}", rss,
        verdict(rss <= RSS_VS_FLOOR, f"<= {RSS_VS_FLOOR}x floor"))
    a_entry, f_entry = per_entry(SUBJECT, agg), per_entry(FLOOR, floor)
    row(f"bytes per listed entry (peak RSS above a {BASE_LABEL} catalog's)", f"{a_entry:,.0f}", f"{f_entry:,.0f}",
        _ratio(a_entry, f_entry))
    for label, pick in (("cold", lambda s: s.cold), ("warm", lambda s: s.warm)):
        row(f"{label} reads/s, 16 in flight (p50 / p99 ms)", reads(pick(agg)), reads(pick(floor)),
            _ratio(pick(agg).reads_per_s, pick(floor).reads_per_s))
        if result is not smallest and SUBJECT in small and FLOOR in small:
            mine, theirs = scaled(pick)
            row(f"{label} reads/s vs the same at {smallest.size:,}", f"{mine:.2f}x", f"{theirs:.2f}x", math.nan,
                verdict(mine >= READS_VS_SMALLEST, f">= {READS_VS_SMALLEST}x"))
    return [f"| {size:,} | {name} | {a} | {f} | {'' if math.isnan(r) else f'{r:.2f}x'} | {t} |"
            for name, a, f, r, t in rows]


BASE_LABEL = "100-file"


def _latencies(values: list[float], bound: int, limit: int) -> str:
    """`p50 / max` of a live phase's latencies with the verdict of `p50 - bound <= limit`, or `failed`."""
    if not values:
        return "failed (below)"
    p50 = statistics.median(values)
    return f"{p50:,.0f} / {max(values):,.0f} {verdict(p50 - bound <= limit, f'<= {limit:,}' + (f' + {bound}' if bound else ''))}"


def live_rows(results: list[SizeResult]) -> list[str]:
    """Per size: a file added and the manifest saved, to list_changed."""
    return [f"| {r.size:,} | {_latencies(r.live.add_ms, DEBOUNCE_MS, ADD_BEYOND_SETTLE_MS)} | "
            f"{_latencies(r.live.save_ms, 0, SAVE_MS)} | {len(r.live.add_ms)} / {len(r.live.save_ms)} | "
            f"{r.live.peak_rss_mb:,.0f} |" for r in results if r.live is not None]


def live_errors(results: list[SizeResult]) -> list[str]:
    """One line per live phase that failed."""
    return [f"- {r.size:,} files, {error}" for r in results if r.live for error in r.live.errors]


def churn_rows(results: list[SizeResult]) -> list[str]:
    """Per size: what churn did, what it cost, and whether the listing came out right."""
    out = []
    for result in results:
        churn = result.live.churn if result.live else None
        if churn is None:
            continue
        made = sum(churn.changes.values())
        kinds = " / ".join(f"{churn.changes[k]:,}" for k in ("add", "edit", "delete"))
        listing = ("equal" if churn.listing_equal else f"differs: {churn.missing:,} missing, {churn.extra:,} extra")
        out.append(
            f"| {result.size:,} | {made:,} ({kinds}) in {churn.seconds:.0f} s | {churn.notifications:,} "
            f"({churn.notifications / churn.seconds:.1f}/s) "
            f"{verdict(churn.notifications <= _windows(churn), f'<= 1 per {DEBOUNCE_MS} ms settle window')} | "
            f"{churn.cores_during:.2f} | "
            f"{churn.bookkeeping_cores:.2f} {verdict(churn.bookkeeping_cores < CHURN_CORES, f'< {CHURN_CORES}')} | "
            f"{churn.reads:,}: {churn.read_p50_ms:.1f} / {churn.read_p99_ms:.1f} / {churn.read_max_ms:,.0f}, "
            f"{churn.read_failures} failed "
            f"{verdict(churn.read_p99_ms <= CHURN_READ_P99_MS and not churn.read_failures, f'p99 <= {CHURN_READ_P99_MS}')}"
            f" | {churn.catch_up_s:.1f} | {listing} {verdict(churn.listing_equal, 'equal')} |")
    return out


def _windows(churn: Churn) -> int:
    """Settle windows from churn's start to its last list_changed: coalesced, clients hear at most one in each."""
    catch_up = 0.0 if math.isnan(churn.catch_up_s) else churn.catch_up_s
    return int((churn.seconds + catch_up) * 1000 / DEBOUNCE_MS) + 1


def profile_lines(profile: dict[str, Any]) -> list[str]:
    """Where aggregator's Python memory goes at one size, by source line (tracemalloc)."""
    size = int(profile["size"])
    total, peak = float(profile["total"]), float(profile["peak"])
    rows = [f"| `{where}` | `{code.replace('|', '/')}` | {b / 2**20:,.1f} | {b / size:,.0f} | {blocks / size:,.1f} |"
            for where, b, blocks, code in profile["lines"]]
    by_file = ", ".join(f"`{where}` {b / 2**20:,.0f}" for where, b, _ in profile["files"][:8])
    return [
        f"Where aggregator's memory goes at {size:,} files (`--profile-memory {size}`): tracemalloc (one frame a "
        f"block) over the server after ready and a full listing holds {total / 2**20:,.0f} MB of live Python "
        f"allocations ({total / size:,.0f} bytes a listed entry, imports included); the traced peak was "
        f"{peak / 2**20:,.0f} MB ({peak / size:,.0f} bytes an entry), so {(peak - total) / 2**20:,.0f} MB were "
        f"transient. The traced process's peak RSS was {float(profile['traced_peak_rss_mb']):,.0f} MB, tracing "
        f"included. MB by file: {by_file}.", "",
        "| allocated at | code | MB | bytes per entry | blocks per entry |", "|---|---|---|---|---|", *rows, ""]


def table(intro: str, header: str, rows: list[str]) -> list[str]:
    """A paragraph, then a Markdown table with `header` (its `|`-separated cells) over `rows`."""
    return ["", intro, "", header, "|" + "---|" * (header.count("|") - 1), *rows]


def section(results: list[SizeResult], bases: dict[str, float], profile: dict[str, Any] | None,
            options: argparse.Namespace, command: str, machine: str, started: float, load_end: float) -> str:
    """The whole section."""
    smallest = min(results, key=lambda r: r.size)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    minutes = (time.time() - started) / 60
    heading = SCALE_BASELINE if options.baseline else SCALE
    lines = [
        heading, "",
        f"Run {when} with `{command}` on {machine}; load average {load_end:.2f} at the end, {minutes:.0f} min "
        "in all.", "",
        "One local folder source, one collection `**/*.md`, files of about 2 KB, 100 a folder (`scale_corpus`, "
        "kept under `~/.cache/aggregator-bench/`), served over stdio on the legacy wire and driven by a raw "
        "JSON-RPC client (`stdio_rpc`: the official client's validation of every listed resource would be most of "
        "a full listing at 1,000,000). **floor** = `floor-stdlib`, a stdlib-only JSON-RPC loop over stdio that "
        "walks the same folder once (one stat a file, for the listed `size`), lists it in pages of 500 and opens "
        "the file on every read. Per size, "
        f"{options.rounds} round(s) each start one fresh aggregator and one fresh floor, taking turns (order "
        "alternating): ready = spawn to the first `resources/list` answer; the full listing follows `nextCursor` "
        f"to the end; then {options.reads:,} **cold** reads (distinct random files, the same for both peers in a "
        f"round, each the server's first read of it) and the same files again (**warm**), {options.in_flight} in "
        "flight on the one pipe; peak RSS is `VmHWM`. Medians over rounds, peak RSS the largest; bytes per listed "
        f"entry is the peak RSS above each peer's own on a {BASE_LABEL} catalog, divided by the files. Reads "
        "\"vs the same at\" the run's smallest size must not fall as the catalog grows. "
        f"{PAGE_CACHE_TEXT[getattr(options, 'page_cache', 'held')]} Targets are issue 26's for 1,000,000 files; "
        "the verdict is shown at every size.", "",
        f"| files | figure | aggregator | floor | aggregator / floor | target |", "|---|---|---|---|---|---|"]
    for result in results:
        lines += static_rows(result, smallest, bases)
    failed_rounds = [f"- {r.size:,} files, {error}" for r in results for error in r.errors]
    if failed_rounds:
        lines += ["", "Failed rounds (left out of the medians):", "", *failed_rounds]
    live = live_rows(results)
    if live:
        lines += table(
            f"Live, on one aggregator per size (the same client, no subscriptions), {options.live_rounds} "
            "rounds each: a new file written into a random folder of the corpus until `list_changed`, and the "
            "manifest saved atomically (a marker resource changed) until `list_changed`, the server quiet in "
            f"between. A file change reaches the server after watchfiles' {DEBOUNCE_MS} ms debounce (the settle "
            "time the target adds to its 300 ms); a save includes the default 500 ms `reloadSettle`.",
            "| files | file added -> list_changed, p50 / max (ms) | manifest saved -> list_changed, p50 / max (ms) "
            "| rounds (added / saved) | live server's peak RSS at the end (MB) |", live)
        failed = live_errors(results)
        if failed:
            lines += ["", "Failed live phases:", "", *failed]
    churn = churn_rows(results)
    if churn:
        lines += table(
            f"Churn, on the same server: {options.churn_rate} file changes a second (an add, an edit, a delete "
            "in turn; edits and deletes of corpus files, each at most once) while one read at a time goes on 100 "
            "times a second over 200 files churn never touches; then the server is left until no `list_changed` "
            "came for twice a file add's latency (at least 2 s), and its full listing is compared with a fresh "
            "walk of the folder. Server CPU during churn is its CPU time over the churn's seconds; the "
            "bookkeeping is its CPU from churn's start until it went quiet, less the reads' share (reads x the "
            "server's CPU per warm read above), per churn second. Catch-up = the last `list_changed` after the "
            f"last change. Coalesced: at most one `list_changed` per {DEBOUNCE_MS} ms settle window (watchfiles' "
            "debounce) from churn's start to the last one.",
            "| files | changes (adds / edits / deletes) | list_changed received | server CPU during churn (cores) "
            "| bookkeeping (cores) | reads during churn: p50 / p99 / max (ms) | catch-up (s) | final listing vs a fresh "
            "walk |", churn)
    if profile:
        lines += ["", *profile_lines(profile)]
    lines += ["", "Other helpers' work loads this 2-core machine while it runs: compare the ratios within one run, "
              "not absolute figures across runs."]
    return "\n".join(lines) + "\n"
