"""The PNG plot: sequential reads/s, full listing time and one page's latency against catalog size, one line per
peer and wire (stdio and HTTP)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from benchmarks.figures import Figures


def series(results: Sequence[Figures], peer: str, mode: str, field: str) -> tuple[list[int], list[float]]:
    """(sizes, values) of one peer and wire for `field`, by ascending size, leaving out failed runs."""
    points = sorted((r.size, getattr(r, field)) for r in results
                    if r.peer == peer and r.mode == mode and not r.error and not math.isnan(getattr(r, field)))
    return [p[0] for p in points], [p[1] for p in points]


def draw(results: Sequence[Figures], path: Path) -> Path:
    """Write the plot to `path` (matplotlib, Agg backend) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    peers = list(dict.fromkeys(r.peer for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    colours = {peer: f"C{i}" for i, peer in enumerate(peers)}
    styles = {"legacy": "--", "auto": "-", "legacy http": ":", "auto http": "-."}
    fig, (reads, listing, page) = plt.subplots(1, 3, figsize=(16, 5))
    for peer in peers:
        for mode in modes:
            for axis, field in ((reads, "reads_per_s"), (listing, "listing_s"), (page, "middle_page_ms")):
                xs, ys = series(results, peer, mode, field)
                if xs:
                    axis.plot(xs, ys, styles.get(mode, ":"), marker="o", color=colours[peer], label=f"{peer} ({mode})")
    reads.set(title="Sequential cached reads", xlabel="files in catalog", ylabel="reads/s (higher is better)")
    listing.set(title="Full paginated listing", xlabel="files in catalog", ylabel="seconds (lower is better)")
    listing.axhline(0.3, color="grey", linewidth=0.8, linestyle=":")
    listing.annotate("target at 10,000: 0.3 s", (0.02, 0.3), xycoords=("axes fraction", "data"), fontsize=8,
                     color="grey", va="bottom")
    page.set(title="One listing page (halfway through)", xlabel="files in catalog", ylabel="ms (lower is better)")
    sizes = sorted({r.size for r in results})
    for axis in (reads, listing, page):
        axis.set_xscale("log")
        axis.set_xticks(sizes, [f"{s:,}" for s in sizes])
        axis.minorticks_off()
        axis.grid(True, alpha=0.3)
    for axis in (listing, page):
        axis.set_yscale("log")
        axis.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        axis.yaxis.set_minor_formatter(NullFormatter())
    reads.set_ylim(bottom=0)
    handles, labels = reads.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
