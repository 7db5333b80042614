"""What `aggregator serve` imports over stdio for a manifest of one local folder: nothing that manifest or wire does
not use (issue 25: the suite starts hundreds of server processes, and imports are most of each start's CPU).

A real server process answers the official client (a listing, a read, a read through a template) and writes the
modules it holds when it exits; no timing is asserted. Not listed, because the SDK's low-level server imports them
itself: starlette, sse_starlette (and through it uvicorn), and the OpenTelemetry API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import MODES, write_manifest

_DUMP_AT_EXIT = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: json.dump(sorted(sys.modules), open(sys.argv[1], 'w')))\n"
    "from aggregator.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)

UNUSED = (
    # The SDK's client side and high-level server (its package __init__ files import them; we use neither).
    "mcp.client", "mcp.server.mcpserver", "httpx2",
    # Serving HTTP (auth, limits, the console), clusters, other source kinds, renders, the full-text index, diffs.
    "aggregator.http_app", "aggregator.http_limits", "aggregator.auth", "aggregator.metrics_multiprocess",
    "aggregator.workers", "aggregator.console.app", "aggregator.cluster", "aggregator.live.replicas",
    "aggregator.upstream", "aggregator.sources.sql", "aggregator.sources.http", "aggregator.sources.git",
    "aggregator.sources.filesystem", "aggregator.sources.mcp", "aggregator.render", "aggregator.render_sandbox",
    "aggregator.search_index", "aggregator.diff",
    # What those would bring: metrics, Redis, databases, templates, fsspec, tracing's SDK, document converters;
    # jsonschema only words the issues of a manifest that does not conform (aggregator.manifest.conforms).
    "jsonschema", "referencing", "prometheus_client", "httptools", "redis", "sqlalchemy", "sqlite3", "jinja2", "fsspec", "git",
    "opentelemetry.sdk", "pypdfium2", "openpyxl", "docx", "pptx", "difflib", "urllib.request",
)
"""Modules (and their submodules) a folder-only manifest served over stdio must not import."""


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


@pytest.mark.parametrize("mode", MODES)
def test_a_folder_only_manifest_imports_nothing_it_does_not_use(tmp_path: Path, mode: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# Readme\n", encoding="utf-8")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: plain}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "**/*.md", uri: "docs://{path}", name: "{path}"}
        templates:
          - {uriTemplate: "file://docs/{+path}", name: file, source: docs, path: "{path}"}
        """)
    dump = tmp_path / "modules.json"
    params = StdioServerParameters(
        command=sys.executable, args=["-c", _DUMP_AT_EXIT, str(dump), "serve", str(manifest)],
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": os.environ.get("PATH", "")})

    async def main() -> None:
        async with Client(params, mode=mode, cache=None) as client:  # type: ignore[arg-type]
            listed = await client.list_resources()
            assert [r.uri for r in listed.resources] == ["docs://README.md"]
            assert (await client.read_resource("docs://README.md")).contents[0].text == "# Readme\n"
            assert (await client.read_resource("file://docs/README.md")).contents[0].text == "# Readme\n"

    anyio.run(main)
    modules = json.loads(dump.read_text(encoding="utf-8"))  # written at exit: the client closed stdin
    assert "aggregator.server" in modules and "mcp.server.lowlevel.server" in modules  # it did serve
    unused = [name for name in UNUSED if _loaded(modules, name)]
    assert not unused, f"imported, though this manifest and wire do not use them: {', '.join(unused)}"


_COMPARE_PACKAGES = (
    "import json, sys\n"
    "if sys.argv[1] == 'deferred':\n"
    "    from aggregator.startup import defer_sdk_package_inits\n"
    "    defer_sdk_package_inits()\n"
    "    import mcp.server.lowlevel\n"
    "    assert 'mcp.client' not in sys.modules and 'mcp.server.mcpserver' not in sys.modules\n"
    "from mcp import Client\n"
    "from mcp.server import MCPServer\n"
    "import mcp, mcp.server, mcp.client.client, mcp.server.mcpserver\n"
    "assert Client is mcp.client.client.Client and MCPServer is mcp.server.mcpserver.MCPServer\n"
    "for missing in (mcp, mcp.server):\n"
    "    try:\n"
    "        missing.no_such_name\n"
    "    except AttributeError:\n"
    "        pass\n"
    "    else:\n"
    "        raise AssertionError('a missing name was found')\n"
    "print(json.dumps({name: sorted(vars(sys.modules[name])) for name in ('mcp', 'mcp.server')}))\n"
)


def test_the_deferred_sdk_packages_end_up_as_a_plain_import_makes_them() -> None:
    """`from mcp import Client` after the deferral runs the package's __init__: the same names as a plain import."""
    def names(how: str) -> dict[str, list[str]]:
        done = subprocess.run([sys.executable, "-c", _COMPARE_PACKAGES, how], capture_output=True, text=True,
                              timeout=60, cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert names("deferred") == names("plain")
