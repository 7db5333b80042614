"""JSON Schema validation (draft 2020-12, formats checked) turned into located, readable issues.

jsonschema (with referencing, attrs, rpds: about 40 ms of CPU to import) is needed only for a manifest that does not
conform: aggregator.manifest.load asks conforms.py first, and imports this module when the answer is not yes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match

from aggregator.manifest.formats import FORMATS
from aggregator.manifest.model import ManifestIssue
from aggregator.manifest.schema import load_schema, schema_text, validation_schema
from aggregator.manifest.yaml_marks import KeyPath, Marked
from aggregator.sources.registry import registry_version

__all__ = ["FORMAT_CHECKER", "load_schema", "schema_text", "validate"]

_TYPE_NAMES = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer", float: "number",
               type(None): "null"}
_SCHEMA_TYPE_NAMES = {"object": "mapping", "array": "list"}
_BOUNDS = {"minimum": "at least", "exclusiveMinimum": "more than", "maximum": "at most", "exclusiveMaximum": "less than"}

FORMAT_CHECKER = FormatChecker(formats=())
"""Only our own checkers (aggregator.manifest.formats)."""
for _name, _check in FORMATS.items():
    FORMAT_CHECKER.checks(_name, raises=ValueError)(_check)


def validate(marked: Marked) -> list[ManifestIssue]:
    """Every schema violation in `marked.data`, each located at the key or value at fault."""
    issues = [issue for error in _validator().iter_errors(marked.data) for issue in _explain(error, marked)]
    return list(dict.fromkeys(issues))  # `required` reports once per missing key; each is explained once


def _validator() -> Draft202012Validator:
    return _validator_for(registry_version())


@lru_cache(maxsize=1)
def _validator_for(version: int) -> Draft202012Validator:
    return Draft202012Validator(validation_schema(), format_checker=FORMAT_CHECKER)


def _pattern_hints() -> dict[str, str]:
    return _pattern_hints_for(registry_version())


@lru_cache(maxsize=1)
def _pattern_hints_for(version: int) -> dict[str, str]:
    """pattern -> the description of the schema node that declares it, to explain a mismatch in words."""
    return {node["pattern"]: node["description"] for node in _walk(load_schema())
            if isinstance(node.get("pattern"), str) and isinstance(node.get("description"), str)}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _explain(error: ValidationError, marked: Marked) -> list[ManifestIssue]:
    """One or more issues, in words a manifest author can act on, for one jsonschema error."""
    path: KeyPath = tuple(error.absolute_path)
    kind, expected, schema = error.validator, _keyword_value(error), _schema(error)
    value: Any = error.instance  # a JSON value (the stubs' Unset: only on an error built by hand)
    if kind == "additionalProperties" and isinstance(value, dict):
        return [marked.issue(path + (k,), _unknown_key(k, schema), key=True)
                for k in value if k not in schema.get("properties", {})]
    if kind == "required" and isinstance(value, dict):
        return [marked.issue(path, f"required key {k!r} is missing") for k in expected if k not in value]
    if "propertyNames" in error.schema_path:
        return [marked.issue(path + (value,), f"{value!r} is not a valid id: use letters, digits, '_', '.' and '-', "
                                              "starting with a letter or '_'", key=True)]
    if kind == "oneOf":
        return _explain_choice(error, marked, path)
    if kind == "type":
        return [marked.issue(path, _type_message(expected, value, schema, path in marked.interpolated))]
    return [marked.issue(path, _message(error, marked.quote(path, value), marked.hides(path)))]


def _type_message(expected: str | list[str], value: Any, schema: Mapping[str, Any], from_env: bool) -> str:
    names = [_SCHEMA_TYPE_NAMES.get(t, t) for t in ([expected] if isinstance(expected, str) else expected)]
    # A duration or size says what it is better than "string or number" does.
    hint = _pattern_hints().get(schema.get("pattern", "")) if len(names) > 1 else None
    message = f"expected {_lower_first(hint) if hint else ' or '.join(names)}, got {_type_name(value)}"
    if from_env:
        return message + " (after substituting environment variables)"
    if names == ["string"] and isinstance(value, (bool, int, float)):
        return message + "; put it in quotes to keep it as text"  # `name: no`, `version: 1.10`
    if value is None and names in (["list"], ["mapping"]):
        return message + ("; write [] for an empty list" if names == ["list"] else "; write {} for an empty mapping")
    return message


def _message(error: ValidationError, shown: str, from_env: bool) -> str:
    kind, expected, value = error.validator, _keyword_value(error), error.instance
    if kind == "format":
        cause = str(error.cause) if error.cause else ""
        if from_env and isinstance(value, str) and value and value in cause:
            cause = ""
        return f"{shown} is not a valid {expected}" + (f": {cause}" if cause else "")
    if kind == "pattern":
        hint = _pattern_hints().get(expected)
        return f"{shown} is not valid here: " + (f"expected {_lower_first(hint)}" if hint else f"it must match {expected}")
    if kind == "const":
        return f"must be {expected!r}, got {shown}"
    if kind == "enum":
        return f"{shown} is not one of: {', '.join(repr(v) for v in expected)}"
    if kind in _BOUNDS:
        return f"must be {_BOUNDS[kind]} {expected}, got {shown}"
    if kind == "minLength" and expected == 1:
        return "must not be empty"
    if kind == "uniqueItems":
        return "lists the same value more than once"
    # jsonschema's own wording quotes the value: not when it came from the environment.
    return f"the value is not valid here ({kind}: {expected!r})" if from_env else error.message


def _explain_choice(error: ValidationError, marked: Marked, path: KeyPath) -> list[ManifestIssue]:
    """A `oneOf` failure: the entry kinds get a sentence of their own, value choices their closest miss."""
    value = error.instance
    if not isinstance(value, dict) and len(path) == 2 and path[0] in ("resources", "templates"):
        return []  # not a mapping at all: the type error says so, a choice of keys means nothing here
    if isinstance(value, dict) and path[:1] == ("resources",):
        return [marked.issue(path, _resource_kind_message(value))]
    if isinstance(value, dict) and path[:1] == ("templates",):
        both = "path" in value and "query" in value
        return [marked.issue(path, "give either 'path' or 'query' (SQL sources), not both" if both else
                             "required key 'path' is missing (or 'query' for a SQL source)")]
    here = [e for e in error.context if not e.relative_path]
    if here and all(e.validator == "type" for e in here):
        # The wrong kind of value for every choice: name all the kinds it may be.
        wanted = [_keyword_value(e) for e in here]
        kinds = [t for w in wanted for t in ([w] if isinstance(w, str) else w)]
        return [marked.issue(path, _type_message(list(dict.fromkeys(kinds)), value, {},
                                                 path in marked.interpolated))]
    formats = [e for e in here if e.validator == "format"]
    consts = [e.validator_value for e in here if e.validator == "const"]
    if formats and consts:
        # A format or a keyword (`lastModified: file`): the format says what was meant, the keywords follow.
        issue = _explain(formats[0], marked)[0]
        return [replace(issue, message=issue.message + "; or " + " or ".join(repr(c) for c in consts))]
    closest = best_match(error.context) if error.context else None
    return [marked.issue(path, error.message)] if closest is None else _explain(closest, marked)


def _resource_kind_message(value: dict[str, Any]) -> str:
    has = {k for k in ("text", "source", "path") if k in value}
    if "text" in has and has & {"source", "path"}:
        return "a resource has either 'text' or both 'source' and 'path', not both kinds"
    if has == {"source"}:
        return "required key 'path' is missing: a resource with 'source' names a file in it with 'path'"
    if has == {"path"}:
        return "required key 'source' is missing: 'path' names a file inside a source"
    return "a resource needs either 'text' (inline content) or both 'source' and 'path'"


def _keyword_value(error: ValidationError) -> Any:
    """The failing keyword's value in the schema (a JSON value). Every error a validator yields has one; the
    stubs also allow Unset, which only an error built by hand carries."""
    return error.validator_value


def _schema(error: ValidationError) -> Mapping[str, Any]:
    """The (sub)schema whose keyword failed; a boolean schema has no keywords to report."""
    return error.schema if isinstance(error.schema, Mapping) else {}


def _unknown_key(key: str, schema: Mapping[str, Any]) -> str:
    allowed = list(schema.get("properties", {}))
    import difflib  # a mistake's suggestion: a valid manifest never needs it

    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{guess}; expected one of: {', '.join(allowed)}" if allowed else \
        f"unknown key {key!r}; no keys are allowed here"


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _lower_first(text: str) -> str:
    """"A duration such as 5m." -> "a duration such as 5m", to follow "expected"."""
    text = text.rstrip(".")
    first, _, rest = text.partition(" ")
    return f"{first.lower()} {rest}" if first in ("A", "An") else text
