"""Several HTTP worker processes sharing one listening socket: `serve --http PORT --stateless --workers N`.

Each worker is a fork that opens the manifest and serves on its own (its own catalog, cache and live reload; its
figures go to files that any worker's /metrics reads, see metrics_multiprocess); the kernel hands each new
connection to one of them. The parent only forwards SIGTERM/SIGINT and waits. A stop during start-up (the
manifest check, the forks, a worker opening its catalog) is a clean one: exit 0.
Sessions of the legacy wire live in one process, so several workers need `--stateless`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from aggregator.stopping import STOPS, Stop, forward, listen
from aggregator.tracing import shutdown_tracing

logger = logging.getLogger("aggregator.workers")


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
    work, else here) is how the parent hears SIGTERM/SIGINT: a stop before or during the forks forks no more and
    ends those already forked, with exit 0.

    A worker that ends before the parent was asked to stop takes the others down with it (exit code kept), so a
    broken worker is seen by whatever supervises the service rather than silently halving its capacity.
    """
    stop = stop or listen()
    children = stop.children
    for index in range(count):
        if stop.requested:
            break
        # Blocked over the fork: a signal in between reaches the parent once the child is in `children` (so it is
        # forwarded), and never runs the parent's handler in the child (which would signal its siblings).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            pid = os.fork()
            if pid == 0:
                _worker(index, serve)
            children[pid] = index
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    if children:
        logger.info("%d workers serving (pids %s)", len(children), ", ".join(map(str, children)))
    worst = 0
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        index = children.pop(pid)
        ended(pid)
        code = os.waitstatus_to_exitcode(status)
        worst = max(worst, code if code >= 0 else 1)
        if not stop.requested:
            logger.error("worker %d (pid %d) ended with %d; stopping the others", index, pid, code)
            stop.signum = signal.SIGTERM
            for child in children:
                forward(child, signal.SIGTERM)
    return worst


def _worker(index: int, serve: Callable[[int], int]) -> NoReturn:
    """The child's life: `serve(index)`, then its exit code. Until the server installs its own handlers (before it
    accepts connections), SIGTERM/SIGINT end the worker at once with exit 0: it has served nothing yet, so there is
    nothing to finish, and a stop is not a failure. (Unwinding a half-done start-up from a signal handler instead
    was tried: it can land inside the event loop's construction or leave a task that ignores its cancellation.)"""
    code = 1

    def stop_starting(signum: int, frame: FrameType | None) -> None:
        _finish(0)

    try:
        for signum in STOPS:
            signal.signal(signum, stop_starting)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # blocked by the parent over the fork
        code = serve(index)
    except BaseException:
        logger.exception("worker %d failed", index)
    finally:
        _finish(code)


def _finish(code: int) -> NoReturn:
    shutdown_tracing()  # os._exit skips atexit, which flushes spans in a single process
    logging.shutdown()
    os._exit(code)
