"""Completion of URI-template arguments, from the data: `values:` enumerations and the source's own files.

A file template's `path` (e.g. `{team}/{doc}.md`) is matched against the source listing with the arguments
already chosen filled in, so `{team}` narrows `{doc}`. Multi-segment variables (`{+path}`) complete one folder
at a time, folders first. Listings are kept a few seconds, so typing does not list a remote source per keystroke.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aggregator.catalog import TemplateEntry
from aggregator.sources import Source, SourceError

__all__ = ["Completions", "Completer", "MAX_VALUES"]

MAX_VALUES = 100  # the protocol's cap on one answer
LISTING_TTL_S = 5.0
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)\}")


@dataclass(frozen=True, slots=True)
class Completions:
    values: list[str]
    total: int
    has_more: bool


NONE = Completions([], 0, False)


class Completer:
    """Answers completion requests for the templates of whatever catalog the caller passes in."""

    def __init__(self) -> None:
        self._listings: dict[int, tuple[float, list[str]]] = {}

    async def complete(self, template: TemplateEntry, source: Source | None, name: str, prefix: str,
                       context: Mapping[str, str] | None = None) -> Completions:
        """Values for variable `name` starting with `prefix`, given the earlier arguments in `context`."""
        spec = template.spec
        if name not in template.template.variables:
            return NONE
        enumerated = spec.values.get(name)
        if enumerated is not None:
            return _rank([v for v in enumerated if v.startswith(prefix)], folders=False)
        if spec.path is None or source is None:
            return NONE
        multi = name in template.template.multi_segment
        pattern = _path_regex(spec.path, name, dict(context or {}), template.template.multi_segment)
        if pattern is None:
            return NONE
        found: set[str] = set()
        for path in await self._paths(source):
            m = pattern.fullmatch(path)
            if m is None:
                continue
            value = m.group("target")
            if not value.startswith(prefix):
                continue
            if multi:
                # One folder level at a time: `docs/` before everything under it.
                cut = value.find("/", len(prefix))
                if cut != -1:
                    value = value[: cut + 1]
            found.add(value)
        return _rank(list(found), folders=multi)

    async def _paths(self, source: Source) -> list[str]:
        key, now = id(source), time.monotonic()
        cached = self._listings.get(key)
        if cached is not None and now - cached[0] < LISTING_TTL_S:
            return cached[1]
        try:
            paths = [info.path for info in await source.list("**")]
        except SourceError:
            paths = []  # a source that cannot be listed (HTTP) has nothing to offer
        if len(self._listings) > 64:
            self._listings.clear()
        self._listings[key] = (now, paths)
        return paths


def _path_regex(path: str, target: str, context: Mapping[str, str], multi: frozenset[str]) -> re.Pattern[str] | None:
    """A regex over source paths capturing `target`, with chosen arguments as literals and the rest as wildcards."""
    out, pos, seen = [], 0, False
    for m in _PLACEHOLDER.finditer(path):
        out.append(re.escape(path[pos : m.start()]))
        var = m.group(1)
        span = ".+" if var in multi else "[^/]+"
        if var == target and not seen:
            out.append(f"(?P<target>{span})")
            seen = True
        elif var == target:
            out.append("(?P=target)")
        elif var in context and context[var]:
            out.append(re.escape(context[var]))
        else:
            out.append(span)
        pos = m.end()
    out.append(re.escape(path[pos:]))
    return re.compile("".join(out), re.DOTALL) if seen else None


def _rank(values: Sequence[str], folders: bool) -> Completions:
    """Folders first (when completing paths), then by name; at most MAX_VALUES, with the total."""
    ordered = sorted(values, key=lambda v: (not v.endswith("/"), v.lower(), v) if folders else (v.lower(), v))
    return Completions(ordered[:MAX_VALUES], len(ordered), len(ordered) > MAX_VALUES)
