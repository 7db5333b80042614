"""What the figures were measured on: CPU, cores, memory, OS, Python and library versions, load."""

from __future__ import annotations

import importlib.metadata
import os
import platform


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's machine type."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float:
    """Total memory in GiB (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def version_of(package: str) -> str:
    """The installed version of `package`, or 'not installed'."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def describe() -> str:
    """One line: CPU, cores, memory, kernel, Python, mcp, and the 1-minute load average when the run started."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu_model()}, {os.cpu_count()} cores, {memory_gib():.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, mcp {version_of('mcp')}, load average {load:.2f} at start")
