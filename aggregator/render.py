"""Rendered resources: a manifest's `render:` Jinja2 template, run in a sandbox over other resources of the catalog.

The template text comes only from the manifest. Values from a URI reach it as data (`args`, and each variable
by name), never as template source. Inside a template:

- `read(uri)` is another resource's text, `json(uri)` its parsed JSON;
- `resources(prefix="")` lists the catalog's resources under a URI prefix, as dicts with `uri`, `name`, `title`,
  `mimeType`, `size` and `lastModified`, so `resources("reports://") | sort(attribute="lastModified",
  reverse=true)` gives the newest first.

What a caller may not read stays hidden here too. Output is capped, and so is every value built on the way
(`'x' * n`, `2 ** n`, `'%*s'`, `center`, `indent`): a URI choosing `n` cannot make the server build gigabytes
before the cap applies. Nesting (a rendered resource reading another) stops at `MAX_DEPTH`.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError
from jinja2.filters import do_indent as _JINJA_INDENT
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["MAX_DEPTH", "RenderError", "RenderTooLarge", "check_syntax", "render"]

MAX_DEPTH = 4
_depth = contextvars.ContextVar("render_depth", default=0)


class RenderError(Exception):
    """A template failed while rendering; the message is safe to log, not to send (it may name data)."""


class RenderTooLarge(RenderError):
    """The output passed the cap."""


_cap = contextvars.ContextVar("render_cap", default=1 << 20)
"""The output cap of the render under way: no single value may be built bigger than it."""


def _too_large(size: int) -> None:
    if size > _cap.get():
        raise RenderTooLarge(f"a value of about {size} bytes would pass the {_cap.get()}-byte output cap")


class _CappedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing before it builds a value bigger than the output cap.

    A URI's variables may reach arithmetic (`'x' * (n|int)`), so the cap checked on the output alone would come
    after a 10 GB string was already built. Loops are bounded already (`range` stops at 100,000 items).
    """

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            count, seq = (right, left) if isinstance(right, int) else (left, right)
            if isinstance(count, int) and isinstance(seq, (str, bytes, list, tuple)):
                _too_large(len(seq) * count)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            _too_large(right * abs(left).bit_length() // 8)  # the result's size in bytes, before computing it
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _too_large(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            # `'%*s' % (10**9, x)` and `'%10000000000d'`: widths are what grow a formatted string.
            widths = [a for a in (right if isinstance(right, tuple) else (right,)) if isinstance(a, int)]
            widths += [int(w) for w in re.findall(r"%[-+ #0]*(\d+)", left)]
            _too_large(len(left) + max(widths, default=0))
        return super().call_binop(context, operator, left, right)


def _center(value: Any, width: int = 80) -> str:
    _too_large(int(width))
    return str(value).center(int(width))


def _indent(value: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    text = str(value)
    _too_large(len(text) + (len(width) if isinstance(width, str) else int(width)) * (text.count("\n") + 1))
    return str(_JINJA_INDENT(text, width, first, blank))


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    # Immutable sandbox: no attribute access to internals, no mutation of lists or dicts passed in.
    env = _CappedSandbox(enable_async=True, undefined=StrictUndefined, autoescape=False,
                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    # Filters that pad to a width a URI may choose.
    env.filters["center"] = _center
    env.filters["indent"] = _indent
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


async def render(text: str, variables: Mapping[str, str | None], read_text: ReadText, list_resources: ListResources,
                 max_bytes: int) -> str:
    """Render the manifest template `text` with the URI's `variables`; RenderError or RenderTooLarge otherwise."""
    depth = _depth.get()
    if depth >= MAX_DEPTH:
        raise RenderError(f"rendered resources nest deeper than {MAX_DEPTH} levels")
    token = _depth.set(depth + 1)
    try:
        return await _run(text, variables, read_text, list_resources, max_bytes)
    finally:
        _depth.reset(token)


async def _run(text: str, variables: Mapping[str, str | None], read_text: ReadText, list_resources: ListResources,
               max_bytes: int) -> str:
    async def read_json(uri: str) -> Any:
        return json.loads(await read_text(uri))

    def resources(prefix: str = "") -> list[dict[str, Any]]:
        return list_resources(prefix)

    _cap.set(max_bytes)  # this task's context: concurrent renders keep their own caps
    args = {k: v for k, v in variables.items() if v is not None}
    # Every variable is defined (None when the URI leaves it out); `args` holds only those given.
    context = {**variables, "args": args, "read": read_text, "json": read_json, "resources": resources}
    out: list[str] = []
    size = 0
    try:
        async for chunk in _compiled(text).generate_async(context):
            size += len(chunk.encode("utf-8"))
            if size > max_bytes:
                raise RenderTooLarge(f"rendered output passed {max_bytes} bytes")
            out.append(chunk)
    except RenderError:
        raise
    except (TemplateError, ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise RenderError(f"{type(exc).__name__}: {exc}") from None
    return "".join(out)
