"""Rendered resources: a manifest's `render:` Jinja2 template, run in a sandbox over other resources of the catalog.

The template text comes only from the manifest. Values from a URI reach it as data (`args`, and each variable
by name), never as template source. Inside a template:

- `read(uri)` is another resource's text, `json(uri)` its parsed JSON;
- `resources(prefix="")` lists the catalog's resources under a URI prefix, as dicts with `uri`, `name`, `title`,
  `mimeType`, `size` and `lastModified`, so `resources("reports://") | sort(attribute="lastModified",
  reverse=true)` gives the newest first.

What a caller may not read stays hidden here too. Output is capped; nesting (a rendered resource reading another)
stops at `MAX_DEPTH`.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable, Mapping
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["MAX_DEPTH", "RenderError", "RenderTooLarge", "check_syntax", "render"]

MAX_DEPTH = 4
_depth = contextvars.ContextVar("render_depth", default=0)


class RenderError(Exception):
    """A template failed while rendering; the message is safe to log, not to send (it may name data)."""


class RenderTooLarge(RenderError):
    """The output passed the cap."""


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    # Immutable sandbox: no attribute access to internals, no mutation of lists or dicts passed in.
    return ImmutableSandboxedEnvironment(enable_async=True, undefined=StrictUndefined, autoescape=False,
                                         trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


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
