"""The event loop `serve` runs on: uvloop when it is installed (the `fast` extra) and asyncio's own otherwise, as
uvicorn's `--loop auto` chooses; `--loop` (or AGGREGATOR_LOOP) asks for one.

asyncio's loop runs its selector, handles and pipe transports in Python: about 40,000 instructions of every read
relayed over stdio, a seventh of the gateway's (benchmarks/upstream_hop.py). uvloop runs the same in C.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

__all__ = ["CHOICES", "ENV", "backend_options", "chosen", "running_loop"]

CHOICES = ("auto", "asyncio", "uvloop")
ENV = "AGGREGATOR_LOOP"


def chosen(asked: str | None = None) -> str:
    """The loop `asked` for (None: AGGREGATOR_LOOP, else auto), resolved: "uvloop" or "asyncio". ValueError names
    a choice that is not one, or uvloop asked for when it is not installed."""
    choice = asked or os.environ.get(ENV) or "auto"
    if choice not in CHOICES:
        raise ValueError(f"unknown event loop {choice!r} (one of {', '.join(CHOICES)})")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401 - whether it imports, not merely whether it is there
    except ImportError:
        installed = False
    else:
        installed = True
    if choice == "uvloop" and not installed:
        raise ValueError("uvloop is not installed (pip install 'mcp-aggregator[fast]')")
    return "uvloop" if installed else "asyncio"


def backend_options(loop: str) -> dict[str, Any]:
    """anyio's asyncio backend options for `loop` (what `chosen` gives)."""
    return {"use_uvloop": True} if loop == "uvloop" else {}


def running_loop() -> str:
    """Which loop runs the caller: "uvloop" or "asyncio" (for the log)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
