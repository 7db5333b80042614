"""Several HTTP worker processes sharing one listening socket: `serve --http PORT --stateless --workers N`.

Each worker is a fork that opens the manifest and serves on its own (its own catalog, cache and live reload; its
figures go to files that any worker's /metrics reads, see metrics_multiprocess); the kernel hands each new
connection to one of them. The parent only forwards SIGTERM/SIGINT (as `stopping.FORWARDED`: a stop of the whole
process group reaches a worker both ways, and is one stop) and waits, both taken in turn with the signals blocked
(sigwaitinfo), so no stop is lost between a check and a fork or a wait. A stop during start-up (the manifest
check, the forks, a worker opening its catalog) is a clean one: exit 0.
Sessions of the legacy wire live in one process, so several workers need `--stateless`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import NoReturn

from aggregator.stopping import FORWARDED, STOPS, Stop, listen
from aggregator.tracing import shutdown_tracing

logger = logging.getLogger("aggregator.workers")

WAITED = {*STOPS, signal.SIGCHLD}
"""What the parent waits for: a stop (forwarded to the workers) or a worker's end."""


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A bound, listening TCP socket on `host:port` that forked children inherit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it
    # every small answer waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def run_workers(count: int, serve: Callable[[int], int], ended: Callable[[int], None] = lambda pid: None,
                stop: Stop | None = None) -> int:
    """Fork `count` children each running `serve(index)`; wait for all of them and return the worst exit code.
    `ended(pid)` is called in the parent for each child once it has ended. `stop` (made before the slow start-up
    work, else here) records SIGTERM/SIGINT: a stop before or during the forks forks no more and ends those already
    forked, with exit 0; each stop is forwarded to every worker.

    A worker that ends before the parent was asked to stop takes the others down with it (exit code kept), so a
    broken worker is seen by whatever supervises the service rather than silently halving its capacity.
    """
    stop = stop or listen()
    # Whatever we were started with: were SIGCHLD ignored, the kernel would reap the workers and we never see one end.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # From here the stops and the workers' ends are blocked and taken in turn by `_wait`, never by a handler run
    # between two bytecodes: one run just before a fork missed that worker, and one due just as os.wait() began ran
    # only once a worker had ended. A stop that came before this ran the handler inside pthread_sigmask: `requested`.
    # The forwarded stops too: blocked in a worker until it handles them (their default action ends a process).
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {*WAITED, *FORWARDED.values()})
    try:
        children: dict[int, int] = {}  # pid -> worker index
        for index in range(count):
            if stop.requested or set(STOPS) & signal.sigpending():
                break
            pid = os.fork()
            if pid == 0:
                stop.forwarded = True
                _worker(index, serve, stop, unblocked)
            children[pid] = index
        if children:
            logger.info("%d workers serving (pids %s)", len(children), ", ".join(map(str, children)))
        return _wait(children, ended, stop)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


def _wait(children: dict[int, int], ended: Callable[[int], None], stop: Stop) -> int:
    """Until every child has ended (WAITED blocked): forward each stop, reap each child; the worst exit code."""
    worst = 0
    while children:
        signum = signal.sigwaitinfo(WAITED).si_signo
        if signum != signal.SIGCHLD:
            stop.note(signum)
            for child in children:
                _forward(child, signum)
            continue
        for pid, status in _reaped():
            index = children.pop(pid, None)
            if index is None:
                continue
            ended(pid)
            code = os.waitstatus_to_exitcode(status)
            worst = max(worst, code if code >= 0 else 1)
            if not stop.requested:
                logger.error("worker %d (pid %d) ended with %d; stopping the others", index, pid, code)
                stop.note(signal.SIGTERM)
                for child in children:
                    _forward(child, signal.SIGTERM)
    return worst


def _reaped() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child that has ended, without waiting (one SIGCHLD may stand for several)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _forward(pid: int, signum: int) -> None:
    """Forward the stop `signum` to worker `pid` (which may have ended meanwhile) as FORWARDED says."""
    try:
        os.kill(pid, FORWARDED[signum])
    except ProcessLookupError:
        pass


def _worker(index: int, serve: Callable[[int], int], stop: Stop, mask: Iterable[int]) -> NoReturn:
    """The child's life: `serve(index)`, then its exit code; `stop`: the stops it hears (`Stop.signals`); `mask`: the
    signal mask to serve with (the parent's blocks what it waits for). Until serving listens for stops itself (from
    the manifest's opening, which a stop gives up), they end the worker at once with exit 0: it has served nothing
    yet, so there is nothing to finish, and a stop is not a failure. (Unwinding a half-done start-up from a signal handler instead was tried: it can land
    inside the event loop's construction or leave a task that ignores its cancellation.) The handler is os._exit
    alone: a lock taken there (logging's, the span exporter's) may be held by the code it interrupted."""
    code = 1

    def stop_starting(signum: int, frame: FrameType | None) -> None:
        os._exit(0)

    try:
        for signum in stop.signals:
            signal.signal(signum, stop_starting)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a stop forwarded since the fork arrives here
        code = serve(index)
    except BaseException:
        logger.exception("worker %d failed", index)
    finally:
        _finish(code)


def _finish(code: int) -> NoReturn:
    shutdown_tracing()  # os._exit skips atexit, which flushes spans in a single process
    logging.shutdown()
    os._exit(code)
