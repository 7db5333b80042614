"""`aggregator init` and `aggregator diff` through the command line, and the generated manifest reference."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from aggregator.manifest.reference import render_reference
from aggregator.manifest.schema import load_schema
from tests.command import aggregator
from tests.conftest import write_manifest

ROOT = Path(__file__).resolve().parents[1]


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


def test_init_keeps_a_folder_name_that_looks_like_a_variable(tmp_path: Path) -> None:
    """`${HOME}` in a folder name is text, not the home folder; quotes, `#`, `: ` and `$${` survive too."""
    folder = tmp_path / "we${HOME}ird: '#\"$${x}"
    folder.mkdir()
    (folder / "only.md").write_text("# Only\n")
    made = aggregator("init", str(folder), "-o", "m.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "m.yaml").read_text()
    schema = text.splitlines()[0].split("$schema=", 1)[1]
    assert (tmp_path / schema).resolve() == (ROOT / "schemas" / "manifest.schema.json").resolve()
    from aggregator.manifest import load_manifest

    manifest = load_manifest(tmp_path / "m.yaml", env={"HOME": "/root"})
    assert Path(manifest.sources["files"].url) == folder.resolve()
    listed = aggregator("read", "m.yaml", "we-home-ird-x://only.md", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout == "# Only\n", listed.stderr


@pytest.mark.parametrize("name", [
    "line\u2028separator", "next\x85line", "del\x7fete", "c1\x9bcontrol",  # YAML folds these or refuses them
    os.fsdecode(b"latin1-caf\xe9"),  # not UTF-8 on disk: lone surrogates in Python
    "null", "on",  # a server name YAML would read as null or true
])
def test_init_writes_any_folder_name_so_that_it_loads_back(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    try:
        folder.mkdir()
    except (OSError, UnicodeError):
        pytest.skip(f"this file system cannot name a folder {name!r}")
    (folder / "f.md").write_text("# F\n")
    made = aggregator("init", str(folder), "-o", "m.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    from aggregator.manifest import load_manifest

    assert Path(load_manifest(tmp_path / "m.yaml").sources["files"].url) == folder.resolve()
    listed = aggregator("list", "m.yaml", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[0].split("://")[1] for line in listed.stdout.splitlines()] == ["f.md", "file/{+path}"]


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


def test_diff_names_changed_source_settings_but_not_their_values(tmp_path: Path) -> None:
    """Identical files in another folder, a new TTL or header: every URI looks the same, but a reload changes
    what is read and how long it is kept."""
    for folder in ("docs", "docs-copy"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.md").write_text("same")
    manifest = """
        version: 1
        server: {{name: d}}
        defaults: {{ttl: {default_ttl}}}
        sources:
          docs: {{url: ./{folder}, ttl: {ttl}}}
          web: {{url: "https://example.com/", headers: {{Authorization: "Bearer {token}"}}}}
        collections: [{{source: docs, glob: "*.md", uri: "docs://{{path}}"}}]
        """
    values = {"default_ttl": "5m", "folder": "docs", "ttl": "1m", "token": "old-secret"}
    old = write_manifest(tmp_path, manifest.format(**values), name="old.yaml")
    cases = {"folder": ("docs-copy", ["~ source docs (url)"]), "ttl": ("2m", ["~ source docs (ttl)"]),
             "token": ("new-secret", ["~ source web (headers)"]), "default_ttl": ("9m", ["~ source web (ttl)"])}
    for key, (value, expected) in cases.items():
        new = write_manifest(tmp_path, manifest.format(**{**values, key: value}), name=f"new-{key}.yaml")
        changed = aggregator("diff", str(old), str(new))
        assert changed.returncode == 1 and changed.stdout.splitlines() == expected, (key, changed.stdout)
        assert "secret" not in changed.stdout + changed.stderr
    as_json = json.loads(aggregator("diff", str(old), str(tmp_path / "new-ttl.yaml"), "--format", "json").stdout)
    assert as_json["sources"] == [{"id": "docs", "fields": ["ttl"]}] and as_json["changed"] == []
    assert aggregator("diff", str(old), str(old)).returncode == 0


def test_manifest_reference_is_in_sync_with_the_schema() -> None:
    """docs/manifest-reference.md is generated: regenerate with `python -m aggregator.manifest.reference`."""
    assert (ROOT / "docs" / "manifest-reference.md").read_text() == render_reference()


def test_reference_covers_every_schema_key() -> None:
    text = render_reference()
    for key in ("server.auth", "`include[].sha256`", "`sources.<id>.access`", "`templates[].render`",
                "`templates[].values`", "`extends`", "`jwt.jwksUrl`"):
        assert key in text


def _object_keys(schema: dict[str, Any], node: Any, seen: set[str]) -> set[str]:
    """Every key of every object the schema describes, following $refs, items and oneOf/anyOf/allOf options."""
    if not isinstance(node, dict):
        return set()
    keys: set[str] = set()
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref not in seen:
        seen.add(ref)
        keys |= _object_keys(schema, schema["$defs"][ref.rsplit("/", 1)[1]], seen)
    for key, value in node.get("properties", {}).items():
        keys |= {key} | _object_keys(schema, value, seen)
    for value in [node.get("items"), node.get("additionalProperties"), *node.get("patternProperties", {}).values(),
                  *node.get("oneOf", ()), *node.get("anyOf", ()), *node.get("allOf", ())]:
        keys |= _object_keys(schema, value, seen)
    return keys - {"$schema"}


def test_reference_documents_every_key_of_every_object() -> None:
    """A key nested in an object option (server.console's adminScope) or a sub-object (sources.<id>.oauth) has a
    row of its own, not only its parent's."""
    schema = load_schema()
    rows = re.findall(r"^\| `([^`]+)` \|", render_reference(schema), re.M)
    documented = {row.rsplit(".", 1)[-1] for row in rows}
    assert sorted(_object_keys(schema, schema, set()) - documented) == []
    assert "`server.console.adminScope`" in render_reference(schema)


def test_init_writes_an_absolute_path_for_a_folder_outside_the_manifests_tree(tmp_path: Path) -> None:
    """`init /usr/share/doc` from a project writes that path, not `../../../usr/share/doc`, which breaks as soon as
    the manifest moves; a folder under the manifest's own folder stays relative so the tree can move together."""
    outside = tmp_path / "elsewhere" / "shared docs"
    outside.mkdir(parents=True)
    (outside / "a.md").write_text("# A\n")
    project = tmp_path / "work" / "project"
    (project / "handbook" / "guides").mkdir(parents=True)
    (project / "handbook" / "guides" / "b.md").write_text("# B\n")
    from aggregator.manifest import load_manifest

    assert aggregator("init", str(outside), "-o", "out.yaml", cwd=project).returncode == 0
    text = (project / "out.yaml").read_text()
    assert f"url: {json.dumps(str(outside.resolve()))}" in text and "../" not in text.split("sources:")[1], text
    assert Path(load_manifest(project / "out.yaml").sources["files"].url) == outside.resolve()

    assert aggregator("init", "handbook/guides", "-o", "in.yaml", cwd=project).returncode == 0
    assert 'url: "./handbook/guides"' in (project / "in.yaml").read_text()
    assert aggregator("init", "..", "-o", "up.yaml", cwd=project / "handbook").returncode == 0  # the parent: outside
    assert f"url: {json.dumps(str(project.resolve()))}" in (project / "handbook" / "up.yaml").read_text()
    assert aggregator("init", ".", "-o", "here.yaml", cwd=project).returncode == 0
    assert 'url: "."' in (project / "here.yaml").read_text() or 'url: "./."' in (project / "here.yaml").read_text()
    listed = aggregator("list", "out.yaml", cwd=project)
    assert listed.returncode == 0 and "a.md" in listed.stdout, listed.stderr


def test_init_over_gzipped_docs_serves_them_as_text(tmp_path: Path) -> None:
    """A /usr/share/doc-like folder, mostly `.gz`: the glob leads with what the files are, `*.gz` comes last, and
    `decompress: true` makes the compressed text readable as text."""
    import gzip

    import anyio

    from tests.conftest import connect

    folder = tmp_path / "doc"
    for i in range(6):
        pkg = folder / f"pkg{i}"
        pkg.mkdir(parents=True)
        (pkg / "changelog.Debian.gz").write_bytes(gzip.compress(f"pkg{i} (1.0) unstable\n".encode()))
        (pkg / "NEWS.md.gz").write_bytes(gzip.compress(b"# News\n"))
        (pkg / "copyright").write_text("Copyright\n")
    (folder / "pkg0" / "README.md").write_text("# Readme\n")
    (folder / "pkg1" / "index.html").write_text("<p>hi</p>\n")
    made = aggregator("init", str(folder), "-o", "m.yaml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "m.yaml").read_text()
    glob = next(line for line in text.splitlines() if line.strip().startswith("glob:"))
    assert glob.strip() in ('glob: "**/*.{md,html,gz}"', 'glob: "**/*.{html,md,gz}"'), glob
    assert "decompress: true" in text

    async def main() -> None:
        async with connect(tmp_path / "m.yaml", "auto") as client:
            listed = {str(r.uri): r for r in (await client.list_resources()).resources}
            news = listed["doc://pkg3/NEWS.md.gz"]
            assert news.mime_type == "text/markdown"
            content = (await client.read_resource("doc://pkg3/NEWS.md.gz")).contents[0]
            assert content.text == "# News\n"
            changelog = (await client.read_resource("doc://pkg2/changelog.Debian.gz")).contents[0]
            assert changelog.text == "pkg2 (1.0) unstable\n"

    anyio.run(main)
