"""The Markdown report: per workload, the figures with ratios to the floor, aggregator's ratios to every peer and
the target verdicts; then the cost of one listing page across catalog sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.figures import Figures
from benchmarks.targets import BASELINE, SUBJECT, Target, targets_at, targets_for


@dataclass(frozen=True)
class Column:
    """A figure shown in the tables: its field, heading, number format and which way is better."""

    field: str
    heading: str
    fmt: str
    higher_is_better: bool = False


COLUMNS = [
    Column("ready_s", "ready (s)", "{:.2f}"),
    Column("listing_s", "full listing (s)", "{:.3f}"),
    Column("listing_cpu_s", "server CPU per full listing (s)", "{:.3f}"),
    Column("first_page_ms", "first page (ms)", "{:.2f}"),
    Column("middle_page_ms", "middle page (ms)", "{:.2f}"),
    Column("reads_per_s", "reads/s", "{:,.0f}", higher_is_better=True),
    Column("p50_ms", "p50 (ms)", "{:.2f}"),
    Column("p99_ms", "p99 (ms)", "{:.2f}"),
    Column("concurrent_reads_per_s", "reads/s, 32 in flight", "{:,.0f}", higher_is_better=True),
    Column("server_cpu_ms", "server CPU per read (ms)", "{:.2f}"),
    Column("peak_rss_mb", "peak RSS (MB)", "{:.0f}"),
]
LISTING_FIELDS = ("listing_s", "first_page_ms", "middle_page_ms")
RATIO_FIELDS = ("ready_s", "listing_s", "middle_page_ms", "reads_per_s", "concurrent_reads_per_s", "peak_rss_mb")


def find(results: Sequence[Figures], peer: str, size: int, mode: str) -> Figures | None:
    """The successful figures of `peer` at `size` on `mode`, if any."""
    return next((g for g in results if g.peer == peer and g.size == size and g.mode == mode and not g.error), None)


def floor_of(results: Sequence[Figures], figures: Figures) -> Figures | None:
    """The floor's figures for the same size and wire, if it ran and succeeded."""
    return find(results, BASELINE, figures.size, figures.mode)


def reference_of(results: Sequence[Figures], figures: Figures, target: Target) -> Figures | None:
    """What `target` compares `figures` with: the floor on the same size and wire, or the same peer on the same
    wire at the smallest (smaller) size of the run; None for absolute targets or when it did not run."""
    if target.against == "floor":
        return floor_of(results, figures)
    if target.against == "smallest":
        sizes = sorted(r.size for r in results if r.peer == figures.peer and r.mode == figures.mode
                       and not r.error and r.size < figures.size)
        return find(results, figures.peer, sizes[0], figures.mode) if sizes else None
    return None


def ratio(value: float, base: float | None) -> str:
    """` (1.23x)`, or '' when either side is missing."""
    if base is None or math.isnan(value) or math.isnan(base) or not base:
        return ""
    return f" ({value / base:.2f}x)"


def cell(results: Sequence[Figures], figures: Figures, column: Column) -> str:
    """`value (ratio to the floor x)` and, for aggregator where targets apply, their verdicts."""
    value = getattr(figures, column.field)
    if math.isnan(value):
        return "-"
    text = column.fmt.format(value)
    floor = floor_of(results, figures)
    if floor and figures.peer != BASELINE:
        text += ratio(value, getattr(floor, column.field))
    if figures.peer == SUBJECT:
        targets = targets_for(figures.size, column.field, figures.mode)
        for target in targets:
            reference = reference_of(results, figures, target)
            text += f" {target.verdict(figures, reference)}"
            if len(targets) > 1:  # say which is which
                text += f" ({'>=' if target.at_least else '<'} {target.threshold(reference):.3g})"
    return text


def notes(figures: Figures, reads_asked: int, listing: bool = True) -> str:
    """The last column: how many resources the listing returned in how many pages, and any read phase cut short."""
    parts = []
    if listing:
        parts.append(f"{figures.listed:,} in {figures.pages} page{'s' if figures.pages != 1 else ''}"
                     + (f" (expected {figures.size:,})" if figures.listed != figures.size else ""))
    if figures.reads < reads_asked:
        parts.append(f"{figures.reads:,} sequential reads (time budget)")
    return "; ".join(parts)


def columns_for(listing: bool) -> list[Column]:
    """Every column, or (`listing` False, for a workload that lists nothing) those that are not about listing."""
    return [c for c in COLUMNS if listing or c.field not in LISTING_FIELDS]


def workload_table(results: Sequence[Figures], size: int, reads_asked: int, listing: bool = True) -> list[str]:
    """The Markdown table of every run at `size`: one row per peer and wire."""
    columns = columns_for(listing)
    rows = [f"| peer | wire | {' | '.join(c.heading for c in columns)} | notes |",
            "|---|---|" + "---|" * len(columns) + "---|"]
    for f in (r for r in results if r.size == size):
        if f.error:
            rows.append(f"| {f.peer} | {f.mode} | failed: {f.error.replace('|', '/')} |" + " |" * len(columns))
            continue
        cells = " | ".join(cell(results, f, c) for c in columns)
        rows.append(f"| {f.peer} | {f.mode} | {cells} | {notes(f, reads_asked, listing)} |")
    return rows


def peer_ratio_table(results: Sequence[Figures], size: int, listing: bool = True) -> list[str]:
    """aggregator's figures divided by each other peer's, per wire, at `size` (empty when there is nothing to
    compare)."""
    columns = [c for c in columns_for(listing) if c.field in RATIO_FIELDS]
    rows = []
    for subject in (r for r in results if r.peer == SUBJECT and r.size == size and not r.error):
        for peer in dict.fromkeys(r.peer for r in results if r.peer != SUBJECT):
            other = find(results, peer, size, subject.mode)
            if other:
                cells = " | ".join(ratio(getattr(subject, c.field), getattr(other, c.field)).strip(" ()") or "-"
                                   for c in columns)
                rows.append(f"| {subject.mode} | {peer} | {cells} |")
    if not rows:
        return []
    return [f"| wire | aggregator vs | {' | '.join(c.heading for c in columns)} |",
            "|---|---|" + "---|" * len(columns), *rows]


def target_lines(results: Sequence[Figures], size: int) -> list[str]:
    """One line per target at `size`: aggregator's figure and verdict on each wire it applies to, with the floor's
    figure beside it (an absolute target the floor misses too is out of reach on that machine)."""
    lines = []
    for target in targets_at(size):
        parts = []
        for f in (r for r in results if r.peer == SUBJECT and r.size == size and target.applies(r.mode)):
            reference = reference_of(results, f, target)
            value = getattr(f, target.field)
            shown = "-" if math.isnan(value) else f"{value:.3g}"
            bound = target.threshold(reference)
            limit = f" vs {bound:.3g}" if target.against and not math.isnan(bound) else ""
            missing = " (no smaller size in this run)" if target.against == "smallest" and not reference else ""
            floor = floor_of(results, f)
            context = f" (floor {getattr(floor, target.field):.3g})" if floor and target.against != "floor" else ""
            parts.append(f"{f.mode} {shown}{limit}: **{target.verdict(f, reference)}**{missing}{context}")
        lines.append(f"- {target.label}: " + ("; ".join(parts) if parts else "not run"))
    return lines


def page_table(results: Sequence[Figures]) -> list[str]:
    """First and middle listing page latency (ms) of every peer and wire against catalog size (empty with one
    size): a page that costs more in a larger catalog shows here."""
    sizes = sorted({r.size for r in results})
    if len(sizes) < 2:
        return []
    rows = [f"| peer | wire | {' | '.join(f'{s:,} files' for s in sizes)} |", "|---|---|" + "---|" * len(sizes)]
    for peer, mode in dict.fromkeys((r.peer, r.mode) for r in results):
        cells = []
        for size in sizes:
            f = find(results, peer, size, mode)
            cells.append(f"{f.first_page_ms:.2f} / {f.middle_page_ms:.2f}" if f else "-")
        rows.append(f"| {peer} | {mode} | {' | '.join(cells)} |")
    return rows


def render(results: Sequence[Figures], machine: str, started: str, command: str,
           peer_notes: Sequence[str], plot: str | None, reads_asked: int) -> str:
    """The whole report as Markdown."""
    out = ["# Benchmarks", "",
           f"Run {started} with `{command}` on {machine}.", "",
           ("Every peer serves the same generated Markdown files (about 40 bytes each, 100 per folder) over stdio "
            "and over Streamable HTTP on loopback (`... http` rows; peers that cannot serve HTTP are left out "
            "there), driven by the official `mcp` `Client` with its cache off (`cache=None`), one fresh server "
            "process per run, client and server sharing the machine's cores. Wires: `legacy` is the 2025-11-25 "
            "handshake, `auto` negotiates the modern 2026-07-28 wire. Ratios in parentheses are to the `floor` "
            "peer on the same size and wire (for times and memory lower is better, for reads/s higher is better); "
            "the second table of each size divides aggregator's figures by every other peer's. `pass`/`FAIL` mark "
            "aggregator's figures that have a target. See `benchmarks/README.md` for what each figure means. The "
            "sections after the plot (URI templates, live catalog, remote sources) come from the side benchmarks "
            "and say when and how they were run."), "",
           "Peers:", *[f"- {note}" for note in peer_notes], ""]
    for size in sorted({r.size for r in results}):
        out += [f"## {size:,} files", "", *workload_table(results, size, reads_asked), ""]
        ratios = peer_ratio_table(results, size)
        if ratios:
            out += [f"aggregator against each peer at {size:,} files (aggregator / peer: below 1 is better for "
                    "times and memory, above 1 for reads/s):", "", *ratios, ""]
        if targets_at(size):
            out += [f"Targets at {size:,} files:", "", *target_lines(results, size), ""]
    pages = page_table(results)
    if pages:
        out += ["## One listing page against catalog size", "",
                "Median latency (ms) of one `resources/list` request: first page / the page halfway through the "
                "catalog (a peer that does not paginate answers with everything in one page).", "", *pages, ""]
    if plot:
        out += [f"![reads/s, listing time and page latency vs catalog size]({plot})", ""]
    out += [("Timings on a shared 2-core VM wander by 10-20% between runs: compare ratios within one run rather "
             "than absolute figures across runs, and use `--repeat 3` (medians) before drawing conclusions."), ""]
    return "\n".join(out)
