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

__all__ = ["LIST_TOOL", "READ_TOOL", "SEARCH_TOOL", "ToolSpec", "template_tools"]

READ_TOOL = "read_resource"
LIST_TOOL = "list_resources"
SEARCH_TOOL = "search_resources"
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


_READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}

LIST_DEFINITION: dict[str, Any] = {
    "name": LIST_TOOL,
    "title": "List resources",
    "description": "List this server's resources (URI, name, title, description, mimeType, size), a page at a time, "
                   "optionally only those whose URI starts with a prefix, of a MIME type, or whose name matches a "
                   "glob. A page may hold fewer than `limit` resources: continue with `cursor` = `nextCursor` while "
                   "there is one. Read a resource with read_resource.",
    "inputSchema": {"type": "object", "additionalProperties": False, "properties": {
        "prefix": {"type": "string", "description": "Only URIs starting with this, e.g. docs://guides/."},
        "mimeType": {"type": "string", "description": "Only this MIME type, e.g. text/markdown, or text/* ."},
        "name": {"type": "string", "description": "Only names matching this glob (* and ?), case-insensitive."},
        "cursor": {"type": "string", "description": "nextCursor of the previous page."},
        "limit": {"type": "integer", "minimum": 1, "description": "Resources per page at most."},
    }},
    "annotations": _READ_ONLY,
}

SEARCH_DEFINITION: dict[str, Any] = {
    "name": SEARCH_TOOL,
    "title": "Search resources",
    "description": "Search this server's resources by words in their URI, name, title and description, and in the "
                   "text of indexed documents; best matches first, with a snippet where the text matched («» marks "
                   "the words). Every word must match; end a word with * to match its prefix. Read a result with "
                   "read_resource.",
    "inputSchema": {"type": "object", "additionalProperties": False, "required": ["query"], "properties": {
        "query": {"type": "string", "description": "Words to look for, e.g. 'install docker'."},
        "prefix": {"type": "string", "description": "Only URIs starting with this, e.g. docs://guides/."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "Results at most (default 20)."},
    }},
    "annotations": _READ_ONLY,
}


def template_tools(templates: Sequence[TemplateEntry]) -> list[ToolSpec]:
    """`read_resource`, `list_resources`, `search_resources`, then one tool per template, named
    `read_<template name>` (made unique)."""
    tools = [ToolSpec(READ_TOOL, READ_DEFINITION), ToolSpec(LIST_TOOL, LIST_DEFINITION),
             ToolSpec(SEARCH_TOOL, SEARCH_DEFINITION)]
    taken = {READ_TOOL, LIST_TOOL, SEARCH_TOOL}
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
