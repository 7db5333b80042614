"""The render sandbox: Jinja2's immutable sandbox hardened so a template cannot build huge values or run forever.

Every value a template builds on the way is capped (`'x' * n`, `'%*s' % ...`, `'{:>{n}}'.format(...)`, `ljust`,
`replace`, `join`, `center`, `indent`, `batch`, `lipsum(n)`; integers from `**` and `*` by bits), and every loop
iteration, call, operator, attribute, filter and test spends from the render's `Budget` (a deadline and an
iteration count). `aggregator.render` runs templates compiled here in worker threads.
"""

from __future__ import annotations

import contextvars
import copy
import math
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache, update_wrapper, wraps
from string import Formatter
from typing import Any, TypeVar

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.defaults import DEFAULT_FILTERS
from jinja2.filters import make_attrgetter, sync_do_join
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum, pass_eval_context
from markupsafe import Markup

from aggregator.manifest.model import RenderSettings

__all__ = ["Budget", "RenderError", "RenderOverBudget", "RenderTooLarge", "check_syntax", "compiled", "current_budget",
           "output_cap"]

_T = TypeVar("_T")


class RenderError(Exception):
    """A template failed while rendering; the message is safe to log, not to send (it may name data)."""


class RenderTooLarge(RenderError):
    """The output passed the cap."""


class RenderOverBudget(RenderError):
    """The render passed its time limit or its loop iterations (`RenderSettings`)."""


class Budget:
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


current_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("render_budget", default=None)
"""The budget of the render under way in this thread (and of the reads it makes, on the event loop)."""


def _spend() -> None:
    """Stop the render under way if it is past its deadline (no render under way: compiling, nothing to do)."""
    budget = current_budget.get()
    if budget is not None:
        budget.check()


output_cap = contextvars.ContextVar("render_cap", default=1 << 20)
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
    if size > output_cap.get():
        raise RenderTooLarge(f"a value of about {size} bytes would pass the {output_cap.get()}-byte output cap")


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
        _too_large(_weight(seq, output_cap.get() // count + 1) * count)


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
        size += _weight(item, output_cap.get() - size + 1)
        if size > output_cap.get():
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
        items = list(args[0])  # a generator can be measured only once: join the list that was measured
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
        budget = current_budget.get()
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
                kwargs, args = args[0], ()
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
    _too_large(_weight(value, output_cap.get() + 1))


def _batch_check(value: Any, linecount: Any, fill_with: Any = None) -> None:
    if fill_with is not None and isinstance(linecount, int) and linecount > 0:  # the last batch is filled up
        _too_large(linecount * (_weight(fill_with, output_cap.get() // linecount + 1) + 2))


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
def compiled(text: str) -> Any:
    return _environment().from_string(text)


def check_syntax(text: str) -> str | None:
    """None if `text` is a valid template, else the error with its line in the template."""
    try:
        _environment().compile(text)  # compile, not parse: an unknown filter or test is an error too
    except TemplateSyntaxError as exc:
        return f"template syntax error on line {exc.lineno} of the template: {exc.message}"
    return None
