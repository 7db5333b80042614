"""tests/schedule.py: the order that puts each xdist worker's slowest tests first, checked against xdist's own
worksteal scheduler (its first hand-out) with stand-in items."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from xdist.scheduler.worksteal import WorkStealingScheduling

from tests import schedule


class Item:
    """What schedule.py reads of a pytest item."""

    def __init__(self, module: str, name: str, *, slow: bool = False, module_fixture: bool = False) -> None:
        self.nodeid = f"tests/{module}.py::{name}"
        self.module = SimpleNamespace(__name__=f"tests.{module}")
        self._slow = slow
        self._fixtureinfo = SimpleNamespace(name2fixturedefs={
            "served": [SimpleNamespace(scope="module" if module_fixture else "function")]})

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self._slow else None

    def __repr__(self) -> str:
        return self.nodeid


def first_hand_out(count: int, workers: int) -> list[list[int]]:
    """The indices xdist's worksteal scheduler sends each of `workers` idle nodes once collection is done."""
    scheduler: Any = object.__new__(WorkStealingScheduling)
    scheduler.numnodes, scheduler.node2collection, scheduler.node2pending = workers, {}, {}
    scheduler.pending, scheduler.collection, scheduler.steal_requested_from_node = [], None, None
    scheduler.log = lambda *args: None
    sent: list[list[int]] = []

    class Node:
        shutting_down = False

        def __init__(self, index: int) -> None:
            self.gateway = SimpleNamespace(id=f"gw{index}")

        def send_runtest_some(self, indices: list[int]) -> None:
            sent.append(list(indices))

        def shutdown(self) -> None:  # a node left without tests
            pass

    for index in range(workers):
        node = Node(index)
        scheduler.add_node(node)
        scheduler.add_node_collection(node, [f"t{i}" for i in range(count)])
    scheduler.schedule()
    return sent


@pytest.mark.parametrize(("count", "workers"), [(1790, 4), (1790, 2), (7, 4), (3, 4)])
def test_share_sizes_are_worksteals_first_hand_out(count: int, workers: int) -> None:
    sent = first_hand_out(count, workers)
    assert [n for n in schedule.share_sizes(count, workers) if n] == [len(share) for share in sent]
    assert [i for share in sent for i in share] == list(range(count))  # runs of the list, in order


def test_each_share_starts_with_its_slowest_and_the_shares_balance() -> None:
    items = [Item("m", f"t{i}") for i in range(40)]
    durations = {items[i].nodeid: seconds for i, seconds in [(3, 30.0), (10, 20.0), (25, 12.0), (38, 9.0),
                                                             (39, 5.0)]}
    ordered = schedule.order(list(items), 2, durations)
    assert sorted(map(repr, ordered)) == sorted(map(repr, items))  # the same tests, each once
    first, second = ordered[:20], ordered[20:]
    # Longest first, each to the share with less so far: 30 | 20, 12 to the second (20 < 30), 9 to the first
    # (30 < 32), 5 to the second (32 < 39).
    assert first[:2] == [items[3], items[38]] and second[:3] == [items[10], items[25], items[39]]
    assert first[2:] + second[3:] == [i for i in items if i.nodeid not in durations]  # the rest as collected


def test_untimed_tests_marked_slow_go_first_and_a_module_fixture_keeps_its_module_together() -> None:
    shared = [Item("shared", f"s{i}", module_fixture=True) for i in range(4)]
    items = [Item("a", f"t{i}") for i in range(15)] + shared + [Item("b", "slow", slow=True)]
    durations = {shared[0].nodeid: 40.0}
    ordered = schedule.order(list(items), 4, durations)
    assert ordered[:4] == shared  # one unit, the heaviest: the first share's head
    assert ordered.index(items[-1]) == schedule.share_sizes(len(items), 4)[0]  # the next share's head
    assert schedule.order(list(items), 1, durations) == items  # a serial run keeps the collected order
