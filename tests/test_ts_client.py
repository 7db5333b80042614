"""Interop with a client that is not ours: the TypeScript SDK's `Client` (what Node-based hosts and the MCP
Inspector are built on, from npm, as CI installs it) against `aggregator serve` over stdio and Streamable HTTP.
It lists every page, lists templates, reads one at a time and many at once (the fast paths' pipelining), reads a
missing URI and pings; a scoped token sees and reads only what its scope allows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.served import serve_http

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / ".node" / "node_modules"
SDK = NODE_MODULES / "@modelcontextprotocol" / "sdk" / "package.json"
SCRIPT = HERE / "data" / "ts_client.mjs"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not SDK.exists(),
    reason=f"node or the TypeScript SDK is missing ({SDK.relative_to(HERE.parent)}: .ci/run installs it with npm)")

FILES = 120
MANIFEST = """\
version: 1
server:
  name: ts-interop
  pageSize: 50
%(auth)s
sources:
  docs: {url: ./docs}
  secret: {url: ./secret%(secret_access)s}
collections:
  - {source: docs, glob: "**/*.md", uri: "docs://{path}"}
  - {source: secret, glob: "*.md", uri: "secret://{path}"}
templates:
  - {uriTemplate: "docs://{name}.md", name: doc, source: docs, path: "{name}.md", mimeType: text/markdown}
"""
AUTH = """\
  auth:
    tokens:
      - {name: reader, token: "${READER_TOKEN}", scopes: [docs]}"""
READER = "reader-token-0123456789abcdef"


def _folder(tmp_path: Path, auth: bool) -> Path:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    for i in range(FILES):
        where = "sub/" if i % 3 == 0 else ""
        (tmp_path / "docs" / f"{where}f{i:03}.md").write_text(f"# file {i}\nnaïve ✓ {i}\n")
    (tmp_path / "secret" / "plan.md").write_text("classified\n")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(MANIFEST % {"auth": AUTH if auth else "",
                                    "secret_access": ", access: {scopes: [secret]}" if auth else ""})
    # ESM resolves packages from the script's own folder up: a node_modules beside the copy finds the SDK.
    (tmp_path / "node_modules").symlink_to(NODE_MODULES)
    shutil.copy(SCRIPT, tmp_path / "ts_client.mjs")
    return manifest


def _run(tmp_path: Path, target: list[str], uris: list[str], missing: str = "docs://no/such/file.md",
         env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(["node", str(tmp_path / "ts_client.mjs"), *target, "--", *uris], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **(env or {}), "MISSING_URI": missing})
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _expected(i: int) -> str:
    return f"# file {i}\nnaïve ✓ {i}\n"


def _uri(i: int) -> str:
    return f"docs://{'sub/' if i % 3 == 0 else ''}f{i:03}.md"


def _check(got: dict[str, Any], picked: list[int], listed: int) -> None:
    assert got["server"]["name"] == "ts-interop" and got["pinged"] is True
    assert got["capabilities"]["resources"]["listChanged"] is True
    uris = [r["uri"] for r in got["resources"]]
    assert len(uris) == len(set(uris)) == listed  # every page, nothing twice
    assert all(r["mimeType"] == "text/markdown" and r["name"] for r in got["resources"] if r["uri"].startswith("docs"))
    assert [t["uriTemplate"] for t in got["templates"]] == ["docs://{name}.md"]
    assert got["reads"] == got["batch"] == {_uri(i): _expected(i) for i in picked}
    assert got["missing"]["code"] == -32002 and got["missing"]["data"] == {"uri": "docs://no/such/file.md"}


# The fast paths (stdio_fast, http_fast) and the SDK's path must answer this client alike.
PATHS = pytest.mark.parametrize("fast", ["1", "0"], ids=["fast-path", "sdk-path"])


@PATHS
def test_the_typescript_client_lists_and_reads_over_stdio(tmp_path: Path, fast: str) -> None:
    manifest = _folder(tmp_path, auth=False)
    picked = [0, 1, 2, 57, 119]
    got = _run(tmp_path, ["stdio", sys.executable, "-m", "aggregator", "serve", str(manifest)],
               [_uri(i) for i in picked], env={"AGGREGATOR_STDIO_FAST": fast})
    _check(got, picked, FILES + 1)
    assert "secret://plan.md" in {r["uri"] for r in got["resources"]}


@PATHS
def test_the_typescript_client_lists_and_reads_over_http_with_a_scoped_token(tmp_path: Path, fast: str) -> None:
    manifest = _folder(tmp_path, auth=True)
    picked = [3, 4, 99, 100, 118]
    with serve_http(manifest, tmp_path, env={"READER_TOKEN": READER, "AGGREGATOR_HTTP_FAST": fast},
                    ready="") as server:
        got = _run(tmp_path, ["http", server.url, READER], [_uri(i) for i in picked])
        _check(got, picked, FILES)  # the secret folder is behind a scope the token lacks
        assert got["protocol"] == "2025-11-25"
        # A URI behind a scope the token lacks answers as a missing one does, the URI named, nothing of it shown.
        hidden = _run(tmp_path, ["http", server.url, READER], [], missing="secret://plan.md")["missing"]
        assert (hidden["code"], hidden["message"]) == (got["missing"]["code"], got["missing"]["message"])
        assert hidden["data"] == {"uri": "secret://plan.md"}
        assert "classified" not in json.dumps(hidden)
