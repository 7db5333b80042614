"""When an upstream connection is tried again: capped exponential backoff with jitter, and, for a while after a
connection that was up is lost, attempts on demand.

The demand comes from a call that finds the upstream down: right after a restart the next scheduled attempt may be
seconds away while the upstream already answers, and the call would fail for nothing. An attempt on demand starts no
sooner than `first` seconds after the last one (calls cannot make an upstream that stays down see more than one
attempt per `first`, and a stdio child is a process started per attempt), and only until the delay has grown to `cap`:
after that, calls fail at once between scheduled attempts as for an upstream that was never reached.
"""

from __future__ import annotations

import random

import anyio

__all__ = ["Backoff"]


class Backoff:
    """Delays from `first` doubling up to `cap` (each ±20%), restarted by `reset`."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = cap
        self._delay = first
        self._recovering = False
        self._early: anyio.Event | None = None
        self.due: float | None = None
        """When (anyio's clock) the attempt being waited for is due; None when no wait is under way."""

    def reset(self, recovering: bool) -> None:
        """Start again from `first`; `recovering`: a connection that was up was lost, so calls may `hurry()`."""
        self._delay = self.first
        self._recovering = recovering

    async def wait(self) -> None:
        """Until the next attempt is due, or asked for by `hurry()` (then at least `first` after this call)."""
        began = anyio.current_time()
        early = self._early = anyio.Event()
        delay = self._delay * random.uniform(0.8, 1.2)
        self.due = began + delay
        try:
            with anyio.move_on_after(delay):
                await early.wait()
            if early.is_set():
                await anyio.sleep(max(0.0, began + self.first - anyio.current_time()))  # anyio refuses < 0
            else:
                self._delay = min(self._delay * 2, self.cap)
        finally:
            self._early = self.due = None

    def hurry(self) -> bool:
        """Bring the next attempt forward while recovering (see the module docstring); True if it was, and the
        caller may wait for its outcome."""
        if not self._recovering or self._early is None or self._delay >= self.cap:
            return False
        self._early.set()
        return True
