"""The tool fallback (`server.tools: true`), for clients that cannot use resources.

`read_resource` reads any URI; each URI template becomes a tool whose input schema is the template's variables,
expanded to a URI and read. Either way the result holds the same contents as `resources/read`, as embedded
resources. Failures come back in-band (`isError`), as tool errors do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aggregator.catalog import TemplateEntry

__all__ = ["READ_TOOL", "ToolSpec", "template_tools"]

READ_TOOL = "read_resource"
_QUERY_EXPR = re.compile(r"\{[?&]([^}]*)\}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its wire definition and, for template tools, the template it fills."""

    name: str
    definition: dict[str, Any]
    template: TemplateEntry | None = None


READ_DEFINITION: dict[str, Any] = {
    "name": READ_TOOL,
    "title": "Read a resource",
    "description": "Read one resource of this server by its URI (as listed by resources/list, or filled in from a "
                   "resource template). Returns the resource's contents.",
    "inputSchema": {"type": "object", "properties": {"uri": {"type": "string", "description": "The resource URI."}},
                    "required": ["uri"], "additionalProperties": False},
    "annotations": {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
}


def template_tools(templates: Sequence[TemplateEntry]) -> list[ToolSpec]:
    """`read_resource`, then one tool per template, named `read_<template name>` (made unique)."""
    tools = [ToolSpec(READ_TOOL, READ_DEFINITION)]
    taken = {READ_TOOL}
    for template in templates:
        base = "read_" + (_NOT_NAME.sub("_", template.spec.name).strip("_") or "template")
        name, n = base[:120], 2
        while name in taken:
            name, n = f"{base[:115]}_{n}", n + 1
        taken.add(name)
        tools.append(ToolSpec(name, _definition(name, template), template))
    return tools


def _definition(name: str, template: TemplateEntry) -> dict[str, Any]:
    spec = template.spec
    optional = {v.strip().rstrip("*").split(":")[0] for expr in _QUERY_EXPR.findall(template.uri_template)
                for v in expr.split(",")}
    properties: dict[str, Any] = {}
    for var in template.template.variables:
        prop: dict[str, Any] = {"type": "string", "description": f"{{{var}}} of {template.uri_template}"}
        if var in spec.values:
            prop["enum"] = list(spec.values[var])
        properties[var] = prop
    about = spec.display.description or spec.display.title or spec.name
    return {
        "name": name,
        "title": spec.display.title or spec.name,
        "description": f"{about} (reads the resource {template.uri_template}).",
        "inputSchema": {"type": "object", "properties": properties, "additionalProperties": False,
                        "required": [v for v in template.template.variables if v not in optional]},
        "annotations": {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                        "openWorldHint": False},
    }


def uri_for(tool: ToolSpec, arguments: dict[str, Any]) -> str:
    """The URI a tool call reads; ValueError naming what is wrong with the arguments."""
    if tool.template is None:
        uri = arguments.get("uri")
        if not isinstance(uri, str) or not uri:
            raise ValueError("argument 'uri' (a string) is required")
        return uri
    variables = tool.template.template.variables
    unknown = sorted(set(arguments) - set(variables))
    if unknown:
        raise ValueError(f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(variables)}")
    required = tool.definition["inputSchema"]["required"]
    missing = [v for v in required if not isinstance(arguments.get(v), str) or not arguments.get(v)]
    if missing:
        raise ValueError(f"missing argument(s): {', '.join(missing)}")
    return tool.template.template.expand({k: str(v) for k, v in arguments.items() if v is not None})
