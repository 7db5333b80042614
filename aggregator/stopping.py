"""SIGTERM/SIGINT heard from the start of `aggregator serve`, so a stop at any moment is a clean one (exit 0).

A supervisor (systemd, a Kubernetes rollout) may stop the server right after starting it. Until a handler exists,
SIGTERM's default action kills the process (exit 143) and SIGINT raises KeyboardInterrupt wherever the start-up is.
So the `aggregator` command's first step (aggregator.launch, before the CLI's own imports) makes the process's
`Stop`, which only records the request; the server honours a stop heard before it was ready by not serving at all
(`stop_signals`), and one heard later by finishing what is in flight. A command other than `serve` has nothing to
finish: `release()` gives the signals their default actions back (and one heard meanwhile takes effect then).

This module imports nothing the interpreter has not loaded already but `signal`: it runs before anything else of
the command.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # not from typing: an import the first instant of the process does without
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from anyio.abc import TaskStatus

__all__ = ["STOPS", "Stop", "listen", "release", "stop_signals"]

STOPS = (signal.SIGTERM, signal.SIGINT)

_heard: Stop | None = None


class Stop:
    """SIGTERM/SIGINT handled from the moment this is made: the first one is noted (`signum`; `requested` once it
    is set) and each is forwarded to `children` (the workers of `serve --workers`, by pid)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.children: dict[int, int] = {}  # pid -> worker index
        for signum in STOPS:
            signal.signal(signum, self._handle)
        # A mask inherited from whoever started us (a supervisor forking from a thread that blocks them) would keep
        # the stop from ever arriving; one already pending arrives here, at the handler.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        for child in list(self.children):
            forward(child, signum)


def forward(pid: int, signum: int) -> None:
    """Send `signum` to `pid`, which may have ended meanwhile."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def listen() -> Stop:
    """This process's Stop, made (its handlers installed) by the first call."""
    global _heard
    if _heard is None:
        _heard = Stop()
    return _heard


def release() -> None:
    """The default actions back for SIGTERM and SIGINT, if `listen()` took them; a stop heard meanwhile takes effect
    now (SIGTERM ends the process, SIGINT raises KeyboardInterrupt)."""
    global _heard
    heard, _heard = _heard, None
    if heard is None:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if heard.signum is not None:
        signal.raise_signal(heard.signum)


async def stop_signals(stop: Stop | None, stopping: Callable[[], None], *, task_status: TaskStatus[None]) -> None:
    """Call `stopping()` once, for the first SIGTERM/SIGINT the event loop hears, or before `task_status.started()`
    if `stop` heard one already (the caller then does not start serving). Started once the loop listens: from then
    on no stop is missed, as one before went to `stop`."""
    import logging

    import anyio

    logger = logging.getLogger("aggregator")
    with anyio.open_signal_receiver(*STOPS) as signals:  # replaces `stop`'s handlers for as long as it is open
        if stop is not None and stop.signum is not None:
            logger.info("%s during start-up: stopping before serving", signal.Signals(stop.signum).name)
            stopping()
            task_status.started()
            return
        task_status.started()
        async for received in signals:
            logger.info("%s: finishing requests in flight, then stopping", signal.Signals(received).name)
            stopping()
            return
