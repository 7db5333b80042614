"""The JSON Schema: 2020-12, an $id, closed objects and a description on every key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from aggregator.manifest import load_schema, schema_text

ROOT = Path(__file__).resolve().parents[1]


def walk(node: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}/{i}")


def test_schema_identity() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("https://")
    assert json.loads(schema_text()) == json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())


def test_every_property_has_a_description() -> None:
    missing = [f"{path}/{name}" for path, node in walk(load_schema()) if isinstance(node.get("properties"), dict)
               for name, prop in node["properties"].items() if not prop.get("description")]
    assert missing == []


def test_every_object_is_closed() -> None:
    open_objects = [path for path, node in walk(load_schema())
                    if node.get("type") == "object" and "additionalProperties" not in node and not path.endswith("/options")]
    assert open_objects == []
