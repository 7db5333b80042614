"""ThreadSlots: a slot is held until its thread returns, callers give up after the timeout, waiters are served in
order, and a waiter that gives up passes the slot on."""

from __future__ import annotations

import threading

import anyio
import pytest

from aggregator.sources.threads import ThreadSlots


def test_a_stuck_call_keeps_its_slot_and_later_callers_time_out() -> None:
    slots = ThreadSlots(1, "t")
    release = threading.Event()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await slots.run(0.2, release.wait)  # blocks until set: a call that outlives its caller
        assert slots.busy == 1
        with pytest.raises(TimeoutError):
            await slots.run(0.2, lambda: "never started")
        release.set()
        with anyio.fail_after(5):
            while slots.busy:
                await anyio.sleep(0.01)
        assert await slots.run(1, lambda: "ran") == "ran"
        assert slots.busy == 0

    anyio.run(main)


def test_waiters_are_served_in_order_and_a_cancelled_waiter_passes_its_turn() -> None:
    slots = ThreadSlots(1, "t")
    gate = threading.Event()
    order: list[str] = []

    async def call(name: str, timeout: float = 5) -> None:
        try:
            await slots.run(timeout, lambda: order.append(name))
        except TimeoutError:
            order.append(f"{name} gave up")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(slots.run, 5, gate.wait)
            await anyio.sleep(0.05)
            tg.start_soon(call, "a")
            await anyio.sleep(0.01)
            tg.start_soon(call, "quitter", 0.1)
            await anyio.sleep(0.01)
            tg.start_soon(call, "b")
            await anyio.sleep(0.3)  # the quitter has given up while waiting
            gate.set()
        assert order == ["quitter gave up", "a", "b"]
        assert slots.busy == 0

    anyio.run(main)


def test_errors_reach_the_caller_and_free_the_slot() -> None:
    slots = ThreadSlots(2, "t")

    def fail() -> None:
        raise OSError("disk on fire")

    async def main() -> None:
        with pytest.raises(OSError, match="disk on fire"):
            await slots.run(1, fail)
        assert slots.busy == 0

    anyio.run(main)
