"""Progress of a long listing: how many files a source has seen so far, logged on stderr every few seconds.

A listing that ends within `AFTER` seconds (2) says nothing, so small starts stay quiet; a longer one logs its
count every `EVERY` seconds (5) and one line when it ends. `AGGREGATOR_PROGRESS_AFTER` and
`AGGREGATOR_PROGRESS_EVERY` (seconds) override both, read when a listing starts. Every listing is counted by
source id in `LISTINGS` (the metric `aggregator_source_listings_total`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter

__all__ = ["AFTER", "EVERY", "LISTINGS", "ListingProgress"]

logger = logging.getLogger("aggregator.sources")
AFTER = 2.0
EVERY = 5.0
LISTINGS: Counter[str] = Counter()
"""Listings (folder walks, object-store listings) started in this process, by source id."""
_CHECK_EVERY = 128  # files counted between two looks at the clock: a tick costs an addition, not a syscall


def _seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ[name]))
    except (KeyError, ValueError):
        return default


class ListingProgress:
    """Counts what one listing has seen; `add` is called from the listing's thread as it goes."""

    def __init__(self, source_id: str, unit: str = "files") -> None:
        self.source_id = source_id
        LISTINGS[source_id] += 1
        self.unit = unit
        self.count = 0
        self.started = time.monotonic()
        self._every = _seconds("AGGREGATOR_PROGRESS_EVERY", EVERY)
        self._next = self.started + _seconds("AGGREGATOR_PROGRESS_AFTER", AFTER)
        self._unchecked = 0
        self.reported = False
        self.steps = 0
        """Units of work done (a folder read), counted by the listing's thread: what tells a long listing from a
        stuck one (`alive`)."""

    def add(self, n: int = 1) -> None:
        """Count `n` more; log the total when the listing has run long enough and the interval has passed."""
        self.count += n
        self._unchecked += n
        if self._unchecked >= _CHECK_EVERY:
            self._unchecked = 0
            self.check()

    def step(self) -> None:
        self.steps += 1

    def alive(self) -> int:
        """What changes while the listing goes on (read from the event loop's thread)."""
        return self.steps

    def check(self) -> None:
        """Log the count now if it is due (for listings that count in big steps, e.g. a page of objects)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every
        self.reported = True
        logger.info("source %r: listing, %s %s seen so far (%.0f s)", self.source_id, f"{self.count:,}", self.unit,
                    now - self.started)

    def done(self, listed: int) -> None:
        """After a listing that reported progress, say how it ended (`listed`: what matched the glob)."""
        if self.reported:
            logger.info("source %r: listed %s %s in %.1f s", self.source_id, f"{listed:,}", self.unit,
                        time.monotonic() - self.started)
