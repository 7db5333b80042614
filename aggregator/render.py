"""Rendered resources: a manifest's `render:` Jinja2 template, run in a sandbox over other resources of the catalog.

The template text comes only from the manifest. Values from a URI reach it as data (`args`, and each variable
by name), never as template source. Inside a template:

- `read(uri)` is another resource's text, `json(uri)` its parsed JSON;
- `resources(prefix="")` lists the catalog's resources under a URI prefix, as dicts with `uri`, `name`, `title`,
  `mimeType`, `size` and `lastModified`, so `resources("reports://") | sort(attribute="lastModified",
  reverse=true)` gives the newest first.

What a caller may not read stays hidden here too. Output is capped, and so is every value built on the way
(`'x' * n`, `[s] * n`, `a ~ b`, `'%*s' % ...`, `'{:>{n}}'.format(...)`, `s.ljust(n)`, `replace`, `join`,
`center`, `indent`, `batch`, `lipsum(n)`; integers from `**` and `*` by bits): a URI choosing `n` cannot make the
server build gigabytes before the cap applies. Nesting (a rendered resource reading another) stops at `MAX_DEPTH`.

Time is capped too. A render runs in a worker thread, never on the event loop, under a budget (`RenderSettings`):
a deadline, checked on every loop iteration and every call, operator, attribute, filter and test the sandbox
runs, and a count of loop iterations across all its loops. A render past either stops itself (RenderOverBudget)
and frees its thread. `read()`, `json()` and `resources()` hop back to the event loop, so reads keep the caller's
scopes and the shared cache; the renders they start share their reader's budget and run on threads of their own
nesting level, so renders waiting for the renders they read can never hold every thread those need.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from anyio import from_thread, to_thread
from anyio.lowlevel import RunVar
from jinja2 import TemplateError

from aggregator.manifest.model import RenderSettings
from aggregator.render_sandbox import (Budget, RenderError, RenderOverBudget, RenderTooLarge, check_syntax, compiled,
                                       current_budget, output_cap)

__all__ = ["MAX_DEPTH", "RENDER_THREADS", "RenderError", "RenderOverBudget", "RenderTooLarge", "check_syntax",
           "render"]

MAX_DEPTH = 4
RENDER_THREADS = 4
"""Renders running at once per nesting level; more wait (their time limit running) for a thread to free up."""
_depth = contextvars.ContextVar("render_depth", default=0)
_T = TypeVar("_T")


ReadText = Callable[[str], Awaitable[str]]
ListResources = Callable[[str], list[dict[str, Any]]]
_limiters: RunVar[list[anyio.CapacityLimiter]] = RunVar("render_limiters")


def _limiter(depth: int) -> anyio.CapacityLimiter:
    """The threads of nesting level `depth`, in this event loop: a render waits only for deeper levels' threads,
    so a full level can never wait on itself, and renders never take threads from anyio's shared pool."""
    levels = _limiters.get(None)
    if levels is None:
        levels = [anyio.CapacityLimiter(RENDER_THREADS) for _ in range(MAX_DEPTH)]
        _limiters.set(levels)
    return levels[depth]


async def render(text: str, variables: Mapping[str, str | tuple[str, ...] | None], read_text: ReadText,
                 list_resources: ListResources, max_bytes: int, limits: RenderSettings = RenderSettings()) -> str:
    """Render the manifest template `text` with the URI's `variables` in a worker thread, within `limits` (or,
    when a render reads this one, within its reader's budget); RenderError, RenderTooLarge or RenderOverBudget
    otherwise. `read_text` and `list_resources` run on the caller's event loop."""
    depth = _depth.get()
    if depth >= MAX_DEPTH:
        raise RenderError(f"rendered resources nest deeper than {MAX_DEPTH} levels")
    budget = current_budget.get() or Budget(limits)

    async def read_here(uri: str) -> str:
        """On the event loop: a read made by the template, as one level deeper and within the same budget."""
        _depth.set(depth + 1)  # this task's own context: the caller's is left alone
        current_budget.set(budget)
        with anyio.move_on_after(budget.remaining()):
            return await read_text(uri)
        raise budget.timed_out()

    def read(uri: str) -> str:
        try:
            return from_thread.run(read_here, str(uri))
        except concurrent.futures.CancelledError:  # the render's deadline passed while it waited for the read
            if budget.remaining() <= 0:
                raise budget.timed_out() from None
            raise

    def read_json(uri: str) -> Any:
        return json.loads(read(uri))

    def resources(prefix: str = "") -> list[dict[str, Any]]:
        return from_thread.run_sync(list_resources, str(prefix))  # the catalog is the event loop's

    args = {k: v for k, v in variables.items() if v is not None}
    # Every variable is defined (None when the URI leaves it out); `args` holds only those given.
    context = {**variables, "args": args, "read": read, "json": read_json, "resources": resources}
    _share_the_interpreter()
    job = _Job(budget)
    result: str | None = None
    failure: BaseException | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(job.stop_when_overdue)
        try:
            # The wait for a thread counts against the deadline. Once running, the thread is shielded from
            # cancellation (its slot stays taken until it really ends) and stops itself at the deadline.
            with anyio.move_on_after(budget.remaining()):
                result = await to_thread.run_sync(job.run, text, context, max_bytes, limiter=_limiter(depth))
        except (Exception, _Stopped) as exc:  # kept out of the task group, which would wrap it in an ExceptionGroup
            failure = budget.timed_out() if isinstance(exc, _Stopped) else exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if result is None:
        raise budget.timed_out()
    return result


_SWITCH_INTERVAL = 0.001


def _share_the_interpreter() -> None:
    """While a render thread runs Python, the event loop waits for the GIL up to the switch interval at every
    step of a request (5 ms by default): a request of a dozen steps would take 50 ms longer. 1 ms keeps it short."""
    if sys.getswitchinterval() > _SWITCH_INTERVAL:
        sys.setswitchinterval(_SWITCH_INTERVAL)


_GRACE = 0.1
"""Seconds past its deadline a render may run before its thread is interrupted."""


class _Stopped(BaseException):
    """Raised in a render's thread past its deadline. A BaseException, so no `except Exception` in a filter
    swallows it."""


class _Job:
    """One render in its worker thread, which the event loop stops if it runs past its deadline without reaching a
    check: a filter looping in Python (`urlize`, `wordwrap` over megabytes) gets an exception at its next
    bytecode. A single call into C (`sorted`, `str.split`, a regular expression) still runs to its end."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._thread: int | None = None
        """The ident of the thread running the render, while it runs it."""

    def run(self, text: str, context: dict[str, Any], max_bytes: int) -> str:
        """In the worker thread."""
        with self._lock:
            self._thread = threading.get_ident()
        try:
            return _generate(text, context, max_bytes, self.budget)
        except _Stopped:
            raise self.budget.timed_out() from None
        finally:
            with self._lock:
                if self._thread is not None:
                    _raise_in(self._thread, None)  # a stop sent but not raised yet must not hit the thread's next job
                self._thread = None

    async def stop_when_overdue(self) -> None:
        """On the event loop, once: past the deadline and the grace, interrupt the render if it still runs."""
        await anyio.sleep(max(self.budget.remaining(), 0.0) + _GRACE)
        if self.budget.spent:  # already unwinding: an exception landing in its clean-up would only be lost noise
            await anyio.sleep(10 * _GRACE)  # unless something swallowed the budget's error and carried on
        while True:
            with self._lock:
                if self._thread is None:
                    return
                _raise_in(self._thread, _Stopped)
            # Raised inside a destructor or a gc callback, the exception is reported and lost: send it again.
            await anyio.sleep(5 * _GRACE)


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """Have `thread` raise `exception` at its next Python bytecode (None: cancel one not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               None if exception is None else ctypes.py_object(exception))


def _generate(text: str, context: dict[str, Any], max_bytes: int, budget: Budget) -> str:
    """In a worker thread (a context of its own): the template's output, within the cap and the budget."""
    output_cap.set(max_bytes)
    current_budget.set(budget)
    out: list[str] = []
    size = 0
    try:
        budget.check()
        for chunk in compiled(text).generate(context):
            size += len(chunk.encode("utf-8"))
            if size > max_bytes:
                raise RenderTooLarge(f"rendered output passed {max_bytes} bytes")
            out.append(chunk)
    except RenderError:
        raise
    except (TemplateError, ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise RenderError(f"{type(exc).__name__}: {exc}") from None
    return "".join(out)
