"""Blocking calls of one source in their own threads: at most `size` at once, each awaited for at most a timeout.

A call that times out cannot be interrupted (a hung mount blocks in the kernel), so its thread keeps its slot until
it returns: a stuck source holds at most its own `size` threads, never the default pool other sources and the SDK
use, and callers beyond that wait for a slot within the same timeout. Threads are daemons, so a thread stuck for
good never keeps the process from exiting; idle ones are reused, and end after `IDLE_S` without work.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["ThreadSlots"]

T = TypeVar("T")
IDLE_S = 10.0
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class ThreadSlots:
    """Runs blocking functions in daemon threads, `size` at a time; a slot is free again only when its thread is.

    Counting happens on the event loop thread only: a finishing thread hands its slot back with
    `call_soon_threadsafe`, so no lock is needed and a caller that gave up never frees a slot it no longer holds.
    """

    def __init__(self, size: int, name: str = "source") -> None:
        if size < 1:
            raise ValueError("a source needs at least one thread")
        self.size = size
        self.name = name
        self._busy = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._idle: list[queue.SimpleQueue[_Job]] = []  # inboxes of threads waiting for work
        self._idle_lock = threading.Lock()

    @property
    def busy(self) -> int:
        """Threads running now, those whose caller gave up included."""
        return self._busy

    async def run(self, timeout: float, func: Callable[..., T], *args: Any,
                  alive: Callable[[], object] | None = None) -> T:
        """`func(*args)` in a thread; TimeoutError if waiting for a slot and the call together take over `timeout`.
        With `alive` (a figure the call keeps changing as it goes, e.g. folders listed), the call fails only once
        `alive()` stayed the same for `timeout`: a long listing that goes on is not a hung one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._busy < self.size and not self._waiting:
            self._busy += 1  # the common case: a free slot, nothing to wait for
        else:
            with anyio.fail_at(deadline):
                await self._acquire(loop)
        done: asyncio.Future[T] = loop.create_future()
        try:
            self._dispatch((loop, done, func, args))
        except BaseException:
            self._release()
            raise
        # The deadline fails the future itself: a timer handle costs a fraction of a cancel scope, and the caller
        # gives up the same way (the thread keeps its slot until it returns, see `_finish`).
        timer: list[asyncio.TimerHandle] = []  # the one pending timer (a live call re-arms it)
        if alive is None:
            timer.append(loop.call_at(deadline, _expire, done))
        else:
            timer.append(loop.call_at(deadline, _expire_unless_alive, loop, done, timeout, alive, alive(), timer))
        try:
            return await done
        finally:
            timer[0].cancel()

    def _dispatch(self, job: _Job) -> None:
        """Hand `job` to an idle thread, or start one (the caller holds a slot, so threads never exceed `size`)."""
        with self._idle_lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True, name=f"aggregator {self.name}").start()
        inbox.put(job)

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._busy < self.size and not self._waiting:
            self._busy += 1
            return
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        try:
            await turn  # `_release` hands its slot over: `_busy` is already counted for this caller
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._release()  # the slot came with the cancellation: pass it on
            elif turn in self._waiting:
                self._waiting.remove(turn)
            raise

    def _release(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._busy -= 1

    def _serve(self, inbox: queue.SimpleQueue[_Job]) -> None:
        """A worker thread: run jobs from `inbox` until idle for IDLE_S."""
        job: _Job | None = inbox.get()
        while job is not None:
            loop, done, func, args = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = func(*args)
            except BaseException as exc:  # handed to the caller, who may have gone
                error = exc
            # Idle before the slot is released: whoever gets the slot next finds this thread, starts none.
            with self._idle_lock:
                self._idle.append(inbox)
            try:
                loop.call_soon_threadsafe(_finish, self, done, result, error)
            except RuntimeError:
                pass  # the loop is closed: nobody waits, and no slot outlives it
            del job, done, result, error
            try:
                job = inbox.get(timeout=IDLE_S)
            except queue.Empty:
                with self._idle_lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                job = inbox.get()  # taken off the idle list just now: its job is on the way


def _expire(done: asyncio.Future[Any]) -> None:
    if not done.done():
        done.set_exception(TimeoutError())


def _expire_unless_alive(loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], timeout: float,
                         alive: Callable[[], object], before: object, timer: list[asyncio.TimerHandle]) -> None:
    """Fail `done` unless `alive()` moved since `before`; else look again in `timeout`."""
    now = alive()
    if now == before:
        _expire(done)
    elif not done.done():
        timer[0] = loop.call_later(timeout, _expire_unless_alive, loop, done, timeout, alive, now, timer)


def _finish(slots: ThreadSlots, done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    slots._release()
    if done.done():
        return  # the caller timed out or was cancelled
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
