"""`${VAR}` and `${VAR:-default}` in string values, from the environment; `$${` is a literal `${`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from aggregator.manifest.model import ManifestIssue
from aggregator.manifest.yaml_marks import KeyPath, Marked

__all__ = ["interpolate"]

_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{[^}]*\}?")


def interpolate(marked: Marked, env: Mapping[str, str]) -> list[ManifestIssue]:
    """Replace references in every string value of `marked.data` in place; return problems found.

    Error messages name the variable and the key, never a value.
    """
    issues: list[ManifestIssue] = []
    marked.data = _walk(marked.data, (), marked, env, issues)
    return issues


def _walk(value: Any, path: KeyPath, marked: Marked, env: Mapping[str, str], issues: list[ManifestIssue]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, path + (k,), marked, env, issues) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, path + (i,), marked, env, issues) for i, v in enumerate(value)]
    if isinstance(value, str) and "$" in value:
        result = _substitute(value, path, marked, env, issues)
        if path in marked.plain and result != value:
            return _reread(result)
        return result
    return value


def _substitute(text: str, path: KeyPath, marked: Marked, env: Mapping[str, str],
                issues: list[ManifestIssue]) -> str:
    def replace(match: re.Match[str]) -> str:
        whole = match.group(0)
        if whole == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name is None:
            issues.append(marked.issue(path, f"malformed variable reference {whole!r}; write ${{NAME}} or ${{NAME:-default}}"))
            return whole
        if name in env:
            return env[name]
        if default is not None:
            return default
        issues.append(marked.issue(path, f"environment variable {name} is not set and has no default "
                                         f"(write ${{{name}:-default}} to give one)"))
        return ""

    return _REFERENCE.sub(replace, text)


def _reread(text: str) -> Any:
    """An unquoted `${PORT}` that became `8080` is the number 8080, as if written so."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) else text
