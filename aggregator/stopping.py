"""SIGTERM/SIGINT heard from the start of `aggregator serve`, so a stop at any moment is a clean one (exit 0).

A supervisor (systemd, a Kubernetes rollout) may stop the server right after starting it. Until a handler exists,
SIGTERM's default action kills the process (exit 143) and SIGINT raises KeyboardInterrupt wherever the start-up is.
So the `aggregator` command's first step (aggregator.launch, before any import: the stops it hears until this
module is imported are handed to `listen`) makes the process's `Stop`, which only records the request; the server
honours a stop heard before it was ready by not serving at all (`stop_signals`), and one heard later by finishing
what is in flight. A second stop heard while the first waits for requests in flight ends serving without waiting
for them: the process still winds down in order (every line it
wrote whole, its log flushed) and exits with 128 + the signal's number, as a shell reports a program the signal
ended. From the first instant to the exit no stop meets the default action (which would kill a process finishing
its shutdown). A command other than `serve` has nothing to finish: `release()` gives the signals their default
actions back (and one heard meanwhile takes effect then). While `serve` does start-up work that leaves nothing to
finish (its imports, the manifest check of `--workers`: a second of CPU, which a loaded machine stretches past any
supervisor's stop timeout) it sets `Stop.at_once`: a stop then ends the process there and then, exit 0.

The parent of `--workers` forwards each stop it hears to its workers as a signal of its own (`FORWARDED`): a stop
sent to the whole process group (a terminal's Ctrl-C, a supervisor stopping every process of the service: systemd's
control-group mode) reaches a worker twice, itself and forwarded, and that is one stop. A second stop is a second
one from the same way (two forwarded, or two direct).

This module imports nothing the interpreter has not loaded already but `signal`: it runs before anything else of
the command but launch's first line, whose handler records the stops until `listen` takes over (`signal` alone is
some 5,000 lines of Python, its enums built, 1-3 ms during which SIGTERM's default action used to end the
process).
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
FORWARDED: dict[int, int] = {signal.SIGTERM: signal.SIGUSR1, signal.SIGINT: signal.SIGUSR2}
"""Each stop as the parent of workers forwards it to them (a worker of a `Stop` with `forwarded` hears these)."""
_FORWARDED_STOP = {forward: stop for stop, forward in FORWARDED.items()}

_heard: Stop | None = None


class Stop:
    """SIGTERM/SIGINT handled from the moment this is made (unless not `handled`: a record only): the first one is
    noted (`signum`; `requested` once it is set), a second one too (`forced`); while `at_once`, a stop ends the
    process."""

    def __init__(self, handled: bool = True) -> None:
        self.signum: int | None = None
        self.forced: int | None = None
        self.forwarded = False
        """Whether stops may also come forwarded by a parent (a worker: it then hears FORWARDED too)."""
        self._heard = [0, 0]
        """Stops heard directly, and forwarded."""
        self.at_once = False
        """Set around start-up work that leaves nothing to finish: a stop meanwhile ends the process at once, exit 0
        (os._exit from the handler: it takes no lock the interrupted code may hold, and flushes nothing; stderr is
        line-buffered, so every line logged is out whole)."""
        if not handled:
            return
        for signum in STOPS:
            signal.signal(signum, self._handle)
        # A mask inherited from whoever started us (a supervisor forking from a thread that blocks them) would keep
        # the stop from ever arriving; one already pending arrives here, at the handler.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def code(self) -> int:
        """The exit code the stops heard leave: 0, or 128 + the number of the signal that forced it (a second)."""
        return 0 if self.forced is None else 128 + self.forced

    @property
    def signals(self) -> tuple[int, ...]:
        """The signals that stop this process: STOPS, and where it has a parent that forwards them, FORWARDED's."""
        return (*STOPS, *FORWARDED.values()) if self.forwarded else STOPS

    def note(self, signum: int, frame: FrameType | None = None) -> int:
        """Record `signum` (one of `signals`): the first stop, else a second from the same way (also a handler: what
        `stop_signals` leaves in place). The stop it stands for (SIGTERM or SIGINT)."""
        stop = _FORWARDED_STOP.get(signum, signum)
        way = int(stop != signum)
        self._heard[way] += 1
        if self.signum is None:
            self.signum = stop
        elif self.forced is None and self._heard[way] > 1:
            self.forced = stop
        return stop

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.note(signum)
        if self.at_once:
            os._exit(0)


def listen(early: list[int] | None = None) -> Stop:
    """This process's Stop, made (its handlers installed) by the first call. `early`: the stops a handler installed
    before this module was imported recorded (aggregator.launch), noted (and emptied) once ours are in place, so
    none is lost between the two."""
    global _heard
    if _heard is None:
        _heard = Stop()
    while early:
        _heard.note(early.pop(0))
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


async def stop_signals(stop: Stop | None, stopping: Callable[[], None], forced: Callable[[], None] = lambda: None,
                       doing: str = "finishing requests in flight", *, ready: Callable[[], None] = lambda: None,
                       task_status: TaskStatus[None]) -> None:
    """Call `stopping()` once, for the first SIGTERM/SIGINT the event loop hears, or before `task_status.started()`
    if `stop` heard one already (the caller then does not start serving); then `forced()` once, for a second one
    (stop waiting for what is in flight). Both are noted in `stop` (its `code`); the log says the first leads to
    `doing`, then stopping. Started once the loop listens: from then on no stop is missed, as one before went to
    `stop`; `ready()` is called then (not when a stop came before), so what it logs means a stop is now heard as
    one of a server in service. Listens until cancelled; from then to the process's exit a stop is only noted
    (`Stop.note`), never the signal's default action, and one heard but not yet taken by the loop when cancelled
    is noted then, not lost."""
    import asyncio
    import logging
    import math

    import anyio

    logger = logging.getLogger("aggregator")
    heard = stop if stop is not None else Stop(handled=False)
    loop = asyncio.get_running_loop()
    send, receive = anyio.create_memory_object_stream[int](math.inf)

    # Stops heard, not yet taken by the loop below. Kept here, not only in the loop's queue: a stop that came just
    # as the caller cancels this (the manifest's opening done) would otherwise be dropped with the queue, and the
    # server would serve on as if none came (as a `--workers` round in CI seems to have: a worker's forwarded stop).
    unheard: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Python runs this in the main thread between two bytecodes (the loop's too): hand it to the loop. Python
        # handlers throughout (not the loop's own, whose removal restores the default action): no instant is
        # left where a stop kills the process.
        unheard.append(signum)
        loop.call_soon_threadsafe(send.send_nowait, signum)

    for signum in heard.signals:
        signal.signal(signum, on_signal)
    try:
        if heard.signum is not None:
            logger.info("%s during start-up: stopping before serving", signal.Signals(heard.signum).name)
            stopping()
            task_status.started()
            return
        ready()
        task_status.started()
        async for _ in receive:
            if not unheard:
                continue
            received = unheard.pop(0)
            first, second = heard.signum is None, heard.forced is None
            name = signal.Signals(heard.note(received)).name  # the one place that tells a first stop from a second
            if first:
                logger.info("%s: %s, then stopping", name, doing)
                stopping()
            elif second and heard.forced is not None:
                logger.warning("%s again: stopping now, without waiting for requests in flight", name)
                forced()
    finally:
        for signum in heard.signals:
            signal.signal(signum, heard.note)
        while unheard:  # from here the handler notes them itself: these came before, and were not taken
            heard.note(unheard.pop(0))
