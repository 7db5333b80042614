"""Safe YAML loading that remembers where every key and value was written.

Only YAML's standard tags are accepted (no Python objects). Duplicate keys are errors. Timestamps stay
strings (they are validated as `date-time` strings by the schema, not turned into datetime objects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from aggregator.manifest.model import ManifestIssue

__all__ = ["KeyPath", "Marked", "load_marked", "format_path"]

KeyPath = tuple[str | int, ...]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_STANDARD_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in
                           ("map", "seq", "str", "int", "float", "bool", "null", "timestamp", "binary"))


@dataclass
class Marked:
    """A plain Python tree plus the 1-based (line, col) of each value and of each mapping key."""

    file: str
    data: Any
    values: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    plain: set[KeyPath] = field(default_factory=set)
    """Paths of unquoted scalars: after `${VAR}` interpolation they are re-read as YAML (numbers, booleans)."""

    def where(self, path: KeyPath, *, key: bool = False) -> tuple[int, int]:
        """The closest known position for `path` (walking up to the parent when unknown)."""
        table = self.keys if key else self.values
        while path:
            if path in table:
                return table[path]
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), (1, 1))

    def issue(self, path: KeyPath, message: str, *, key: bool = False) -> ManifestIssue:
        line, col = self.where(path, key=key)
        return ManifestIssue(self.file, line, col, format_path(path), message)


def format_path(path: KeyPath) -> str:
    """`('resources', 0, 'uri')` -> `resources[0].uri`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_marked(text: str, file: str) -> tuple[Marked | None, list[ManifestIssue]]:
    """Parse `text`; return the marked tree, or None and the located problems."""
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        return None, [ManifestIssue(file, line, col, "", f"YAML syntax error: {problem}")]
    except yaml.YAMLError as exc:
        return None, [ManifestIssue(file, 1, 1, "", f"YAML error: {exc}")]
    if node is None:
        return None, [ManifestIssue(file, 1, 1, "", "the manifest is empty")]
    marked = Marked(file, None)
    issues: list[ManifestIssue] = []
    marked.data = _build(node, (), marked, issues, yaml.constructor.SafeConstructor())
    if not isinstance(marked.data, dict):
        issues.append(marked.issue((), "the manifest must be a mapping (key: value pairs) at the top level"))
    return marked, issues


def _build(node: yaml.Node, path: KeyPath, marked: Marked, issues: list[ManifestIssue],
           constructor: yaml.constructor.SafeConstructor) -> Any:
    marked.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if node.tag not in _STANDARD_TAGS:
        issues.append(marked.issue(path, f"unsupported YAML value: tag {node.tag!r} is not allowed"))
        return None
    if isinstance(node, yaml.MappingNode):
        return _build_mapping(node, path, marked, issues, constructor)
    if isinstance(node, yaml.SequenceNode):
        return [_build(child, path + (i,), marked, issues, constructor) for i, child in enumerate(node.value)]
    if node.tag == _TIMESTAMP:
        return node.value
    if node.style is None and "${" in node.value:
        marked.plain.add(path)
    try:
        return constructor.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        issues.append(marked.issue(path, f"unsupported YAML value: {exc.problem}"))
        return None


def _build_mapping(node: yaml.MappingNode, path: KeyPath, marked: Marked, issues: list[ManifestIssue],
                   constructor: yaml.constructor.SafeConstructor) -> dict[str, Any]:
    result: dict[str, Any] = {}
    first_seen: dict[str, int] = {}
    merged: list[yaml.MappingNode] = []
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            merged.extend(n for n in sources if isinstance(n, yaml.MappingNode))
            continue
        line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
        if not isinstance(key_node, yaml.ScalarNode):
            issues.append(ManifestIssue(marked.file, line, col, format_path(path), "mapping keys must be plain strings"))
            continue
        key = str(key_node.value)
        if key in first_seen:
            issues.append(ManifestIssue(marked.file, line, col, format_path(path + (key,)),
                                        f"duplicate key {key!r} (first defined on line {first_seen[key]})"))
            continue
        first_seen[key] = line
        marked.keys[path + (key,)] = (line, col)
        result[key] = _build(value_node, path + (key,), marked, issues, constructor)
    # YAML merge keys (`<<: *defaults`): explicit keys win over merged ones.
    for source in merged:
        for key, value in _build_mapping(source, path, marked, issues, constructor).items():
            result.setdefault(key, value)
    marked.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    return result
