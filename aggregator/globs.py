"""Glob patterns over '/'-separated relative paths, with the same meaning for every source kind.

`*` and `?` stay within one path segment, `**` spans any number of segments (including none),
`[abc]`/`[!abc]` are character classes and `{md,txt}` alternatives. As in a shell, a wildcard at the start of a
segment does not match a leading dot: hidden files and folders (`.git/`) are matched only by patterns that spell the dot,
or by any pattern compiled with `hidden=True` (an entry that says `hidden: true`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache

__all__ = ["compile_glob", "glob_prefix", "path_filter"]


@lru_cache(maxsize=256)
def compile_glob(pattern: str, hidden: bool = False) -> re.Pattern[str]:
    """Compile a glob into a regex matching whole relative paths; wildcards match a leading dot only if `hidden`."""
    return re.compile(_translate(pattern, hidden), re.DOTALL)


def path_filter(pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> Callable[[str], bool]:
    """A test for relative paths: matched by `pattern` and by none of `exclude` (a collection's glob and exclude:)."""
    match = compile_glob(pattern, hidden).fullmatch
    if not exclude:  # a listing asks this of every file: no generator to make when nothing is excluded
        return lambda path: match(path) is not None
    excluded = [compile_glob(e, hidden).fullmatch for e in exclude]
    return lambda path: match(path) is not None and not any(x(path) for x in excluded)


def glob_prefix(pattern: str) -> str:
    """The literal folder prefix of a glob (`reports/2024/*.md` -> `reports/2024`), to narrow listing."""
    literal: list[str] = []
    for segment in pattern.split("/")[:-1]:
        if any(c in segment for c in "*?[{"):
            break
        literal.append(segment)
    return "/".join(literal)


def _translate(pattern: str, hidden: bool = False) -> str:
    visible = "" if hidden else r"(?!\.)"
    out: list[str] = []
    i, n = 0, len(pattern)
    depth = 0  # inside {...}
    while i < n:
        c = pattern[i]
        segment_start = i == 0 or pattern[i - 1] == "/"
        if c in "*?" and segment_start:
            out.append(visible)
        if c == "*":
            if pattern.startswith("**", i):
                at_start = i == 0 or pattern[i - 1] == "/"
                after = i + 2
                if at_start and pattern.startswith("/", after):
                    out.append(rf"(?:{visible}[^/]*/)*")  # '**/' : zero or more whole, visible folders
                    i = after + 1
                    continue
                # A bare '**' spans segments but, like '**/', never enters hidden ones.
                out.append(rf"[^/]*(?:/{visible}[^/]*)*" if at_start else r".*")
                i = after
                continue
            out.append(r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern.startswith("[!", i) or pattern.startswith("[^", i) else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body[:1] in "!^":
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\").replace("/", "") + "]")
                i = end
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise ValueError(f"unclosed '{{' in glob {pattern!r}")
    return "".join(out)
