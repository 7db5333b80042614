"""The manifest JSON Schema in force: its text (the published one plus the keys of every registered source kind),
a fresh dict of it, and the form validation uses (every `$ref` inlined), each made once per registry version.

Apart from validate.py so that loading a valid manifest needs no jsonschema (conforms.py checks it first)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from aggregator.sources.registry import only_builtin_kinds, registry_version, source_kinds

__all__ = ["load_schema", "schema_text", "validation_schema"]


def schema_text() -> str:
    """The manifest JSON Schema: the published one with the keys of every registered source kind (the same text
    when only the built-in kinds are)."""
    return _schema_text(registry_version())


@lru_cache(maxsize=1)
def _schema_text(version: int) -> str:
    # Imported here: `python -m aggregator.manifest.schema_build` must find it not yet imported (this package's
    # __init__ imports this module).
    from aggregator.manifest.schema_build import build_schema, dump_schema, published_schema, published_text

    if only_builtin_kinds():  # the published text is this assembly (a test checks it): no copy, no dump
        return published_text()
    return dump_schema(build_schema(published_schema(), source_kinds().values()))


def load_schema() -> dict[str, Any]:
    """The manifest JSON Schema as a fresh dict (callers may change it)."""
    schema: dict[str, Any] = json.loads(schema_text())
    return schema


def validation_schema() -> dict[str, Any]:
    """The schema with every `$ref` inlined (shared: callers must not change it). Resolving a $ref costs more than
    checking most keywords, and the schema has no cycles."""
    return _validation_schema(registry_version())


@lru_cache(maxsize=1)
def _validation_schema(version: int) -> dict[str, Any]:
    schema = load_schema()  # checked against the 2020-12 meta-schema by the tests, not at every start-up
    inlined: dict[str, Any] = _inline_refs(schema, schema.get("$defs", {}))
    return inlined


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        out = {k: _inline_refs(v, defs) for k, v in node.items() if k not in ("$ref", "$defs")}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            # The referring node's own keywords (its description) win over the definition's.
            return {**_inline_refs(defs[ref.removeprefix("#/$defs/")], defs), **out}
        return out
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node
