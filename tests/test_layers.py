"""The module layering of docs/design.md, checked: no module imports one of a higher layer (lazy imports too).

Bottom to top: foundations (pure helpers) -> source kinds (the Source interface, what each kind declares, the registry) -> manifest ->
sources and cache -> catalog (value, compiler, renders)
-> service (the read path over one snapshot) -> live and protocol (supervisor, MCP server, transports, CLI).
A new module must be placed in a layer here: the test fails for a module it does not know.
Within a layer imports go one way too (no cycle between modules, lazy imports included), and no module is past
`MAX_LINES` (one concept per module).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aggregator"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("aggregator", "errors", "paths", "codec", "direct_pipe", "globs", "templates", "content", "logs", "stdout",
                     "terminal_hint", "scaffold", "stopping", "event_loop", "workers", "folder_watch", "inotify_watch", "watch", "listing_change", "notify", "render_sandbox",
                     "sdk_compat", "chunked", "startup", "tracing", "heap", "manifest.model", "manifest.placeholders",
                     "manifest.units", "manifest.source_urls", "connect_errors", "s3_client")),
    ("source kinds", ("sources.base", "sources.kind", "sources.builtin", "sources.registry")),
    ("manifest", ("manifest", "manifest.*")),
    ("sources and cache", ("sources", "sources.*", "cache", "cache_keys", "upstream", "upstream.*", "cluster",
                           "cluster.*", "documents", "documents.*")),
    ("catalog", ("entry", "entry_spans", "catalog_rows", "row_blocks", "upstream_rows", "path_index", "entry_builder", "catalog", "rows_change", "compiler", "catalog_delta",
                 "catalog_published", "recompile", "snapshot", "render", "completion", "diff", "tools")),
    ("service", ("service", "reload", "reads", "reads.*", "preflight", "search", "search_query", "search_list",
                 "search_index", "search_indexer", "search_meta")),
    ("live and protocol", ("supervisor", "live", "live.*", "server", "handlers", "handlers.*", "mcp_shapes",
                           "listing_json",
                           "metrics", "metrics_multiprocess", "auth", "callers", "http_app", "http_fast", "http_long_reads",
                           "http_writes", "http_gone", "http_stop",
                           "http_limits", "wire_results", "stdio_relay", "stdio_seen", "stdio_fast", "stdio_terminal", "stdio", "serve_http", "exits", "serve_command", "cli", "demo", "launch", "__main__", "console",
                           "console.*")),
]


MAX_LINES = 500


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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_imports_go_one_way() -> None:
    """No two modules import each other, directly or around a longer loop, lazy and TYPE_CHECKING imports included."""
    modules = _modules()
    graph = {name: {i for i in _imports(path) if i in modules and i != name} for name, path in modules.items()}
    assert _cycles(graph) == [], "import cycles (move the shared piece to a lower module, or invert one import)"


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_past_max_lines() -> None:
    long = {name: lines for name, path in _modules().items()
            if (lines := _lines(path)) > MAX_LINES}
    assert long == {}, f"split these modules (one concept per module, at most {MAX_LINES} lines)"

