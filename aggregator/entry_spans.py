"""Where a change left two listings' entries different: `Differing`, pairs of spans (entries taken out, entries put in).

Every entry outside the spans is on both sides, the same, so what changed entry by entry (the console history's
`aggregator diff` lines) is found by comparing the spans alone, whatever the catalog's size. A span names rows of a
listing without building their entries: a change that has no console to show it builds none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from aggregator.entry import Entry

__all__ = ["Differing", "Span", "whole"]

_URI = attrgetter("uri")


@dataclass(frozen=True, slots=True)
class Span:
    """Entries [start, stop) of `entries` (a listing's rows: built only by `built`)."""

    entries: Sequence[Entry]
    start: int
    stop: int

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> Span:
        """All of `entries`."""
        return cls(entries, 0, len(entries))

    def built(self) -> list[Entry]:
        """The span's entries, sorted by URI (a listing's rows are already)."""
        return sorted(self.entries[self.start:self.stop], key=_URI)


Differing = tuple[tuple[Span, Span], ...]
"""(entries before, entries after) pairs of a change: outside them both sides hold the same entries. A URI is in at
most one pair, on either side or both."""


def whole(before: Sequence[Entry], after: Sequence[Entry]) -> Differing:
    """Two listings that may differ anywhere (each compared whole)."""
    return ((Span.of(before), Span.of(after)),)
