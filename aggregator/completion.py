"""Completion of URI-template arguments, from the data: `values:` enumerations and the source's own files.

A file template's `path` (e.g. `{team}/{doc}.md`) is matched against the source listing with the arguments
already chosen filled in, so `{team}` narrows `{doc}`. Multi-segment variables (`{+path}`) complete one folder
at a time, folders first. Listings are kept a few seconds, so typing does not list a remote source per keystroke.

A file is offered only if reading it through the template would be served: the catalog's own `expand_path` decides
(unsafe names, hidden segments without `hidden: true`). Values are what a client expands: for `{+var}` an
undecodable byte is offered percent-encoded (`caf%E9.md`, which reserved expansion keeps as it is) and a literal
'%' before two hex digits as `%25`; a `{var}` encodes every '%', so such names cannot be offered for it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from aggregator.catalog import TemplateEntry, expand_path
from aggregator.manifest.placeholders import PLACEHOLDER
from aggregator.paths import has_raw_bytes, is_hidden, is_servable
from aggregator.sources import Source, SourceError

__all__ = ["Completions", "Completer", "MAX_VALUES"]

MAX_VALUES = 100  # the protocol's cap on one answer
LISTING_TTL_S = 5.0


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
        try:
            offered = await source.complete_path(spec.path, name, prefix, context)
        except SourceError:
            return NONE  # the backend's own completion failed: the log has why, the client gets nothing
        if offered is not None:
            return _rank([v for v in offered if v.startswith(prefix)], folders=False)
        multi = name in template.template.multi_segment
        reserved = template.template.reserved
        chosen = {k: unquote(v, errors="surrogateescape") if k in reserved else v for k, v in (context or {}).items()}
        pattern, groups = _path_regex(spec.path, name, chosen, template.template.multi_segment)
        if pattern is None:
            return NONE
        url_path, byte_names = source.url_paths, source.byte_names
        found: set[str] = set()
        for path in await self._paths(source):
            m = pattern.fullmatch(path)
            if m is None:
                continue
            value = _offered(m.group("target"), name in reserved)
            if value is None or not value.startswith(prefix):
                continue
            if multi:
                # One folder level at a time: `docs/` before everything under it.
                cut = value.find("/", len(prefix))
                if cut != -1:
                    value = value[: cut + 1]
            if value in found:
                continue
            if not _plain(path, byte_names):
                # A name the template might refuse: ask the reader's own rule.
                values = {var: m.group(group) for group, var in groups.items()}
                values.update({k: v for k, v in chosen.items() if k not in values and v})
                if expand_path(template, values, url_path, byte_names) != path:
                    continue
            found.add(value)
        return _rank(list(found), folders=multi)

    async def _paths(self, source: Source) -> list[str]:
        key, now = id(source), time.monotonic()
        cached = self._listings.get(key)
        if cached is not None and now - cached[0] < LISTING_TTL_S:
            return cached[1]
        try:
            # Hidden files too: whether one is offered is the template's rule (`hidden:`), applied per path.
            paths = [info.path for info in await source.list("**", hidden=True)]
        except SourceError:
            paths = []  # a source that cannot be listed (HTTP) has nothing to offer
        if len(self._listings) > 64:
            self._listings.clear()
        self._listings[key] = (now, paths)
        return paths


def _path_regex(path: str, target: str, context: Mapping[str, str],
                multi: frozenset[str]) -> tuple[re.Pattern[str] | None, dict[str, str]]:
    """A regex over source paths capturing `target`, with chosen arguments as literals and the rest as wildcards,
    and which group holds which other variable."""
    out, pos, seen = [], 0, False
    groups: dict[str, str] = {}
    for m in PLACEHOLDER.finditer(path):
        out.append(re.escape(path[pos : m.start()]))
        var = m.group(1)
        span = ".+" if var in multi else "[^/]+"
        if var == target and not seen:
            out.append(f"(?P<target>{span})")
            groups["target"] = var
            seen = True
        elif var == target:
            out.append("(?P=target)")
        elif var in context and context[var]:
            out.append(re.escape(context[var]))
        elif var in groups.values():
            out.append(f"(?P={next(g for g, v in groups.items() if v == var)})")
        else:
            group = f"v{len(groups)}"
            out.append(f"(?P<{group}>{span})")
            groups[group] = var
        pos = m.end()
    out.append(re.escape(path[pos:]))
    return (re.compile("".join(out), re.DOTALL) if seen else None), groups


def _plain(path: str, byte_names: bool) -> bool:
    """A path every file template reads back as it is (safe, nothing hidden, no raw bytes a source cannot name)."""
    return not is_hidden(path) and is_servable(path) and (byte_names or not has_raw_bytes(path))


_TRIPLET = re.compile(r"%(?=[0-9A-Fa-f]{2})")
_RAW_BYTE = re.compile("[\udc80-\udcff]")


def _offered(value: str, reserved: bool) -> str | None:
    """`value` as a client should expand it to reach the same file, or None when no expansion can."""
    if not reserved:
        return None if has_raw_bytes(value) else value
    # Reserved expansion keeps %XX triplets: spell a literal '%' that precedes two hex digits as %25, so it
    # stays a '%', and each undecodable byte as its own triplet.
    value = _TRIPLET.sub("%25", value)
    return _RAW_BYTE.sub(lambda m: f"%{ord(m.group(0)) - 0xDC00:02X}", value) if has_raw_bytes(value) else value


def _rank(values: Sequence[str], folders: bool) -> Completions:
    """Folders first (when completing paths), then by name; at most MAX_VALUES, with the total."""
    ordered = sorted(values, key=lambda v: (not v.endswith("/"), v.lower(), v) if folders else (v.lower(), v))
    return Completions(ordered[:MAX_VALUES], len(ordered), len(ordered) > MAX_VALUES)
