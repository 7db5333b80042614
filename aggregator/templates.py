"""RFC 6570 URI templates: parse, expand (level 4) and match.

Expansion follows RFC 6570 section 3.2 for every operator (`{var}`, `{+var}`, `{#var}`, `{.var}`, `{/var}`,
`{;var}`, `{?var}`, `{&var}`), prefix modifiers (`{var:3}`) and explode (`{list*}`, `{keys*}`), with string, list
and mapping values.

Matching is the reverse where one is well defined, and runs in time linear in the URI's length for any input:
one RE2 automaton (no backtracking) finds where each expression's text lies, then each expression's text is split
by its operator's separators in a single pass. Values come back percent-decoded: strings, or lists of strings for
exploded variables (`{/path*}` gives ["a", "b", "c"] for `/a/b/c`, `{?tag*}` every `tag=` value). Percent-encoded
bytes that are not UTF-8 decode to U+FFFD, or, for file paths (`undecodable="surrogateescape"`), to surrogate
escapes that `os.fsencode` turns back into those bytes (`caf%E9.md` names the file `b"caf\xe9.md"`). Query
operators match their parameters in any order and treat them as optional, but a parameter the template does not
name, or a second value for a variable that is not exploded, means no match: an expansion never produces either.
A prefix variable (`{var:3}`) matches at most that many characters: its value is the prefix, not the original.
The variables of one expression are read in order, so an absent one's value goes to the next (`{/a,b}` reads
`/x` as a = "x"), and `{+p}{?a}{&b}` with only b given reads back as p = "...&b=1" (reserved text may hold '&').

Where no reverse is well defined:
- Exploded mappings: a template cannot say whether `{?keys*}` holds a list or a mapping, so exploded variables
  match as lists only (`?keys=a&keys=b`); a mapping's expansion (`?semi=%3B&dot=.`) names parameters the
  template does not, so it does not match (it never matches as `{}`).
- Templates whose variables could not be told apart are refused by `parse` (TemplateSyntaxError saying why):
  an exploded variable that is not the last of its expression (`{/a*,b}`), and adjacent expressions where the
  second does not start with its own character (`{a}{b}`, `{+a}{b}`; `{a}{/b}`, `{a}{.b}`, `{a}{?b}` are fine)
  or where the first may hold that character (`{/a*}{/b}`, `{#a}{/b}`, `{?a}{/b}`).
  `parse(text, for_matching=False)` accepts them (every RFC 6570 template expands); `match` then raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

try:  # linear-time matching; the stdlib `re` backtracks (a 400-character URI can take seconds)
    import re2 as _engine

    LINEAR_MATCHING = True
except ImportError:  # pragma: no cover - google-re2 is a core dependency; kept for platforms without a wheel
    _engine = re
    LINEAR_MATCHING = False

__all__ = ["LINEAR_MATCHING", "TemplateSyntaxError", "UriTemplate", "Value"]

Value = str | list[str]
_VARNAME = re.compile(r"^(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*$")
_OPERATORS = "+#./;?&"
_UNRESERVED = "-._~"
_RESERVED = ":/?#[]@!$&'()*+,;="
_PCT = re.compile(r"%[0-9A-Fa-f]{2}")


@dataclass(frozen=True, slots=True)
class _Op:
    """RFC 6570 appendix A: what an operator puts first, between values, and whether values are named."""

    first: str
    sep: str
    named: bool
    if_empty: str
    reserved: bool


_OPS = {
    "": _Op("", ",", False, "", False), "+": _Op("", ",", False, "", True), ".": _Op(".", ".", False, "", False),
    "/": _Op("/", "/", False, "", False), ";": _Op(";", ";", True, "", False), "?": _Op("?", "&", True, "=", False),
    "&": _Op("&", "&", True, "=", False), "#": _Op("#", ",", False, "", True),
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
    # The expression as written (braces included) and where it starts: for error messages only.
    text: str = field(compare=False)
    position: int = field(compare=False)


_Part = str | _Expr


class UriTemplate:
    """A parsed URI template. `variables` lists variable names in order of appearance."""

    __slots__ = ("text", "_parts", "variables", "multi_segment", "reserved", "_matcher", "literal_length",
                 "ambiguity")

    def __init__(self, text: str, parts: tuple[_Part, ...]) -> None:
        self.text = text
        self._parts = parts
        names: list[str] = []
        for part in parts:
            if isinstance(part, _Expr):
                names.extend(v.name for v in part.variables)
        self.variables: tuple[str, ...] = tuple(dict.fromkeys(names))
        # Variables whose value may span several path segments: reserved ones and exploded path segments.
        self.multi_segment: frozenset[str] = frozenset(
            v.name for p in parts if isinstance(p, _Expr) for v in p.variables
            if p.operator in ("+", "#") or (p.operator == "/" and v.explode))
        # Variables expanded without encoding reserved characters or %XX triplets (`{+var}`, `{#var}`): a value
        # may carry percent-encoded bytes, e.g. a completion offering `caf%E9.md` for an undecodable file name.
        self.reserved: frozenset[str] = frozenset(
            v.name for p in parts if isinstance(p, _Expr) and p.operator in ("+", "#") for v in p.variables)
        self.literal_length = sum(len(p) for p in parts if isinstance(p, str))
        self._matcher: _Matcher | None = None
        self.ambiguity: str | None = _ambiguity(parts)
        """Why matching could not tell this template's variables apart, or None when it can be matched."""

    @classmethod
    def parse(cls, text: str, *, for_matching: bool = True) -> UriTemplate:
        """Parse `text`; raise TemplateSyntaxError naming the offending position, or (unless `for_matching` is
        False) saying why a match could not tell its variables apart. Parsed templates are immutable, so each
        text is parsed once per process: loading, checking and compiling a manifest all ask for it."""
        if not isinstance(text, str) or not text:
            raise TemplateSyntaxError("a URI template must be a non-empty string")
        template = _parse_cached(text)
        if for_matching and template.ambiguity is not None:
            raise TemplateSyntaxError(template.ambiguity)
        return template

    @classmethod
    def _parse(cls, text: str) -> UriTemplate:
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

    def expand(self, values: Mapping[str, Any]) -> str:
        """RFC 6570 expansion: values are strings (or numbers), lists or mappings; absent or None ones vanish."""
        return "".join(part if isinstance(part, str) else _expand_expression(part, values) for part in self._parts)

    def match(self, uri: str, undecodable: str = "replace") -> dict[str, Value] | None:
        """The percent-decoded variable values if `uri` is an expansion of this template, else None;
        TemplateSyntaxError if the template is ambiguous (only `parse(..., for_matching=False)` makes one).
        `undecodable` is how %XX bytes that are not UTF-8 decode: "replace" (U+FFFD) or "surrogateescape"."""
        if self.ambiguity is not None:
            raise TemplateSyntaxError(self.ambiguity)
        if self._matcher is None:
            self._matcher = _Matcher(self._parts)  # compiled on first use: validation only needs the parse
        return self._matcher.match(uri, undecodable)

    def __repr__(self) -> str:
        return f"UriTemplate({self.text!r})"


@lru_cache(maxsize=16384)
def _parse_cached(text: str) -> UriTemplate:
    return UriTemplate._parse(text)


def _parse_expression(body: str, position: int) -> _Expr:
    if not body:
        raise TemplateSyntaxError(f"empty expression at position {position}")
    operator = body[0] if body[0] in _OPERATORS else ""
    if body[0] in "=,!@|":
        raise TemplateSyntaxError(f"reserved operator {body[0]!r} at position {position}")
    variables: list[_Var] = []
    for spec in body[len(operator) :].split(","):
        explode = spec.endswith("*")
        name = spec[:-1] if explode else spec
        prefix: int | None = None
        if ":" in name:
            name, _, digits = name.partition(":")
            if explode or not digits.isdigit() or not (0 < int(digits) < 10000):
                raise TemplateSyntaxError(f"bad prefix modifier in {{{body}}} at position {position}")
            prefix = int(digits)
        if not _VARNAME.match(name):
            raise TemplateSyntaxError(f"bad variable name {name!r} in {{{body}}} at position {position}")
        variables.append(_Var(name, explode, prefix))
    return _Expr(operator, tuple(variables), f"{{{body}}}", position)


def _ambiguity(parts: tuple[_Part, ...]) -> str | None:
    """Why a match of these parts could not tell where one variable's text ends, or None if it always can."""
    for part in parts:
        if isinstance(part, _Expr) and any(v.explode for v in part.variables[:-1]):
            return (f"{part.text} at position {part.position}: an exploded variable must be the last of its "
                    "expression, or where its values end is ambiguous")
    for first, second in zip(parts, parts[1:]):
        if not (isinstance(first, _Expr) and isinstance(second, _Expr)):
            continue
        pair = f"{first.text}{second.text} at position {first.position}"
        if second.operator in ("", "+"):
            return (f"{pair}: adjacent variables cannot be told apart when matching (where one ends and the next "
                    f"begins is ambiguous); put a literal between them, or use an operator that starts with its "
                    f"own character such as {{/{second.variables[0].name}}} or {{?{second.variables[0].name}}}")
        lead = _LEADS[second.operator]
        if first.operator == "#":
            return f"{pair}: a fragment expression runs to the end of the URI, so nothing can follow it directly"
        if first.operator in ("?", "&") and second.operator not in ("?", "&", "#"):
            return (f"{pair}: a query expression runs to the fragment, so {second.text} after it cannot be told "
                    "apart from a query value")
        if first.operator == second.operator and first.variables[-1].explode:
            return (f"{pair}: {first.text} takes any number of {lead!r}-led values, so where its list ends and "
                    f"{second.text} begins is ambiguous")
    return None


# --- expansion -------------------------------------------------------------------------------------------------


def _encode(value: str, reserved: bool) -> str:
    if not reserved:
        return quote(value, safe=_UNRESERVED)
    # Reserved expansion keeps reserved characters and existing %XX triplets; everything else is encoded.
    out, pos = [], 0
    for m in _PCT.finditer(value):
        out.append(quote(value[pos : m.start()], safe=_UNRESERVED + _RESERVED))
        out.append(m.group(0))
        pos = m.end()
    out.append(quote(value[pos:], safe=_UNRESERVED + _RESERVED))
    return "".join(out)


def _expand_expression(expr: _Expr, values: Mapping[str, Any]) -> str:
    op = _OPS[expr.operator]
    out: list[str] = []
    for var in expr.variables:
        value = values.get(var.name)
        if value is None:
            continue
        if isinstance(value, Mapping):
            pairs = [(str(k), str(v)) for k, v in value.items() if v is not None]
            if not pairs:
                continue
            if var.explode:
                out.append(op.sep.join(f"{_encode(k, op.reserved)}={_encode(v, op.reserved)}" for k, v in pairs))
            else:
                joined = ",".join(f"{_encode(k, op.reserved)},{_encode(v, op.reserved)}" for k, v in pairs)
                out.append(f"{var.name}={joined}" if op.named else joined)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            items = [str(v) for v in value if v is not None]
            if not items:
                continue
            if var.explode:
                out.append(op.sep.join(_named(var.name, _encode(v, op.reserved), op) if op.named
                                       else _encode(v, op.reserved) for v in items))
            else:
                joined = ",".join(_encode(v, op.reserved) for v in items)
                out.append(f"{var.name}={joined}" if op.named else joined)
        else:
            text = str(value)
            if var.prefix is not None:
                text = text[: var.prefix]
            encoded = _encode(text, op.reserved)
            out.append(_named(var.name, encoded, op) if op.named else encoded)
    return op.first + op.sep.join(out) if out else ""


def _named(name: str, encoded: str, op: _Op) -> str:
    return f"{name}={encoded}" if encoded else name + op.if_empty


# --- matching --------------------------------------------------------------------------------------------------

# The text one expression may span, by operator (its leading character included); `{x}` takes the characters a
# value may not hold, plus the leading character of an expression right after it (`{/a}{.ext}`: no '.' in a).
_EXTENT = {
    "": r"[^/?#&=;{x}]*",
    "+": r"[^?#{x}]*",
    "#": r"(?:#.*)?",
    "/": r"(?:/[^/?#{x}]*)*",
    ".": r"(?:\.[^/?#.{x}]*)*",
    ";": r"(?:;[^/?#;{x}]*)*",
}
# A lone simple or reserved variable must match something: an empty value would make most templates ambiguous.
_LONE = {"": r"[^/?#&=,;{x}]", "+": r"[^?#{x}]"}
_MAX_ENCODED = 12  # the longest a character can be once percent-encoded: four UTF-8 bytes, each %XX
_LEADS = {"#": "#", "/": "/", ".": ".", ";": ";", "?": "?", "&": "&"}


class _Matcher:
    """One RE2 pattern locating every expression's text; the text is then split by the operator in one pass."""

    def __init__(self, parts: tuple[_Part, ...]) -> None:
        pattern: list[str] = []
        self.exprs: list[tuple[str, _Expr]] = []  # (group, expression) for non-query expressions
        self.query_vars: dict[str, _Var] = {}
        # The shortest prefix each prefixed variable has anywhere, query expressions included.
        self.prefixes: dict[str, int] = {}
        has_query = False
        for index, part in enumerate(parts):
            if isinstance(part, str):
                pattern.append(re.escape(part))
                continue
            for var in part.variables:
                if var.prefix is not None:
                    self.prefixes[var.name] = min(var.prefix, self.prefixes.get(var.name, var.prefix))
            op = part.operator
            if op in ("?", "&"):
                self.query_vars.update({v.name: v for v in part.variables})
                if not has_query:
                    pattern.append(r"(?P<q>[?&][^#]*)?")
                    has_query = True
                continue
            group = f"e{len(self.exprs)}"
            following = parts[index + 1] if index + 1 < len(parts) else None
            stop = re.escape(_LEADS.get(following.operator, "")) if isinstance(following, _Expr) else ""
            if stop == r"\?" and not _OPS[op].reserved:
                # With its `{?}` values absent, a query's expansion starts with `{&}`'s '&', which only reserved
                # text may hold: `{+p}{?a}{&b}` with only b reads back as p = "...&b=1" (no unique reverse).
                stop += "&"
            single = len(part.variables) == 1 and not part.variables[0].explode
            prefix = part.variables[0].prefix if single else None
            if single and op in _LONE:
                # Up to n characters for a prefix variable, each up to four UTF-8 bytes as %XX (12 characters),
                # else at least one. RE2 refuses repeat counts over 1000: longer prefixes match like any
                # variable, and match still refuses a value longer than the prefix.
                most = prefix * _MAX_ENCODED if prefix is not None else None
                bounded = most is not None and most <= 1000
                extent = _LONE[op].replace("{x}", stop) + (f"{{1,{most}}}" if bounded else "+")
            else:
                extent = _EXTENT[op].replace("{x}", stop)
                if op in ("/", ".", ";") and not part.variables[-1].explode and len(part.variables) <= 1000:
                    # At most one value per variable: `{/a}{/b}` must leave `/y` of `/x/y` to b.
                    extent = extent[:-1] + f"{{0,{len(part.variables)}}}"
            pattern.append(f"(?P<{group}>{extent})")
            self.exprs.append((group, part))
        self.regex = _engine.compile("(?s)" + "".join(pattern))

    def match(self, uri: str, errors: str = "replace") -> dict[str, Value] | None:
        try:
            m = self.regex.fullmatch(uri)
        except UnicodeEncodeError:  # a lone surrogate (JSON allows "\udcff"): RE2 reads UTF-8, and no URI holds one
            return None
        if m is None:
            return None
        values: dict[str, Value] = {}
        for group, expr in self.exprs:
            found = _split(expr, m.group(group) or "", errors)
            if found is None or not _merge(values, found):
                return None
        query = m.group("q") if self.query_vars else None
        if query:
            given: dict[str, list[str]] = {}
            for name, value in parse_qsl(query[1:], keep_blank_values=True, errors=errors):
                var = self.query_vars.get(name)
                # A name the template lacks is what an exploded mapping's expansion looks like: no reverse.
                if var is None or (name in given and not var.explode):
                    return None
                given.setdefault(name, []).append(value)
            for name, listed in given.items():
                if not _merge(values, {name: listed if self.query_vars[name].explode else listed[0]}):
                    return None
        for name, limit in self.prefixes.items():
            value = values.get(name)
            if isinstance(value, str) and len(value) > limit:
                return None  # an expansion holds at most the prefix
        return values


def _decode(text: str, errors: str = "replace") -> str:
    return unquote(text, errors=errors) if "%" in text else text


def _split(expr: _Expr, text: str, errors: str = "replace") -> dict[str, Value] | None:
    """The values an expression's text holds, or None when it cannot be an expansion of the expression."""
    op, variables = expr.operator, expr.variables
    if op in ("/", ".", ";"):
        if not text:
            return {}
        items = text[1:].split(_OPS[op].sep)
    elif op == "#":
        if not text:
            return {}
        items = text[1:].split(",") if len(variables) > 1 or variables[0].explode else [text[1:]]
    elif len(variables) > 1 or variables[0].explode:
        items = text.split(",") if text else []
    else:
        return {variables[0].name: _decode(text, errors)}
    if op == ";":
        return _named_items(variables, items, errors)
    values: dict[str, Value] = {}
    for i, var in enumerate(variables):
        if var.explode:
            values[var.name] = [_decode(item, errors) for item in items[i:]]
            return values
        if i < len(items):
            values[var.name] = _decode(items[i], errors)
    if len(items) > len(variables):
        return None
    return values


def _named_items(variables: tuple[_Var, ...], items: list[str], errors: str = "replace") -> dict[str, Value] | None:
    """`;name=value` parameters, in any order; an exploded variable collects every value of its name."""
    wanted = {v.name: v for v in variables}
    values: dict[str, Value] = {}
    for item in items:
        name, _, value = item.partition("=")
        var = wanted.get(name)
        if var is None:
            return None
        if var.explode:
            listed = values.setdefault(var.name, [])
            assert isinstance(listed, list)  # only this branch fills an exploded variable's name
            listed.append(_decode(value, errors))
        elif name in values:
            return None
        else:
            values[name] = _decode(value, errors)
    return values


def _merge(values: dict[str, Value], found: Mapping[str, Value]) -> bool:
    """Add `found` to `values`; a variable used twice must have the same value both times."""
    for name, value in found.items():
        if name in values and values[name] != value:
            return False
        values[name] = value
    return True
