"""How often a source that pushes its own changes may have its listing taken again.

An upstream may tell `list_changed` a thousand times a second. Each relist it asks for costs a listing of the
upstream and a compile; left unpaced, a flood keeps a core busy relisting. A source's events are coalesced (one
relist in flight, one queued, as a set of source ids holds) and its relists kept apart: the next starts at least
`MIN_GAP_S` after the last ended, and at least `GAP_FACTOR` times as long as the last took, so relisting takes at
most a third of a core however fast the events come. The first event after a quiet spell is relisted at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["GAP_FACTOR", "MIN_GAP_S", "RelistPace"]

MIN_GAP_S = 1.0
GAP_FACTOR = 2.0


@dataclass(slots=True)
class _Last:
    ended: float
    took: float


class RelistPace:
    """When each source may be relisted next (times on the event loop's clock, `anyio.current_time()`)."""

    def __init__(self, min_gap: float = MIN_GAP_S, factor: float = GAP_FACTOR) -> None:
        self.min_gap = min_gap
        self.factor = factor
        self._last: dict[str, _Last] = {}

    def due(self, source: str) -> float:
        """The earliest time `source` may be relisted (-inf: now)."""
        last = self._last.get(source)
        if last is None:
            return -math.inf
        return last.ended + max(self.min_gap, self.factor * last.took)

    def next_due(self, sources: Iterable[str]) -> float:
        """The earliest time any of `sources` may be relisted (inf: none waits)."""
        return min((self.due(s) for s in sources), default=math.inf)

    def ready(self, sources: Iterable[str], now: float) -> set[str]:
        """Those of `sources` that may be relisted at `now`."""
        return {s for s in sources if self.due(s) <= now}

    def relisted(self, sources: Iterable[str], started: float, ended: float) -> None:
        """`sources` were relisted from `started` to `ended`."""
        for source in sources:
            self._last[source] = _Last(ended, max(0.0, ended - started))

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is known of sources not in `keep` (a reload removed them)."""
        kept = set(keep)
        for source in [s for s in self._last if s not in kept]:
            del self._last[source]
