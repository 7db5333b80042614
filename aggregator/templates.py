"""RFC 6570 URI templates: parse, expand and match.

Supported operators: `{var}`, `{+var}`, `{#var}`, `{/a,b}`, `{.a}`, `{;a}`, `{?a,b}`, `{&a}`. Matching
returns percent-decoded values; query-style operators (`?`, `&`) match their parameters in any order and
treat them as optional. Prefix modifiers (`:n`) and explode (`*`) are parsed but not matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote

__all__ = ["TemplateSyntaxError", "UriTemplate"]

_VARNAME = re.compile(r"^(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*$")
_OPERATORS = "+#./;?&"
# Characters a value may contain un-encoded, per operator (RFC 6570 section 3.2.1).
_UNRESERVED = "-._~"
_RESERVED = ":/?#[]@!$&'()*+,;="
# What one matched value may span: simple values stop at any delimiter, reserved ones only at ? and #.
_VALUE_PATTERN = {
    "": r"[^/?#&=,;]+",
    "+": r"[^?#]+",
    "#": r".+",
    "/": r"[^/?#]*",
    ".": r"[^/?#.]*",
    ";": r"[^/?#;]*",
}


class TemplateSyntaxError(ValueError):
    """The text is not a valid RFC 6570 URI template."""


@dataclass(frozen=True, slots=True)
class _Var:
    name: str
    explode: bool = False
    prefix: int | None = None


@dataclass(frozen=True, slots=True)
class _Expr:
    operator: str
    variables: tuple[_Var, ...]


_Part = str | _Expr


class UriTemplate:
    """A parsed URI template. `variables` lists variable names in order of appearance."""

    __slots__ = ("text", "_parts", "variables", "multi_segment", "_regex", "_query_vars", "_groups", "literal_length")

    def __init__(self, text: str, parts: tuple[_Part, ...]) -> None:
        self.text = text
        self._parts = parts
        names: list[str] = []
        for part in parts:
            if isinstance(part, _Expr):
                names.extend(v.name for v in part.variables)
        self.variables: tuple[str, ...] = tuple(dict.fromkeys(names))
        # Variables whose operator lets a value span several path segments ({+path}, {#frag}).
        self.multi_segment: frozenset[str] = frozenset(
            v.name for p in parts if isinstance(p, _Expr) and p.operator in ("+", "#") for v in p.variables
        )
        self.literal_length = sum(len(p) for p in parts if isinstance(p, str))
        self._regex, self._groups, self._query_vars = _compile_matcher(parts)

    @classmethod
    def parse(cls, text: str) -> UriTemplate:
        """Parse `text`; raise TemplateSyntaxError naming the offending position."""
        if not isinstance(text, str) or not text:
            raise TemplateSyntaxError("a URI template must be a non-empty string")
        parts: list[_Part] = []
        pos = 0
        while pos < len(text):
            start = text.find("{", pos)
            close = text.find("}", pos)
            if close != -1 and (start == -1 or close < start):
                raise TemplateSyntaxError(f"unmatched '}}' at position {close}")
            if start == -1:
                parts.append(text[pos:])
                break
            if start > pos:
                parts.append(text[pos:start])
            end = text.find("}", start)
            if end == -1:
                raise TemplateSyntaxError(f"unclosed '{{' at position {start}")
            parts.append(_parse_expression(text[start + 1 : end], start))
            pos = end + 1
        for part in parts:
            if isinstance(part, str) and any(c in part for c in " \"<>\\^`|"):
                raise TemplateSyntaxError(f"literal {part!r} contains a character not allowed in a URI")
        return cls(text, tuple(parts))

    def expand(self, values: dict[str, str]) -> str:
        """Expand with string values; variables absent from `values` expand to nothing."""
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(_expand_expression(part, values))
        return "".join(out)

    def match(self, uri: str) -> dict[str, str] | None:
        """Return the percent-decoded variable values if `uri` is an expansion of this template."""
        m = self._regex.fullmatch(uri)
        if m is None:
            return None
        values: dict[str, str] = {}
        groups = m.groupdict()
        for group, name in self._groups.items():
            raw = groups[group]
            if raw is not None:
                values[name] = unquote(raw) if "%" in raw else raw
        query = groups.get("_query")
        if query:
            for name, value in parse_qsl(query.lstrip("?&"), keep_blank_values=True):
                if name in self._query_vars:
                    values.setdefault(name, value)
        return values

    def __repr__(self) -> str:
        return f"UriTemplate({self.text!r})"


def _parse_expression(body: str, position: int) -> _Expr:
    if not body:
        raise TemplateSyntaxError(f"empty expression at position {position}")
    operator = body[0] if body[0] in _OPERATORS else ""
    if body[0] in "=,!@|":
        raise TemplateSyntaxError(f"reserved operator {body[0]!r} at position {position}")
    specs = body[len(operator) :].split(",")
    variables: list[_Var] = []
    for spec in specs:
        explode = spec.endswith("*")
        name = spec[:-1] if explode else spec
        prefix: int | None = None
        if ":" in name:
            name, _, digits = name.partition(":")
            if not digits.isdigit() or not (0 < int(digits) < 10000):
                raise TemplateSyntaxError(f"bad prefix modifier in {{{body}}} at position {position}")
            prefix = int(digits)
        if not _VARNAME.match(name):
            raise TemplateSyntaxError(f"bad variable name {name!r} in {{{body}}} at position {position}")
        variables.append(_Var(name, explode, prefix))
    return _Expr(operator, tuple(variables))


def _compile_matcher(parts: tuple[_Part, ...]) -> tuple[re.Pattern[str], dict[str, str], frozenset[str]]:
    """Build one regex for the whole template; returns it, its group -> variable map and the query variables."""
    pattern: list[str] = []
    groups: dict[str, str] = {}
    first_group: dict[str, str] = {}
    query_vars: set[str] = set()
    has_query = False
    for part in parts:
        if isinstance(part, str):
            pattern.append(re.escape(part))
            continue
        op = part.operator
        if op in ("?", "&"):
            query_vars.update(v.name for v in part.variables)
            if not has_query:
                pattern.append(r"(?P<_query>[?&][^#]*)?")
                has_query = True
            continue
        for position, var in enumerate(part.variables):
            if var.name in first_group:
                # A repeated variable must match the same text.
                body = f"(?P={first_group[var.name]})"
            else:
                group = f"v{len(groups)}"
                groups[group] = var.name
                first_group[var.name] = group
                body = f"(?P<{group}>{_VALUE_PATTERN[op]})"
            if op == ";":
                body = re.escape(var.name) + f"(?:={body})?"
            lead = {"/": "/", ".": r"\.", ";": ";"}.get(op, "," if position else "")
            if op == "#" and position == 0:
                lead = "#"
            pattern.append(lead + body)
    return re.compile("".join(pattern), re.DOTALL), groups, frozenset(query_vars)


def _encode(value: str, operator: str) -> str:
    safe = _UNRESERVED + (_RESERVED if operator in ("+", "#") else "")
    return quote(value, safe=safe)


def _expand_expression(expr: _Expr, values: dict[str, str]) -> str:
    op = expr.operator
    first = {"": "", "+": "", "#": "#", "/": "/", ".": ".", ";": ";", "?": "?", "&": "&"}[op]
    sep = {"": ",", "+": ",", "#": ",", "/": "/", ".": ".", ";": ";", "?": "&", "&": "&"}[op]
    out: list[str] = []
    for var in expr.variables:
        if var.name not in values or values[var.name] is None:
            continue
        value = str(values[var.name])
        if var.prefix is not None:
            value = value[: var.prefix]
        encoded = _encode(value, op)
        if op in ("?", "&"):
            out.append(f"{var.name}={encoded}")
        elif op == ";":
            out.append(f"{var.name}={encoded}" if encoded else var.name)
        else:
            out.append(encoded)
    return first + sep.join(out) if out else ""
