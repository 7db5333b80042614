"""Loader and validator: every error class is located (file:line:col: key: message); valid input becomes the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.manifest import ManifestError, load_manifest, parse_manifest
from tests.conftest import write_manifest

HEAD = "version: 1\nserver: {name: t}\nsources:\n  docs: {url: ./docs}\n"


def issues_of(text: str, env: dict[str, str] | None = None, base: Path = Path("/srv")) -> list[tuple[int, int, str, str]]:
    with pytest.raises(ManifestError) as err:
        parse_manifest(text, "m.yaml", base, env=env or {})
    return [(i.line, i.col, i.key, i.message) for i in err.value.issues]


def test_full_manifest_becomes_the_model(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, """
        version: 1
        server: {name: kb, title: KB, version: "2.0", instructions: "Hi ${WHO}", pageSize: 25}
        defaults:
          ttl: ${TTL:-1h30m}
          maxBytes: 2MiB
        sources:
          docs: {url: ./docs, ttl: 250ms, maxBytes: 512KB, description: d}
          abs: {url: "file:///var/lib/x%20y"}
          bucket: {url: "s3://b/prefix", options: {key: "${KEY:-anon}"}}
        resources:
          - {uri: "docs://a", name: a, source: docs, path: a.md, size: 3,
             icons: [{src: "https://x/i.png", sizes: ["48x48"], theme: dark}],
             annotations: {audience: [assistant], priority: 0.5, lastModified: 2026-01-01T00:00:00Z}}
          - {uri: "note://n", name: n, text: "$${NOT_A_VAR}"}
        collections:
          - {source: docs, glob: "**/*.md", exclude: ["drafts/**"], uri: "docs://{path}", title: "{stem}"}
        templates:
          - {uriTemplate: "docs://{+path}", name: f, source: docs, path: "{path}", mimeType: text/plain}
        """)
    m = load_manifest(path, env={"WHO": "you"})
    assert m.server.instructions == "Hi you" and m.server.page_size == 25 and m.server.version == "2.0"
    assert m.defaults.ttl == 5400 and m.defaults.max_bytes == 2 * 1024 * 1024
    docs = m.sources["docs"]
    assert docs.protocol == "file" and docs.url == str((tmp_path / "docs").resolve())
    assert docs.ttl == 0.25 and docs.max_bytes == 512_000 and docs.where.line == 7
    assert m.sources["abs"].url == "/var/lib/x y" and m.sources["abs"].protocol == "file"
    assert m.sources["bucket"].protocol == "s3" and m.sources["bucket"].options == {"key": "anon"}
    a = m.resources[0]
    assert a.display.icons[0].theme == "dark" and a.display.icons[0].sizes == ("48x48",)
    assert a.display.annotations.last_modified == "2026-01-01T00:00:00Z"  # a timestamp stays a string
    assert a.display.annotations.audience == ("assistant",) and a.size == 3 and a.key == "resources[0]"
    assert m.resources[1].text == "${NOT_A_VAR}"
    c = m.collections[0]
    assert c.name == "{path}" and c.exclude == ("drafts/**",) and c.display.title == "{stem}"
    assert m.templates[0].display.mime_type == "text/plain" and m.templates[0].where.line == 18


def test_wrong_type_is_located() -> None:
    assert issues_of(HEAD.replace("{name: t}", "{name: t, pageSize: lots}")) == [
        (2, 29, "server.pageSize", "expected integer, got string")]


def test_unknown_key_points_at_the_key_and_lists_choices() -> None:
    (issue,) = issues_of(HEAD + "collections:\n  - source: docs\n    glob: '*'\n    uri: 'x://{path}'\n    urll: x\n")
    assert issue[:3] == (9, 5, "collections[0].urll")
    assert "unknown key 'urll'" in issue[3] and "exclude" in issue[3]


def test_duplicate_key() -> None:
    assert issues_of(HEAD + "  docs: {url: ./other}\n") == [
        (5, 3, "sources.docs", "duplicate key 'docs' (first defined on line 4)")]


def test_unset_variable_names_key_not_value() -> None:
    (issue,) = issues_of(HEAD.replace("./docs", "'${DOCS_DIR}'"), env={"OTHER": "secret-value"})
    assert issue[:3] == (4, 15, "sources.docs.url") and "DOCS_DIR is not set" in issue[3]
    assert "secret-value" not in issue[3]


def test_variable_default_and_escape() -> None:
    m = parse_manifest(HEAD.replace("./docs", "'${DOCS_DIR:-./fallback}'") + "resources:\n"
                       "  - {uri: 'n://x', name: x, text: 'a $${B} ${C}'}\n", "m.yaml", Path("/srv"), env={"C": "c"})
    assert m.sources["docs"].url == "/srv/fallback" and m.resources[0].text == "a ${B} c"


def test_bad_uri_template() -> None:
    (issue,) = issues_of(HEAD + "templates:\n  - {uriTemplate: 'x://{a', name: t, source: docs, path: '{a}'}\n")
    assert issue[:3] == (6, 19, "templates[0].uriTemplate") and "unclosed" in issue[3]


def test_bad_duration_and_size() -> None:
    found = issues_of(HEAD.replace("{url: ./docs}", "{url: ./docs, ttl: 5 minutes, maxBytes: lots}"))
    assert [(i[2], "duration" in i[3] or "size" in i[3]) for i in found] == [
        ("sources.docs.ttl", True), ("sources.docs.maxBytes", True)]


def test_missing_required_is_located_at_the_parent() -> None:
    assert issues_of("version: 1\nserver:\n  title: no name\n") == [
        (3, 3, "server", "required key 'name' is missing")]


def test_resource_with_text_and_source() -> None:
    (issue,) = issues_of(HEAD + "resources:\n  - {uri: 'x://a', name: a, text: t, source: docs, path: a}\n")
    assert issue[:3] == (6, 5, "resources[0]") and "either 'text' or both 'source' and 'path'" in issue[3]


def test_cross_references_and_paths() -> None:
    found = issues_of(HEAD + """resources:
  - {uri: 'x://a', name: a, source: nope, path: ../up.md}
collections:
  - {source: docs, glob: '/etc/*', uri: 'x://{path}/{size}'}
templates:
  - {uriTemplate: 'x://{a}', name: t, source: docs, path: 'pre/{b}.md'}
""")
    keys = {i[2]: i[3] for i in found}
    assert "unknown source 'nope'" in keys["resources[0].source"]
    assert "'..'" in keys["resources[0].path"]
    assert "absolute" in keys["collections[0].glob"]
    assert "{size}" in keys["collections[0].uri"]
    assert "{b} is not a variable" in keys["templates[0].path"]


def test_yaml_syntax_error_located() -> None:
    ((line, col, key, message),) = issues_of("version: 1\nserver: {name: t\n")
    assert line == 3 and "YAML syntax error" in message


def test_unsafe_tag_refused() -> None:
    ((line, _, key, message),) = issues_of(HEAD + "resources:\n  - !!python/object:os.system {uri: x}\n")
    assert line == 6 and "unsupported YAML value" in message


def test_empty_and_non_mapping() -> None:
    assert "empty" in issues_of("")[0][3]
    assert "mapping" in issues_of("- a\n- b\n")[0][3]


def test_every_error_reported_at_once() -> None:
    found = issues_of(HEAD + "  docs: {url: ./x}\nresources:\n  - {uri: 'n://a', name: a, text: '${NOPE}'}\n")
    assert [i[2] for i in found] == ["sources.docs", "resources[0].text"]
