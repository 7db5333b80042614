"""A cheaper process start (issue 25: the suite starts hundreds of servers, and imports are most of each start's
CPU): the mcp SDK's two package `__init__` files run only when a name they re-export is asked for, and the cyclic
garbage collector pauses while the command imports its modules.

`mcp/__init__.py` and `mcp/server/__init__.py` import the SDK's client (httpx2, its auth and caching) and its
high-level `MCPServer` only to re-export names, yet Python runs them before any module below them: about a tenth of
a server's start-up CPU, paid by every process (issue 25: the suite starts hundreds). The server imports what it
uses from the modules that define it (`mcp.server.lowlevel`, `mcp.server.context` ...), so those packages start
as their bare folders; the first look-up of a missing name (`from mcp import Client`, `mcp.server.MCPServer`) runs
the real `__init__` into the same module, after which it is the module a plain import gives.

Importing creates many long-lived objects (classes, functions, pydantic's validators), and the cyclic collector
would walk each of them again at every pass it makes meanwhile: about a tenth of `validate`'s CPU. A command pauses
it with `pause_collection()` and calls `collect_again()` once its modules are imported and its manifest is open.

tests/test_start_imports.py checks that a served folder leaves the SDK's client and MCPServer unimported.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from types import ModuleType
from typing import Any

__all__ = ["collect_again", "defer_sdk_package_inits", "pause_collection"]

DEFERRED = ("mcp", "mcp.server")
"""Parents first: finding `mcp.server` imports `mcp`."""

_paused = False


def defer_sdk_package_inits() -> None:
    """Put `mcp` and `mcp.server` in sys.modules with their `__init__` not yet run (unless already imported, or not
    a regular package): their submodules import as usual, and any name missing from them runs the `__init__`."""
    for name in DEFERRED:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not (spec.origin or "").endswith("__init__.py"):
            return  # not the layout this is for: a plain import stays
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__getattr__"] = _completion(module)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _completion(module: ModuleType) -> Any:
    """The module's `__getattr__` (PEP 562, asked only for names it lacks): runs its `__init__` once, then looks the
    name up again (AttributeError as usual when the package has no such name either)."""

    def __getattr__(name: str) -> Any:
        # pop() is atomic: one caller runs the __init__. No lock is held meanwhile (the __init__ imports modules,
        # each under the import system's own lock); a thread asking at that very moment may find the package still
        # partly filled, as with any module another thread is importing. The server imports on one thread.
        if module.__dict__.pop("__getattr__", None) is __getattr__:
            spec = module.__spec__
            assert spec is not None and spec.loader is not None  # set by defer_sdk_package_inits
            try:
                spec.loader.exec_module(module)
            except BaseException:
                module.__dict__.setdefault("__getattr__", __getattr__)  # asked again, it tries again
                raise
        return getattr(module, name)

    return __getattr__


def pause_collection() -> None:
    """Stop the cyclic collector until `collect_again()` (nothing changes if it was off already)."""
    global _paused
    _paused = _paused or gc.isenabled()
    gc.disable()


def collect_again() -> None:
    """Start-up is over: the cyclic collector runs again if `pause_collection()` stopped it (once; later calls and
    a collector someone else turned back on change nothing)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()
