"""The targets this harness checks for aggregator, and their verdicts (reported, never asserted)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from benchmarks.figures import Figures

SUBJECT = "aggregator"
BASELINE = "floor"

Against = Literal["", "floor", "smallest"]


@dataclass(frozen=True)
class Target:
    """A goal at one catalog size: `field` of aggregator's figures, compared with `limit`.

    `against` says what `limit` is relative to: '' (an absolute value), 'floor' (a fraction of the floor's figure
    on the same size and wire) or 'smallest' (a multiple of aggregator's own figure at the smallest catalog size of
    the same run and wire: a cost that must not grow with the catalog). `at_least` says which way passes; `modes`
    the wires (and transports, e.g. `auto http`) it applies to, empty for every one; `label` is how the report
    names it.
    """

    size: int
    field: str
    limit: float
    at_least: bool
    label: str
    against: Against = ""
    modes: tuple[str, ...] = ()

    def applies(self, mode: str) -> bool:
        """Whether the target applies to runs on `mode`."""
        return not self.modes or mode in self.modes

    def threshold(self, reference: Figures | None) -> float:
        """The absolute value to beat: `limit`, or `limit` x the reference's figure (NaN without a reference)."""
        if not self.against:
            return self.limit
        return self.limit * getattr(reference, self.field) if reference and not reference.error else math.nan

    def verdict(self, figures: Figures, reference: Figures | None) -> str:
        """'pass', 'FAIL', or 'n/a' when the figure or its threshold is missing."""
        value, bound = getattr(figures, self.field), self.threshold(reference)
        if figures.error or math.isnan(value) or math.isnan(bound):
            return "n/a"
        return "pass" if (value >= bound if self.at_least else value < bound) else "FAIL"


TARGETS: list[Target] = [
    Target(10_000, "ready_s", 1.0, False, "ready within 1 s of launch"),
    Target(10_000, "listing_s", 0.3, False, "full listing under 0.3 s"),
    Target(10_000, "reads_per_s", 0.9, True, "cached sequential reads >= 0.9x floor", against="floor"),
    Target(10_000, "peak_rss_mb", 120.0, False, "peak RSS under 120 MB"),
    Target(10_000, "reads_per_s", 400.0, True, "HTTP, modern wire: cached sequential reads >= 400/s",
           modes=("auto http",)),
    Target(10_000, "concurrent_reads_per_s", 900.0, True, "HTTP, modern wire: cached reads 32 in flight >= 900/s",
           modes=("auto http",)),
    Target(100_000, "ready_s", 5.0, False, "ready within 5 s of launch"),
    Target(100_000, "first_page_ms", 1.5, False, "one listing page (the first) costs under 1.5x what it costs at "
           "the run's smallest size", against="smallest"),
    Target(100_000, "middle_page_ms", 1.5, False, "one listing page (halfway through) costs under 1.5x what it "
           "costs at the run's smallest size", against="smallest"),
    Target(100_000, "peak_rss_mb", 400.0, False, "peak RSS under 400 MB"),
]


def targets_at(size: int) -> list[Target]:
    """The targets that apply to a catalog of `size` files."""
    return [t for t in TARGETS if t.size == size]


def targets_for(size: int, field: str, mode: str) -> list[Target]:
    """The targets on `field` at `size` that apply to `mode`."""
    return [t for t in targets_at(size) if t.field == field and t.applies(mode)]
