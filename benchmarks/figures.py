"""One run's figures for one peer, catalog size and wire, and how repeated runs combine."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Figures:
    """What one run measured. Times in seconds, latencies in ms, memory in MB; NaN where not measured.

    ready_s: spawn to the first successful resources/list answer; listing_s: every page of resources/list,
    following next_cursor to the end (`listed` resources in `pages` pages); first_page_ms / middle_page_ms: the
    median latency of one resources/list request for the first page and for the page halfway through the
    catalog (its cursor taken from the full listing); reads_per_s / p50_ms / p99_ms:
    sequential resources/read of a warm set; concurrent_reads_per_s: the same reads 32 in flight;
    peak_rss_mb: the server's VmHWM at the end of the run; server_cpu_ms: the server process's CPU time (user +
    system) per read during the 32-in-flight phase, so 1000 / server_cpu_ms is what one core could serve;
    listing_cpu_s: the server's CPU time during the full listing (the rest of listing_s is the client and the pipe);
    `reads`: sequential reads actually made (fewer than asked when the phase hit its time budget). `error` is
    set (and figures NaN) when the run failed.
    """

    peer: str
    size: int
    mode: str
    ready_s: float = math.nan
    listing_s: float = math.nan
    listed: int = 0
    pages: int = 0
    first_page_ms: float = math.nan
    middle_page_ms: float = math.nan
    reads_per_s: float = math.nan
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    concurrent_reads_per_s: float = math.nan
    peak_rss_mb: float = math.nan
    server_cpu_ms: float = math.nan
    listing_cpu_s: float = math.nan
    reads: int = 0
    error: str = ""


TIMED = ("ready_s", "listing_s", "first_page_ms", "middle_page_ms", "reads_per_s", "p50_ms", "p99_ms",
         "concurrent_reads_per_s", "server_cpu_ms", "listing_cpu_s")


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1) of an ascending list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def combine(runs: list[Figures]) -> Figures:
    """Repeated runs of one peer/size/wire as one: each timed figure's median, the largest peak RSS.

    Failed runs are left out; if every run failed, the first failure is returned.
    """
    good = [r for r in runs if not r.error]
    if not good:
        return runs[0]
    merged = {name: statistics.median(getattr(r, name) for r in good) for name in TIMED}
    return replace(good[0], **merged, peak_rss_mb=max(r.peak_rss_mb for r in good), reads=min(r.reads for r in good))
