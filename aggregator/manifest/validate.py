"""JSON Schema validation (draft 2020-12, formats checked) turned into located, readable issues."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError

from aggregator.manifest.model import ManifestIssue
from aggregator.manifest.yaml_marks import Marked

__all__ = ["load_schema", "schema_text", "validate"]

_JSON_TYPES = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer", float: "number",
               type(None): "null"}
_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("date-time", raises=ValueError)
def _is_datetime(value: object) -> bool:
    if isinstance(value, str):
        if "T" not in value and " " not in value:
            raise ValueError("a date-time needs a time, e.g. 2026-01-15T09:00:00Z")
        datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    return True


@_FORMATS.checks("uri", raises=ValueError)
def _is_uri(value: object) -> bool:
    if isinstance(value, str):
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value):
            raise ValueError("a URI starts with a scheme such as docs: or https:")
        if any(c in value for c in " \t\r\n\"<>\\^`{|}"):
            raise ValueError("a URI cannot hold spaces, quotes, braces or backslashes (percent-encode them)")
    return True


@_FORMATS.checks("uri-template", raises=ValueError)
def _is_uri_template(value: object) -> bool:
    from aggregator.templates import UriTemplate

    if isinstance(value, str):
        UriTemplate.parse(value)
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value):
            raise ValueError("a URI template starts with a scheme such as docs:")
    return True


def schema_text() -> str:
    """The manifest JSON Schema as shipped."""
    try:
        return resources.files("aggregator").joinpath("manifest.schema.json").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return (Path(__file__).resolve().parents[2] / "schemas" / "manifest.schema.json").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    return json.loads(schema_text())


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema(), format_checker=_FORMATS)


def validate(marked: Marked) -> list[ManifestIssue]:
    """Every schema violation in `marked.data`, each located at the key or value at fault."""
    issues: list[ManifestIssue] = []
    for error in _validator().iter_errors(marked.data):
        issues.extend(_explain(error, marked))
    return issues


def _type_name(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _explain(error: ValidationError, marked: Marked) -> list[ManifestIssue]:
    path = tuple(error.absolute_path)
    kind, schema, value = error.validator, error.schema, error.instance
    if kind == "additionalProperties" and isinstance(value, dict):
        allowed = sorted(schema.get("properties", {}))
        extra = [k for k in value if k not in allowed]
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return [marked.issue(path + (k,), f"unknown key {k!r}{hint}", key=True) for k in extra]
    if kind == "required":
        missing = error.validator_value
        names = [k for k in missing if isinstance(value, dict) and k not in value]
        return [marked.issue(path, f"required key {k!r} is missing") for k in names]
    if kind == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        expected = {"object": "mapping", "array": "list"}.get(expected, expected)
        return [marked.issue(path, f"expected {expected}, got {_type_name(value)}")]
    if kind == "propertyNames" or "propertyNames" in error.schema_path:
        return [marked.issue(path + (str(value),), f"{value!r} is not a valid id (letters, digits, _ . -; "
                                                   "starting with a letter or _)", key=True)]
    if kind == "format":
        cause = f": {error.cause}" if error.cause else ""
        return [marked.issue(path, f"{value!r} is not a valid {error.validator_value}{cause}")]
    if kind == "oneOf" and path and path[0] == "resources":
        return [marked.issue(path, "a resource needs either 'text' or both 'source' and 'path' (not both kinds)")]
    if kind == "oneOf" and "description" in schema:
        return [marked.issue(path, f"{value!r} is not valid here: expected {schema['description'][0].lower()}"
                                   f"{schema['description'][1:]}")]
    if kind == "const":
        return [marked.issue(path, f"must be {error.validator_value!r}, got {value!r}")]
    if kind == "enum":
        options = ", ".join(repr(v) for v in error.validator_value)
        return [marked.issue(path, f"{value!r} is not one of {options}")]
    if kind in ("minimum", "maximum", "minLength", "uniqueItems", "pattern"):
        return [marked.issue(path, error.message)]
    return [marked.issue(path, error.message)]
