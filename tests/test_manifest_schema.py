"""The JSON Schema: 2020-12, an $id, closed objects, a description on every key, shipped with the package."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from aggregator.manifest import load_schema, schema_text
from aggregator.manifest.validate import FORMAT_CHECKER

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
    assert schema["$id"] == "https://aggregator.dev/schemas/manifest-v1.json"
    Draft202012Validator.check_schema(schema)  # a valid 2020-12 schema itself


def test_shipped_in_the_package_and_identical_to_schemas_folder() -> None:
    shipped = resources.files("aggregator").joinpath("manifest.schema.json")
    assert shipped.is_file()
    assert json.loads(shipped.read_text(encoding="utf-8")) == json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())
    assert json.loads(schema_text()) == load_schema()


def test_load_schema_returns_a_copy() -> None:
    load_schema()["properties"].clear()
    assert "sources" in load_schema()["properties"]


def test_every_property_has_a_description() -> None:
    props = [(f"{path}/{name}", prop) for path, node in walk(load_schema()) if isinstance(node.get("properties"), dict)
             for name, prop in node["properties"].items()]
    assert len(props) > 50  # the walk really reached the nested shapes
    assert [p for p, prop in props if not (isinstance(prop.get("description"), str) and prop["description"].strip())] == []


def test_every_shared_shape_has_a_description() -> None:
    assert [name for name, shape in load_schema()["$defs"].items() if not shape.get("description")] == []


def test_every_object_is_closed() -> None:
    open_objects = [path for path, node in walk(load_schema())
                    if node.get("type") == "object" and "additionalProperties" not in node
                    and not path.endswith("/options")]
    assert open_objects == []
    assert load_schema()["additionalProperties"] is False


def test_shared_shapes_are_defined_once() -> None:
    defs = load_schema()["$defs"]
    assert {"duration", "size", "icon", "icons", "annotations", "title", "description", "mimeType"} <= set(defs)
    refs = {node["$ref"] for _, node in walk(load_schema()) if "$ref" in node}
    assert {f"#/$defs/{name}" for name in defs} <= refs  # and every one is used


def test_top_level_keys() -> None:
    schema = load_schema()
    assert set(schema["properties"]) >= {"$schema", "version", "server", "defaults", "sources", "resources",
                                         "collections", "templates"}
    assert schema["required"] == ["version", "server"]
    assert schema["properties"]["version"]["const"] == 1


def validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema(), format_checker=FORMAT_CHECKER)


@pytest.mark.parametrize("sample", sorted((ROOT / "sample-configs").glob("*.yaml")), ids=lambda p: p.name)
def test_sample_manifests_are_valid_against_the_raw_schema(sample: Path) -> None:
    # What an editor checks, with ${VARS} left as written.
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(sample.read_text()))]
    assert errors == []


@pytest.mark.parametrize(("fragment", "valid"), [
    ({"defaults": {"ttl": "1h30m"}}, True),
    ({"defaults": {"ttl": 90}}, True),
    ({"defaults": {"ttl": -1}}, False),
    ({"defaults": {"ttl": "90"}}, False),
    ({"defaults": {"maxBytes": "10MiB"}}, True),
    ({"defaults": {"maxBytes": 1.5}}, False),
    ({"server": {"name": "x", "pageSize": 0}}, False),
    ({"server": {"name": "x", "pageSize": 1000}}, True),
    ({"server": {"name": "x", "pageSize": 1001}}, False),
    ({"sources": {"ok_id-1.x": {"url": "./d"}}}, True),
    ({"sources": {"1bad": {"url": "./d"}}}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "text/plain; charset=utf-8"}]}, True),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "markdown"}]}, False),
    # A type is sent as an HTTP header (the console's raw view) and shown to clients: no control characters.
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "image/png; x=\x01"}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "image/png;\r\nX-Injected: 1"}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "image/png;\rx=1"}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "text/plain\n"}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "mimeType": "text/csv;\theader=present"}]}, True),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "size": -1}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t",
                     "annotations": {"audience": ["user"], "priority": 0, "lastModified": "2026-01-02T03:04:05Z"}}]}, True),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "annotations": {"lastModified": "2026-01-02"}}]}, False),
    ({"resources": [{"uri": "x://a", "name": "a", "text": "t", "icons": [{"src": "https://i/x.png", "sizes": ["48x48", "any"],
                                                                         "theme": "light"}]}]}, True),
    ({"collections": [{"source": "s", "glob": "**/*.md", "uri": "no-scheme/{path}"}]}, False),
    ({"templates": [{"uriTemplate": "x://{+path}", "name": "t", "source": "s", "path": "{path}"}]}, True),
])
def test_schema_fragments(fragment: dict[str, Any], valid: bool) -> None:
    manifest = {"version": 1, "server": {"name": "t"}, **fragment}
    assert validator().is_valid(manifest) is valid
