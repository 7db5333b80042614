"""The command line as a user runs it: exit codes, stdout for output, stderr for diagnostics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PNG_BYTES, write_manifest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, env=full_env, timeout=60)


def test_validate_ok_and_json(docs_manifest: Path) -> None:
    ok = run("validate", str(docs_manifest))
    assert ok.returncode == 0, ok.stderr.decode()
    assert b"valid" in ok.stdout
    as_json = run("validate", str(docs_manifest), "--format", "json")
    report = json.loads(as_json.stdout)
    assert report["valid"] is True and report["resources"] == 17 and report["templates"] == 2


def test_validate_reports_every_error_located(tmp_path: Path) -> None:
    bad = write_manifest(tmp_path, """
        version: 1
        server: {name: x, pageSize: "many"}
        sources:
          docs: {url: ./nowhere, colour: blue}
        templates:
          - {uriTemplate: "x://{a", name: t, source: docs, path: "{a}"}
        """, name="bad.yaml")
    result = run("validate", str(bad))
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert any(line.startswith(f"{bad}:2:") and "server.pageSize" in line for line in lines), lines
    assert any(f"{bad}:4:" in line and "colour" in line for line in lines), lines
    assert any(f"{bad}:6:" in line and "uriTemplate" in line for line in lines), lines
    as_json = json.loads(run("validate", str(bad), "--format", "json").stdout)
    assert as_json["valid"] is False
    assert {"file", "line", "col", "key", "message"} <= set(as_json["errors"][0])


def test_validate_collision_found_after_globbing(docs_tree: Path) -> None:
    m = write_manifest(docs_tree.parent, """
        version: 1
        server: {name: x}
        sources: {docs: {url: ./docs}}
        resources:
          - {uri: "docs://README.md", name: readme, source: docs, path: README.md}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}"}
        """)
    result = run("validate", str(m))
    assert result.returncode == 1
    err = result.stderr.decode()
    assert f"{m}:7:" in err and "docs://README.md" in err and "resources[0]" in err


def test_missing_manifest_file(tmp_path: Path) -> None:
    result = run("validate", str(tmp_path / "absent.yaml"))
    assert result.returncode != 0 and b"absent.yaml" in result.stderr


def test_list_and_read(docs_manifest: Path) -> None:
    listed = run("list", str(docs_manifest), "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    data = json.loads(listed.stdout)
    uris = [r["uri"] for r in data["resources"]]
    assert "docs://guides/page01.md" in uris and "img://logo" in uris
    assert {t["uriTemplate"] for t in data["resourceTemplates"]} == {"file://docs/{+path}", "page://{name}"}
    plain = run("list", str(docs_manifest))
    assert b"docs://README.md\ttext/markdown" in plain.stdout

    assert run("read", str(docs_manifest), "docs://readme").stdout == b"# Readme\n"
    assert run("read", str(docs_manifest), "img://logo").stdout == PNG_BYTES
    missing = run("read", str(docs_manifest), "file://docs/../secret.txt")
    assert missing.returncode == 1 and b"not found" in missing.stderr and missing.stdout == b""


def test_schema_command_prints_the_schema() -> None:
    result = run("schema")
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema == json.loads((ROOT / "schemas" / "manifest.schema.json").read_text())


@pytest.mark.parametrize("sample", sorted((ROOT / "sample-configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_sample_validates(sample: Path) -> None:
    result = run("validate", str(sample))
    assert result.returncode == 0, result.stderr.decode()
