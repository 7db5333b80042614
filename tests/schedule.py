"""The order each xdist worker gets its tests in (`make test`: --dist worksteal): the slowest first in every
worker's share, the shares balanced by estimated seconds. Worksteal hands each worker an equal run of the collected
list and lets an idle worker steal the tail of a busy one's queue; a slow test left at a tail runs last, alone, and
the run waits for it. Estimates are the seconds each test took last time (the pytest cache, written by the
controller at the end of a run); a test never timed counts SLOW_GUESS seconds when marked slow, else LIGHT.

Tests of a module that uses a module- or class-scoped fixture stay together (moved apart, the fixture would be set
up again for each group). Every worker computes the same order from the same collection and cache, as xdist needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

CACHE_KEY = "aggregator/durations"
SLOW_GUESS = 15.0
LIGHT = 0.5
HEAVY = 3.0
"""Seconds from which a test (or a module kept together) is placed at the head of a share."""


def estimate(item: pytest.Item, durations: Mapping[str, float]) -> float:
    known = durations.get(item.nodeid)
    if known is not None:
        return known
    return SLOW_GUESS if item.get_closest_marker("slow") else LIGHT


def _kept_together(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture scoped wider than a function but narrower than the session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class", "package") for defs in info.name2fixturedefs.values())


def _module(item: pytest.Item) -> str | None:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else None


def units(items: Sequence[pytest.Item]) -> list[list[pytest.Item]]:
    """The collected items as movable units: one test, or all tests of a module that must stay together."""
    grouped: dict[str, list[pytest.Item]] = {}
    found: list[list[pytest.Item]] = []
    together = {_module(item) for item in items if _kept_together(item)} - {None}
    for item in items:
        name = _module(item)
        if name in together:
            if name not in grouped:
                grouped[name] = []
                found.append(grouped[name])
            grouped[name].append(item)
        else:
            found.append([item])
    return found


def share_sizes(count: int, workers: int) -> list[int]:
    """How many tests worksteal hands each worker first (xdist/scheduler/worksteal.py: check_schedule)."""
    sizes, left = [], count
    for index in range(workers):
        size = left // (workers - index)
        sizes.append(size)
        left -= size
    return sizes


def order(items: list[pytest.Item], workers: int, durations: Mapping[str, float]) -> list[pytest.Item]:
    """`items` reordered: heavy units spread over the workers' shares (longest first, each to the share with the
    least estimated time so far), at the head of each share in falling order; the rest after them, as collected."""
    if workers < 2 or not items:
        return items
    all_units = units(items)
    cost = {id(unit): sum(estimate(i, durations) for i in unit) for unit in all_units}
    heavy = sorted((u for u in all_units if cost[id(u)] >= HEAVY), key=lambda u: -cost[id(u)])
    light = [item for u in all_units if cost[id(u)] < HEAVY for item in u]
    sizes = share_sizes(len(items), workers)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    seconds = [0.0] * workers
    for unit in heavy:
        open_shares = [i for i in range(workers) if len(shares[i]) + len(unit) <= sizes[i]] or list(range(workers))
        target = min(open_shares, key=lambda i: seconds[i])
        shares[target].extend(unit)
        seconds[target] += cost[id(unit)]
    rest = iter(light)
    for index, share in enumerate(shares):
        while len(share) < sizes[index]:
            nxt = next(rest, None)
            if nxt is None:
                break
            share.append(nxt)
    ordered = [item for share in shares for item in share] + list(rest)
    assert len(ordered) == len(items)
    return ordered
