"""`aggregator init` and `aggregator diff` through the command line, and the generated manifest reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from aggregator.manifest.reference import render_reference
from tests.conftest import write_manifest

ROOT = Path(__file__).resolve().parents[1]


def aggregator(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


def test_init_writes_a_valid_commented_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "Team: Handbook #1"
    (folder / "guides").mkdir(parents=True)
    (folder / "guides" / "a.md").write_text("# A\n")
    (folder / "b.md").write_text("# B\n")
    (folder / "data.csv").write_text("x\n1\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("hidden")
    made = aggregator("init", str(folder), "-o", "m.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "m.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=") and 'glob: "**/*.{md,csv}"' in text
    listed = aggregator("list", "m.yaml", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    uris = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert uris == ["team-handbook-1://b.md", "team-handbook-1://data.csv", "team-handbook-1://guides/a.md",
                    "team-handbook-1://file/{+path}"]
    again = aggregator("init", str(folder), "-o", "m.yaml", cwd=tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr
    assert aggregator("init", str(folder), "-o", "m.yaml", "--force", "--name", "hb", cwd=tmp_path).returncode == 0
    assert "name: hb" in (tmp_path / "m.yaml").read_text()
    assert aggregator("init", str(tmp_path / "nope"), cwd=tmp_path).returncode == 2


def test_diff_lists_what_a_reload_would_change(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for name in ("a.md", "b.md", "c.txt"):
        (tmp_path / "docs" / name).write_text(name)
    old = write_manifest(tmp_path, """
        version: 1
        server: {name: d}
        sources: {docs: {url: ./docs}}
        resources: [{uri: "note://n", name: n, text: old}]
        collections: [{source: docs, glob: "*.md", uri: "docs://{path}"}]
        templates: [{uriTemplate: "t://{x}", name: t, source: docs, path: "{x}.md"}]
        """, name="old.yaml")
    new = write_manifest(tmp_path, """
        version: 1
        server: {name: d}
        sources: {docs: {url: ./docs}}
        resources: [{uri: "note://n", name: n, text: new}]
        collections: [{source: docs, glob: "*.{md,txt}", uri: "docs://{path}", mimeType: text/plain}]
        templates: [{uriTemplate: "t2://{x}", name: t, source: docs, path: "{x}.md"}]
        """, name="new.yaml")
    same = aggregator("diff", str(old), str(old))
    assert same.returncode == 0 and same.stdout == ""
    changed = aggregator("diff", str(old), str(new))
    assert changed.returncode == 1, changed.stderr
    assert changed.stdout.splitlines() == [
        "~ docs://a.md (mimeType)", "~ docs://b.md (mimeType)", "+ docs://c.txt", "~ note://n (text)",
        "+ t2://{x}", "- t://{x}"]
    as_json = json.loads(aggregator("diff", str(old), str(new), "--format", "json").stdout)
    assert as_json["added"] == ["docs://c.txt", "t2://{x}"] and as_json["removed"] == ["t://{x}"]
    broken = write_manifest(tmp_path, "version: 1\nserver: {}\n", name="broken.yaml")
    failed = aggregator("diff", str(old), str(broken))
    assert failed.returncode == 2 and "broken.yaml:2:" in failed.stderr


def test_manifest_reference_is_in_sync_with_the_schema() -> None:
    """docs/manifest-reference.md is generated: regenerate with `python -m aggregator.manifest.reference`."""
    assert (ROOT / "docs" / "manifest-reference.md").read_text() == render_reference()


def test_reference_covers_every_schema_key() -> None:
    text = render_reference()
    for key in ("server.auth", "`include[].sha256`", "`sources.<id>.access`", "`templates[].render`",
                "`templates[].values`", "`extends`", "`jwt.jwksUrl`"):
        assert key in text
