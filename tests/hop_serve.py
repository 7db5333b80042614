"""`python tests/hop_serve.py serve M.yaml ...`: aggregator's CLI with an `mcptest` source kind registered by hand
(an upstream MCP server's resources through `McpSource`; options: `command`, `root`), until the `mcp` kind is wired.
Used by tests/test_upstream.py (aggregator serving aggregator) and benchmarks/upstream_hop.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.cli import main  # noqa: E402
from aggregator.sources import register_source_kind  # noqa: E402
from aggregator.sources.kind import EMPTY, Setting, SourceKind  # noqa: E402
from aggregator.sources.mcp import McpSource  # noqa: E402
from aggregator.upstream import StdioTarget, Upstream  # noqa: E402


class McpTestKind(SourceKind):
    """`mcptest://...` with `options: {command, env, root}`: an upstream over stdio."""

    name = "mcptest"
    schemes = frozenset({"mcptest"})
    settings = {"options": Setting({"type": "object"}, EMPTY)}

    def open(self, spec: Any) -> McpSource:
        options = spec.settings["options"]
        target = StdioTarget(list(options["command"]), env=dict(options.get("env", {})))
        upstream = Upstream(spec.id, target, timeout=spec.timeout, connect_timeout=max(spec.timeout, 20.0),
                            max_concurrency=spec.max_concurrency)
        return McpSource(spec.id, upstream, root=options.get("root", ""))


register_source_kind("mcptest", McpTestKind)

if __name__ == "__main__":
    raise SystemExit(main())
