"""The module layering of docs/design.md, checked: no module imports one of a higher layer (lazy imports too).

Bottom to top: foundations (pure helpers) -> source kinds (the Source interface, what each kind declares, the registry) -> manifest ->
sources and cache -> catalog (value, compiler, renders)
-> service (the read path over one snapshot) -> live and protocol (supervisor, MCP server, transports, CLI).
A new module must be placed in a layer here: the test fails for a module it does not know.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aggregator"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("aggregator", "errors", "paths", "globs", "templates", "content", "logs", "stdout",
                     "terminal_hint", "scaffold", "workers", "watch", "notify", "render_sandbox", "sdk_compat",
                     "tracing", "manifest.model", "manifest.placeholders", "manifest.units", "manifest.source_urls")),
    ("source kinds", ("sources.base", "sources.kind", "sources.builtin", "sources.registry")),
    ("manifest", ("manifest", "manifest.*")),
    ("sources and cache", ("sources", "sources.*", "cache", "cache_keys", "upstream", "upstream.*", "cluster",
                           "cluster.*")),
    ("catalog", ("catalog", "compiler", "snapshot", "render", "completion", "diff", "tools")),
    ("service", ("service", "preflight", "search", "search_meta")),
    ("live and protocol", ("supervisor", "server", "metrics", "metrics_multiprocess", "auth", "http_app",
                           "http_limits", "stdio", "cli", "demo", "__main__", "console", "console.*")),
]


def _layer_of(module: str) -> int | None:
    """The index of the layer naming `module` (exact names first, then `package.*` patterns)."""
    for index, (_, names) in enumerate(LAYERS):
        if module in names:
            return index
    for index, (_, names) in enumerate(LAYERS):
        if any(name.endswith(".*") and module.startswith(name[:-1]) for name in names):
            return index
    return None


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "aggregator"
        found[name] = path
    return found


def _imports(path: Path) -> set[str]:
    """Modules of this package that `path` imports anywhere (top level or inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "aggregator":
                names |= {alias.name for alias in node.names}
            elif node.module.startswith("aggregator."):
                names.add(node.module.removeprefix("aggregator."))
        elif isinstance(node, ast.Import):
            names |= {a.name.removeprefix("aggregator.") for a in node.names if a.name.startswith("aggregator.")}
    return names


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in _modules() if _layer_of(name) is None)
    assert not unplaced, f"place these modules in a layer of tests/test_layers.py (and docs/design.md): {unplaced}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_imports_a_higher_layer(module: str) -> None:
    own = _layer_of(module)
    if own is None:
        pytest.fail(f"{module} has no layer")
    modules = _modules()
    upward = []
    for imported in sorted(_imports(modules[module])):
        if imported not in modules:
            continue  # `from aggregator import __version__` names an attribute, not a module
        layer = _layer_of(imported)
        if layer is not None and layer > own:
            upward.append(f"{imported} ({LAYERS[layer][0]})")
    assert not upward, f"{module} ({LAYERS[own][0]}) imports a higher layer: {', '.join(upward)}"
