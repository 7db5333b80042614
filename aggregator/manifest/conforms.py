"""Whether a manifest conforms to the schema, answered without jsonschema: importing it (with referencing, attrs
and rpds) costs about 40 ms of every server's start, and a manifest being loaded is nearly always valid.

An exact evaluation, with jsonschema's Draft 2020-12 semantics, of the keywords the manifest schema uses, over
plain JSON values. It answers True only when jsonschema would find no error, False when it would find one, and
None when it cannot tell (a keyword, type name or format it does not know, a value that is not plain JSON, a
check that raised something else): on False or None validate.py runs jsonschema, which also words the issues.
tests/test_manifest_conforms.py compares both answers over the test manifests and generated ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aggregator.manifest.formats import FORMATS

__all__ = ["conforms"]

_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated",
                          "readOnly", "writeOnly"})


class _Unsure(Exception):
    """Something this evaluator does not know: jsonschema decides."""


def conforms(schema: Any, value: Any) -> bool | None:
    """True: `value` is valid against `schema` (a $ref-free 2020-12 schema); False: it is not; None: unknown."""
    try:
        if not _plain(value):
            return None
        return _valid(schema, value)
    except _Unsure:
        return None
    except Exception:  # (RecursionError: deeper than any manifest) jsonschema says what it says of it
        return None


def _plain(value: Any) -> bool:
    """Whether `value` holds only what JSON does (str-keyed dicts, lists, str, int, float, bool, None)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float))  # bool is an int


def _valid(schema: Any, value: Any) -> bool:
    if schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        raise _Unsure
    for keyword, expected in schema.items():
        check = _KEYWORDS.get(keyword)
        if check is None:
            if keyword in _ANNOTATIONS:
                continue
            raise _Unsure
        if not check(expected, value, schema):
            return False
    return True


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    raise _Unsure


def _type(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    if not isinstance(names, list):
        raise _Unsure
    return any(_is_type(value, name) for name in names)


def _properties(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, dict):
        return True
    return all(_valid(sub, value[key]) for key, sub in expected.items() if key in value)


def _additional(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, dict):
        return True
    if "patternProperties" in schema:
        raise _Unsure
    known = schema.get("properties", {})
    extras = [key for key in value if key not in known]
    if isinstance(expected, dict):
        return all(_valid(expected, value[key]) for key in extras)
    return bool(expected) or not extras


def _required(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, dict) or all(key in value for key in expected)


def _items(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, list):
        return True
    if "prefixItems" in schema:
        raise _Unsure
    if expected is False:
        return not value
    return all(_valid(expected, item) for item in value)


def _property_names(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, dict) or all(_valid(expected, key) for key in value)


def _one_of(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return sum(1 for sub in expected if _valid(sub, value)) == 1


def _any_of(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return any(_valid(sub, value) for sub in expected)


def _not(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not _valid(expected, value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _minimum(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not _number(value) or not value < expected  # as jsonschema puts it: NaN passes


def _maximum(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not _number(value) or not value > expected


def _min_length(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, str) or len(value) >= expected


def _max_length(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, str) or len(value) <= expected


def _min_items(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, list) or len(value) >= expected


def _max_items(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, list) or len(value) <= expected


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _pattern(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return not isinstance(value, str) or _compiled(expected).search(value) is not None


def _format(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    check = FORMATS.get(expected) if isinstance(expected, str) else None
    if check is None:
        raise _Unsure  # jsonschema passes a format it has no checker for; not guessed here
    try:
        return bool(check(value))
    except ValueError:
        return False
    except Exception:  # jsonschema would let it out of validation: it shall, on its own path
        raise _Unsure from None


def _equal(one: Any, two: Any) -> bool:
    """jsonschema's equality: True and 1 (False and 0) differ, also inside lists and mappings."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(_equal(one[k], two[k]) for k in one)
    if isinstance(one, bool) or isinstance(two, bool):
        return False  # not the same object: True vs 1, False vs 0.0, True vs False
    return bool(one == two)


def _const(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return _equal(value, expected)


def _enum(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    return any(_equal(each, value) for each in expected)


def _unique(expected: Any, value: Any, schema: dict[str, Any]) -> bool:
    if not expected or not isinstance(value, list):
        return True
    if all(isinstance(item, str) for item in value):
        return len(set(value)) == len(value)
    # jsonschema sorts the items and compares neighbours, which for mixed lists is not a pairwise answer.
    raise _Unsure


_KEYWORDS: dict[str, Callable[[Any, Any, dict[str, Any]], bool]] = {
    "type": _type, "properties": _properties, "additionalProperties": _additional, "required": _required,
    "items": _items, "propertyNames": _property_names, "oneOf": _one_of, "anyOf": _any_of, "not": _not,
    "minimum": _minimum, "maximum": _maximum, "minLength": _min_length, "maxLength": _max_length,
    "minItems": _min_items, "maxItems": _max_items, "pattern": _pattern, "format": _format, "const": _const,
    "enum": _enum, "uniqueItems": _unique,
}
