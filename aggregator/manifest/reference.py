"""The manifest reference (docs/manifest-reference.md), generated from the JSON Schema's descriptions.

`python -m aggregator.manifest.reference > docs/manifest-reference.md` rewrites it; a test fails when the file
and the schema disagree, so the reference cannot drift from what `aggregator validate` enforces.
"""

from __future__ import annotations

import json
from typing import Any

from aggregator.manifest.schema import load_schema

__all__ = ["render_reference"]

# Sections in reading order: (heading, JSON pointer into the schema, key-path prefix shown in the table).
_SECTIONS = [
    ("Top level", "", ""),
    ("server", "/properties/server", "server."),
    ("server.http", "/properties/server/properties/http", "server.http."),
    ("server.auth", "/properties/server/properties/auth", "server.auth."),
    ("server.auth.tokens[]", "/properties/server/properties/auth/properties/tokens/items", "tokens[]."),
    ("server.auth.jwt", "/properties/server/properties/auth/properties/jwt", "jwt."),
    ("server.cluster", "/properties/server/properties/cluster", "server.cluster."),
    ("server.search", "/properties/server/properties/search", "server.search."),
    ("server.documents", "/properties/server/properties/documents", "server.documents."),
    ("server.console", "/properties/server/properties/console/oneOf/1", "server.console."),
    ("render", "/properties/render", "render."),
    ("include[]", "/properties/include/items/oneOf/1", "include[]."),
    ("defaults", "/properties/defaults", "defaults."),
    ("defaults.convert, convert", "/$defs/convertLimits", "convert."),
    ("convert (an entry's)", "/$defs/convert/oneOf/1", "convert."),
    ("sources.<id>", "/$defs/source", "sources.<id>."),
    ("sources.<id>.oauth", "/$defs/source/properties/oauth", "oauth."),
    ("resources[]", "/$defs/resource", "resources[]."),
    ("collections[]", "/$defs/collection", "collections[]."),
    ("templates[]", "/$defs/template", "templates[]."),
    ("access", "/$defs/access", "access."),
    ("icons[]", "/$defs/icon", "icons[]."),
    ("annotations", "/$defs/annotations", "annotations."),
]


def _resolve(schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    node: Any = schema
    for part in [p for p in pointer.split("/") if p]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        return {**_resolve(schema, ref[1:]), **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _type_of(schema: dict[str, Any], node: dict[str, Any]) -> str:
    node = _deref(schema, node)
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if kind == "array":
        items = node.get("items", {})
        return f"list of {_type_of(schema, items)}" if isinstance(items, dict) else "list"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind:
        return str(kind)
    for key in ("oneOf", "anyOf"):
        if key in node:
            kinds = dict.fromkeys(_type_of(schema, option) for option in node[key])
            return " \\| ".join(k for k in kinds if k)
    return ""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_reference(schema: dict[str, Any] | None = None) -> str:
    """The reference as Markdown: one table per section, a row per key with its type and description."""
    schema = schema or load_schema()
    out = ["# Manifest reference", "",
           "Generated from `schemas/manifest.schema.json` by `python -m aggregator.manifest.reference`; do not edit "
           "by hand. Put `# yaml-language-server: $schema=<path or URL of the schema>` at the top of a manifest "
           "for completion and these descriptions in your editor.", "",
           f"Schema `$id`: `{schema.get('$id', '')}`", ""]
    shown: set[str] = set()  # a key two sections share (an entry's convert and its limits) gets one row
    for heading, pointer, prefix in _SECTIONS:
        node = _deref(schema, _resolve(schema, pointer)) if pointer else schema
        properties = {k: v for k, v in node.get("properties", {}).items()
                      if k != "$schema" and prefix + k not in shown}
        if not properties:
            continue
        required = set(node.get("required", ()))
        out += [f"## {heading}", "", _cell(node.get("description", "")), "",
                "| key | type | required | description |", "|---|---|---|---|"]
        for key, prop in properties.items():
            shown.add(prefix + key)
            prop = _deref(schema, prop)
            value = prop.get("default")
            # As a manifest writes it (false, not Python's False); a string as it is, unquoted.
            shown_value = value if isinstance(value, str) else json.dumps(value)
            default = f" Default: `{shown_value}`." if "default" in prop else ""
            out.append(f"| `{prefix}{key}` | {_type_of(schema, prop)} | {'yes' if key in required else ''} | "
                       f"{_cell(prop.get('description', ''))}{default} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render_reference(), end="")
