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
import copy
import ctypes
import json
import math
import re
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from functools import lru_cache, update_wrapper, wraps
from string import Formatter
from typing import Any, TypeVar

import anyio
from anyio import from_thread, to_thread
from anyio.lowlevel import RunVar
from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.defaults import DEFAULT_FILTERS
from jinja2.filters import make_attrgetter, sync_do_join
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum, pass_eval_context
from markupsafe import Markup

from aggregator.manifest.model import RenderSettings

__all__ = ["MAX_DEPTH", "RENDER_THREADS", "RenderError", "RenderOverBudget", "RenderTooLarge", "check_syntax",
           "render"]

MAX_DEPTH = 4
RENDER_THREADS = 4
"""Renders running at once per nesting level; more wait (their time limit running) for a thread to free up."""
_depth = contextvars.ContextVar("render_depth", default=0)
_T = TypeVar("_T")


class RenderError(Exception):
    """A template failed while rendering; the message is safe to log, not to send (it may name data)."""


class RenderTooLarge(RenderError):
    """The output passed the cap."""


class RenderOverBudget(RenderError):
    """The render passed its time limit or its loop iterations (`RenderSettings`)."""


class _Budget:
    """What a render, and the renders it reads, may still spend: a deadline and a number of loop iterations."""

    __slots__ = ("deadline", "iterations_left", "limits", "spent")

    def __init__(self, limits: RenderSettings) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout
        self.iterations_left = limits.max_iterations
        self.spent = False
        """Set when a check found the budget spent: the render is unwinding on its own."""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def timed_out(self) -> RenderOverBudget:
        self.spent = True
        return RenderOverBudget(f"the render took longer than its {self.limits.timeout:g}s time limit (render.timeout)")

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.timed_out()

    def counted(self, iterable: Iterable[_T]) -> Iterator[_T]:
        """`iterable`'s items, each one spending an iteration and checking the deadline."""
        for item in iterable:
            self.iterations_left -= 1
            if self.iterations_left < 0:
                self.spent = True
                raise RenderOverBudget(f"the render ran more than {self.limits.max_iterations} loop iterations "
                                       "(render.maxIterations)")
            self.check()
            yield item


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("render_budget", default=None)
"""The budget of the render under way in this thread (and of the reads it makes, on the event loop)."""


def _spend() -> None:
    """Stop the render under way if it is past its deadline (no render under way: compiling, nothing to do)."""
    budget = _budget.get()
    if budget is not None:
        budget.check()


_cap = contextvars.ContextVar("render_cap", default=1 << 20)
"""The output cap of the render under way: no single value may be built bigger than it."""

_MAX_INT_BITS = 1 << 20
"""Largest integer `**` and `*` may build (about 315,000 digits): bigger ones take seconds of CPU in the event
loop, and could not be printed anyway (Python refuses to print integers of more than 4,300 digits)."""
_MAX_JSON_INDENT = 16
"""`tojson(indent)` pads every line by indent times its depth: a fixed bound, as the depth is the data's."""

# A printf conversion: `%`, an optional `(key)`, flags, width, precision, length modifier, type.
_PRINTF = re.compile(r"%(?P<key>\((?:[^()]|\([^()]*\))*\))?[-+ #0]*(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d*))?"
                     r"[hlL]?(?P<type>.?)", re.S)
_ZERO_PADDED = frozenset("diouxXeEfFgG")  # a precision pads these with digits; it only truncates `s`, `r`, `a`


def _too_large(size: int) -> None:
    if size > _cap.get():
        raise RenderTooLarge(f"a value of about {size} bytes would pass the {_cap.get()}-byte output cap")


def _too_many_bits(bits: float) -> None:
    if bits > _MAX_INT_BITS:
        raise RenderTooLarge(f"an integer of about {int(bits)} bits would pass the {_MAX_INT_BITS}-bit limit")


def _digits(text: str | None) -> int:
    """A width written in a format: 0 when absent; more digits than an int64 holds count as too many bytes."""
    return int(text) if text and len(text) <= 18 else (10**18 if text else 0)


def _weight(value: Any, budget: int) -> int:
    """About how many characters `value` prints as; counting stops once past `budget`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int):
        return value.bit_length() // 3 + 1
    if not isinstance(value, (list, tuple, Mapping)):
        return 8
    total = 2
    for item in value.items() if isinstance(value, Mapping) else value:
        total += 2 + _weight(item, budget - total)
        if total > budget:
            break
    return total


def _check_product(left: Any, right: Any) -> None:
    """Refuse `seq * n` printing bigger than the cap, and `int * int` past `_MAX_INT_BITS`."""
    if isinstance(left, int) and isinstance(right, int):
        _too_many_bits(left.bit_length() + right.bit_length())
        return
    count, seq = (right, left) if isinstance(right, int) else (left, right)
    if not isinstance(count, int) or count <= 0:
        return
    if isinstance(seq, (str, bytes)):
        _too_large(len(seq) * count)
    elif isinstance(seq, (list, tuple)):  # by what it prints as: `[s] * n` is n references but n copies of s
        _too_large(_weight(seq, _cap.get() // count + 1) * count)


def _printf_size(fmt: str, values: Any) -> int:
    """About how long `fmt % values` is: the format, its text values, and the widths and precisions it pads to."""
    positional = iter(values if isinstance(values, tuple) else (values,))
    size = len(fmt)
    for conversion in _PRINTF.finditer(fmt):
        width, precision, key = conversion["width"], conversion["precision"], conversion["key"]
        # `*` takes the width (or precision) from the next value; the value formatted comes after it.
        width_value = next(positional, 0) if width == "*" else _digits(width)
        precision_value = next(positional, 0) if precision == "*" else _digits(precision)
        if conversion["type"] == "%":
            value: Any = ""
        elif key:
            value = values.get(key[1:-1]) if isinstance(values, Mapping) else ""
        else:
            value = next(positional, "")
        size += len(value) if isinstance(value, str) else 0
        size += abs(width_value) if isinstance(width_value, int) else 0
        if conversion["type"] in _ZERO_PADDED and isinstance(precision_value, int):
            size += abs(precision_value)
    return size


def _replaced_size(text: str, old: str, new: str, count: Any) -> int:
    """The length of `text.replace(old, new, count)`, without building it."""
    found = text.count(old)  # `old == ''` is found between every character and at both ends
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def _joined_size(separator: str, items: list[Any]) -> int:
    """About how long `separator.join(map(str, items))` is; counting stops once past the cap."""
    size = len(separator) * max(len(items) - 1, 0)
    for item in items:
        size += _weight(item, _cap.get() - size + 1)
        if size > _cap.get():
            break
    return size


def _check_str_method(text: str, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Refuse a call of `text.name(...)` whose result would pass the cap; the arguments to make the call with."""
    first = args[0] if args else None
    if name in ("ljust", "rjust", "center", "zfill") and isinstance(first, int):
        _too_large(max(len(text), first))
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            _too_large(len(text) + text.count("\t") * tabsize)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _too_large(_replaced_size(text, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)))
    elif name == "translate" and isinstance(first, Mapping):
        _too_large(len(text) + sum(text.count(chr(k)) * (len(v) - 1) for k, v in first.items()
                                   if isinstance(k, int) and 0 <= k <= 0x10FFFF and isinstance(v, str)))
    elif name == "join" and args:
        items = list(first)  # a generator can be measured only once: join the list that was measured
        _too_large(_joined_size(text, items))
        return (items, *args[1:])
    return args


class _FieldsCapped(Formatter):
    """`str.format` refusing, before it pads, fields whose widths and values add up past the cap."""

    _size = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        # Any number in a spec may be a width or a precision (`{:>10}`, `{:.3f}`, `{:0>{w}}` once resolved):
        # counting them all overcounts a fill digit, never a width.
        self._size += sum(_digits(d) for d in re.findall(r"\d+", format_spec))
        self._size += len(value) if isinstance(value, str) else 0
        _too_large(self._size)
        return super().format_field(value, format_spec)


class _CappedFormatter(_FieldsCapped, SandboxedFormatter):
    pass


class _CappedEscapeFormatter(_FieldsCapped, SandboxedEscapeFormatter):
    pass


class _CappedCodeGenerator(CodeGenerator):
    """Jinja's compiler, sending `a ~ b` through `_CappedSandbox.capped_concat`: the one operator the sandbox cannot
    intercept, and in a loop over a namespace (`{% set ns.s = ns.s ~ ns.s %}`) it doubles a string each time.
    Every `{% for %}` iterates through `_CappedSandbox.counted`, which spends the render's loop iterations."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        counted = copy.copy(node)  # the parsed node may be compiled again (a cached template is not, but be safe)
        counted.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [node.iter], [], None, None,
                                  lineno=node.lineno)
        super().visit_For(counted, frame)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # The join Jinja itself would use (markup when autoescaping), measured first.
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.capped_concat({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _CappedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing before it builds a value bigger than the output cap.

    A URI's variables may reach arithmetic (`'x' * (n|int)`), padding (`'x'.ljust(n|int)`, `'{:>{n}}'`) or
    filters (`center(n|int)`), so the cap checked on the output alone would come after a 10 GB string was
    already built. Each loop is bounded already (`range` stops at 100,000 items), nested ones by the render's
    iterations; every hook below also checks the render's deadline, so a render without loops stops in time too.
    """

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CappedCodeGenerator

    def counted(self, iterable: Iterable[_T]) -> Iterable[_T]:
        """A `{% for %}` loop's items, spending the render's iterations (no render under way: left alone)."""
        budget = _budget.get()
        return iterable if budget is None else budget.counted(iterable)

    def capped_concat(self, join: Callable[[Any], str], values: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...`, refused if the pieces print bigger than the cap together."""
        _spend()
        _too_large(_joined_size("", list(values)))
        return join(values)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _spend()  # `map(attribute=...)`, `sort(attribute=...)` loop over items through these two
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _spend()
        return super().getitem(obj, argument)

    def call_filter(self, *args: Any, **kwargs: Any) -> Any:
        _spend()  # `map('upper')` loops over items through this one
        return super().call_filter(*args, **kwargs)

    def call_test(self, *args: Any, **kwargs: Any) -> Any:
        _spend()  # and `select('odd')` through this one
        return super().call_test(*args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _spend()
        if operator == "*":
            _check_product(left, right)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            _too_many_bits(right * math.log2(abs(left)))  # the result's size, before computing it
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _too_large(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _too_large(_printf_size(left, right))
        return super().call_binop(context, operator, left, right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _spend()  # every macro call comes here: `f` calling itself twice is 2^n calls without a loop
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str) and isinstance(obj, (types.BuiltinMethodType, types.MethodType)):
            args = _check_str_method(owner, obj.__name__, args, kwargs)
        elif isinstance(obj, LoopContext) and args:  # `loop(children)` in a recursive loop: a loop of its own
            args = (self.counted(args[0]), *args[1:])
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """`str.format` and `format_map` as the sandbox runs them, each field's padding checked before it is made."""
        if not (isinstance(value, (types.MethodType, types.BuiltinMethodType))
                and value.__name__ in ("format", "format_map") and isinstance(value.__self__, str)):
            return None
        text: str = value.__self__
        is_map = value.__name__ == "format_map"

        def capped(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                args, kwargs = (), args[0]
            formatter = (_CappedEscapeFormatter(self, escape=text.escape) if isinstance(text, Markup)
                         else _CappedFormatter(self))  # one per call: the sizes it adds up are this call's
            return type(text)(formatter.vformat(text, args, kwargs))

        return update_wrapper(capped, value)


def _checked(name: str, check: Callable[..., None]) -> Callable[..., Any]:
    """Jinja's filter `name`, running `check` on the arguments a template gives it before it runs."""
    original = DEFAULT_FILTERS[name]
    passed = 1 if hasattr(original, "jinja_pass_arg") else 0  # the environment or context Jinja passes first

    @wraps(original)  # keeps `jinja_pass_arg`, so Jinja still passes it
    def checked(*args: Any, **kwargs: Any) -> Any:
        check(*args[passed:], **kwargs)
        return original(*args, **kwargs)

    return checked


def _center_check(value: Any, width: Any = 80) -> None:
    if isinstance(width, int):
        _too_large(width)


def _indent_check(value: Any, width: Any = 4, first: bool = False, blank: bool = False) -> None:
    text = str(value)
    _too_large(len(text) + (len(width) if isinstance(width, str) else int(width)) * (text.count("\n") + 1))


def _format_check(value: Any, *args: Any, **kwargs: Any) -> None:
    _too_large(_printf_size(str(value), kwargs or args))


def _replace_check(value: Any, old: Any, new: Any, count: Any = None) -> None:
    _too_large(_replaced_size(str(value), str(old), str(new), -1 if count is None else count))


def _tojson_check(value: Any, indent: Any = None) -> None:
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if width > _MAX_JSON_INDENT:
        raise RenderTooLarge(f"tojson indents at most {_MAX_JSON_INDENT} spaces")
    _too_large(_weight(value, _cap.get() + 1))


def _batch_check(value: Any, linecount: Any, fill_with: Any = None) -> None:
    if fill_with is not None and isinstance(linecount, int) and linecount > 0:  # the last batch is filled up
        _too_large(linecount * (_weight(fill_with, _cap.get() // linecount + 1) + 2))


def _slice_check(value: Any, slices: Any, fill_with: Any = None) -> None:
    if isinstance(slices, int):
        _too_large(4 * slices)  # one list per slice, empty ones included


@pass_eval_context
def _join(eval_ctx: nodes.EvalContext, value: Any, d: str = "", attribute: str | int | None = None) -> str:
    """Jinja's `join`, measuring the items (a generator, read once) before it joins them."""
    items = list(value)
    if attribute is not None:
        items = list(map(make_attrgetter(eval_ctx.environment, attribute), items))
    _too_large(_joined_size(str(d), items))
    return sync_do_join(eval_ctx, items, d)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's names
    """Jinja's `lipsum`, refusing more paragraphs of text than the cap holds."""
    _too_large(int(n) * int(max) * 12)  # words of up to about 11 letters and a space
    return generate_lorem_ipsum(n, html, min, max)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    # Immutable sandbox: no attribute access to internals, no mutation of lists or dicts passed in. Not async:
    # renders run in worker threads, and `read()` waits there for the event loop.
    env = _CappedSandbox(undefined=StrictUndefined, autoescape=False,
                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    # Filters whose output grows with an argument a URI may choose.
    for name, check in (("center", _center_check), ("indent", _indent_check), ("format", _format_check),
                        ("replace", _replace_check), ("tojson", _tojson_check), ("batch", _batch_check),
                        ("slice", _slice_check)):
        env.filters[name] = _checked(name, check)
    env.filters["join"] = _join
    env.globals["lipsum"] = _lipsum
    return env


@lru_cache(maxsize=256)
def _compiled(text: str) -> Any:
    return _environment().from_string(text)


def check_syntax(text: str) -> str | None:
    """None if `text` is a valid template, else the error with its line in the template."""
    try:
        _environment().compile(text)  # compile, not parse: an unknown filter or test is an error too
    except TemplateSyntaxError as exc:
        return f"template syntax error on line {exc.lineno} of the template: {exc.message}"
    return None


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


async def render(text: str, variables: Mapping[str, str | None], read_text: ReadText, list_resources: ListResources,
                 max_bytes: int, limits: RenderSettings = RenderSettings()) -> str:
    """Render the manifest template `text` with the URI's `variables` in a worker thread, within `limits` (or,
    when a render reads this one, within its reader's budget); RenderError, RenderTooLarge or RenderOverBudget
    otherwise. `read_text` and `list_resources` run on the caller's event loop."""
    depth = _depth.get()
    if depth >= MAX_DEPTH:
        raise RenderError(f"rendered resources nest deeper than {MAX_DEPTH} levels")
    budget = _budget.get() or _Budget(limits)

    async def read_here(uri: str) -> str:
        """On the event loop: a read made by the template, as one level deeper and within the same budget."""
        _depth.set(depth + 1)  # this task's own context: the caller's is left alone
        _budget.set(budget)
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

    def __init__(self, budget: _Budget) -> None:
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


def _generate(text: str, context: dict[str, Any], max_bytes: int, budget: _Budget) -> str:
    """In a worker thread (a context of its own): the template's output, within the cap and the budget."""
    _cap.set(max_bytes)
    _budget.set(budget)
    out: list[str] = []
    size = 0
    try:
        budget.check()
        for chunk in _compiled(text).generate(context):
            size += len(chunk.encode("utf-8"))
            if size > max_bytes:
                raise RenderTooLarge(f"rendered output passed {max_bytes} bytes")
            out.append(chunk)
    except RenderError:
        raise
    except (TemplateError, ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise RenderError(f"{type(exc).__name__}: {exc}") from None
    return "".join(out)
