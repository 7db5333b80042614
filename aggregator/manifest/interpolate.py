"""`${VAR}` and `${VAR:-default}` in string values, from the environment; `$${` is a literal `${`.

As in a shell, the default also applies when the variable is set but empty. Keys are never interpolated,
and no message ever quotes a variable's value: manifests carry credentials this way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from aggregator.manifest.model import ManifestIssue, is_url
from aggregator.manifest.yaml_marks import KeyPath, Marked

__all__ = ["UnresolvedReference", "expand", "interpolate", "substitute"]

# One alternation so a single left-to-right scan decides what each `$` starts: an escape, a well-formed
# reference, or the start of a malformed one (reported rather than left as confusing literal text).
_REFERENCE = re.compile(
    r"\$\$\{"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>(?:[^}$]|\$(?!\{))*))?\}"
    r"|(?P<bad>\$\{[^}]*\}?)"
)


class UnresolvedReference(ValueError):
    """A reference that cannot be replaced; the message names the variable, never a value."""


def substitute(text: str, env: Mapping[str, str]) -> str:
    """`text` with every reference replaced; UnresolvedReference naming every unset or malformed one."""
    result, problems = expand(text, env)
    if problems:
        raise UnresolvedReference("; ".join(problems))
    return result


def expand(text: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """`text` with what can be replaced replaced, and a sentence for each reference that cannot."""
    problems: list[str] = []

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        if match.group("bad") is not None:
            problems.append(f"malformed variable reference {_shorten(match.group('bad'))}; write ${{NAME}} or "
                            "${NAME:-default} (NAME: letters, digits and _), or $${ for a literal ${")
            return match.group(0)
        name, default = match.group("name"), match.group("default")
        value = env.get(name)
        if value:
            return value
        if default is not None:
            return default
        if value is None:
            problems.append(f"environment variable {name} is not set (set it, or give a default: "
                            f"${{{name}:-default}})")
        return ""  # set but empty, and no default: empty is what was asked for

    return (_REFERENCE.sub(replace, text) if "$" in text else text), problems


def interpolate(marked: Marked, env: Mapping[str, str]) -> list[ManifestIssue]:
    """Replace references in every string value of `marked.data` in place; return the problems found."""
    issues: list[ManifestIssue] = []
    marked.data = _walk(marked.data, (), marked, env, issues)
    return issues


def _walk(value: Any, path: KeyPath, marked: Marked, env: Mapping[str, str], issues: list[ManifestIssue]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, path + (k,), marked, env, issues) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, path + (i,), marked, env, issues) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    file = marked.file_of(path)
    if is_url(file):
        # A manifest fetched from a URL was written elsewhere: it must not read (and could leak) this server's
        # environment. Defaults and `$${` still work.
        result, problems = expand(value, {})
        problems = [f"a manifest read from a URL ({file}) cannot read the server's environment (${{{p.split()[2]}}}): "
                    "give a default (${NAME:-value}) or set the value in the including manifest"
                    if p.startswith("environment variable") else p for p in problems]
    else:
        result, problems = expand(value, env)
    if problems:
        issues.extend(marked.issue(path, problem) for problem in problems)
        marked.refused.add(path)
        return value
    if "${" in value.replace("$${", ""):
        marked.interpolated.add(path)
    if path in marked.plain and result != value:
        return _reread(result)
    return result


def _reread(text: str) -> Any:
    """An unquoted `${PORT}` that became `8080` is the number 8080, as if it had been written so."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool)) else text


def _shorten(reference: str) -> str:
    # The text after `${` was written in the manifest, not taken from the environment: safe to quote.
    return repr(reference if len(reference) <= 40 else reference[:37] + "...")
