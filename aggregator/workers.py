"""Several HTTP worker processes sharing one listening socket: `serve --http PORT --stateless --workers N`.

Each worker is a fork that opens the manifest and serves on its own (its own catalog, cache and live reload; its
figures go to files that any worker's /metrics reads, see metrics_multiprocess); the kernel hands each new
connection to one of them. The parent only forwards SIGTERM/SIGINT and waits.
Sessions of the legacy wire live in one process, so several workers need `--stateless`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType

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


def run_workers(count: int, serve: Callable[[int], int], ended: Callable[[int], None] = lambda pid: None) -> int:
    """Fork `count` children each running `serve(index)`; wait for all of them and return the worst exit code.
    `ended(pid)` is called in the parent for each child once it has ended.

    A worker that ends before the parent was asked to stop takes the others down with it (exit code kept), so a
    broken worker is seen by whatever supervises the service rather than silently halving its capacity.
    """
    children: dict[int, int] = {}
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = serve(index)
            except BaseException:
                logger.exception("worker %d failed", index)
            finally:
                shutdown_tracing()  # os._exit skips atexit, which flushes spans in a single process
                logging.shutdown()
                os._exit(code)
        children[pid] = index
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            _signal(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    logger.info("%d workers serving (pids %s)", count, ", ".join(map(str, children)))
    worst = 0
    while children:
        pid, status = os.wait()
        if pid not in children:
            continue
        index = children.pop(pid)
        ended(pid)
        code = os.waitstatus_to_exitcode(status)
        worst = max(worst, code if code >= 0 else 1)
        if not stopping:
            logger.error("worker %d (pid %d) ended with %d; stopping the others", index, pid, code)
            stopping = True
            for child in children:
                _signal(child, signal.SIGTERM)
    return worst


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
