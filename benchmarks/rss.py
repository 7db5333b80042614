"""What the kernel knows of a server process: its peak resident memory (the high-water mark) and its CPU time."""

from __future__ import annotations

import math

import psutil


def peak_rss_mb(pid: int) -> float:
    """The process's VmHWM (peak RSS since it started) in MB (2**20 bytes); NaN when it cannot be read.

    Read it while the process is still alive: the mark goes with the process.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time the processes have used so far, in seconds (NaN when one cannot be read)."""
    try:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)
    except psutil.Error:
        return math.nan


def new_children(before: set[int]) -> list[int]:
    """Pids of this process's direct children that were not in `before` (the server a client just spawned)."""
    return [child.pid for child in psutil.Process().children() if child.pid not in before]


def children() -> set[int]:
    """Pids of this process's direct children now."""
    return {child.pid for child in psutil.Process().children()}
