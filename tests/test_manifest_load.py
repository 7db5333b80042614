"""Loader and validator: every error class is located (file:line:col: key: message); valid input becomes the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from aggregator.manifest import (
    ManifestError,
    ManifestIssue,
    load_manifest,
    parse_manifest,
)
from aggregator.manifest.model import DEFAULT_MAX_MANIFEST_BYTES, DEFAULT_PAGE_SIZE, Defaults, Location
from aggregator.manifest.yaml_marks import MAX_DEPTH, MAX_VALUES, load_marked
from tests.conftest import MODES, connect, write_manifest

HEAD = "version: 1\nserver: {name: t}\nsources:\n  docs: {url: ./docs}\n"
"""Four lines: whatever a test appends starts on line 5."""


def issues_of(text: str, env: dict[str, str] | None = None) -> list[tuple[int, int, str, str]]:
    with pytest.raises(ManifestError) as err:
        parse_manifest(text, "m.yaml", Path("/srv"), env=env or {})
    assert all(i.file == "m.yaml" for i in err.value.issues)
    return [(i.line, i.col, i.key, i.message) for i in err.value.issues]


def keyed(text: str, env: dict[str, str] | None = None) -> dict[str, tuple[int, int, str]]:
    return {key: (line, col, message) for line, col, key, message in issues_of(text, env)}


# --- a valid manifest becomes the model ---------------------------------------------------------------------------

def test_full_manifest_becomes_the_model(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, """
        # yaml-language-server: $schema=../schemas/manifest.schema.json
        $schema: ../schemas/manifest.schema.json
        version: 1
        server: {name: kb, title: KB, version: "2.0", instructions: "Hi ${WHO}", pageSize: 25}
        defaults:
          ttl: ${TTL:-1h30m}
          maxBytes: 2MiB
        sources:
          docs: {url: ./docs, ttl: 250ms, maxBytes: 512KB, description: d}
          abs: {url: "file:///var/lib/x%20y"}
          rel: {url: "file://./shared/../other"}
          bucket: {url: "s3://b/prefix", options: {key: "${KEY:-anon}", anon: false}}
          web: {url: "https://api.example.com/v1", ttl: 1m}
        resources:
          - {uri: "docs://a", name: a, source: docs, path: a.md, size: 3,
             icons: [{src: "https://x/i.png", mimeType: image/png, sizes: ["48x48", any], theme: dark}],
             annotations: {audience: [assistant], priority: 0.5, lastModified: 2026-01-01T00:00:00Z}}
          - {uri: "note://n", name: n, title: N, description: inline, mimeType: text/plain, text: "$${NOT_A_VAR}"}
        collections:
          - {source: docs, glob: "**/*.md", exclude: ["drafts/**"], uri: "docs://{path}", title: "{stem}"}
          - source: docs
            glob: "*.txt"
            uri: "txt://{stem}.{ext}"
            name: "{name}"
            description: text files
        templates:
          - {uriTemplate: "docs://{+path}", name: f, source: docs, path: "{path}", mimeType: text/plain}
          - {uriTemplate: "api://weather/{city}", name: w, source: web, path: "forecast/{city}.json"}
        """)
    m = load_manifest(path, env={"WHO": "you"})
    assert m.path == path
    assert (m.server.name, m.server.title, m.server.version, m.server.instructions, m.server.page_size) == (
        "kb", "KB", "2.0", "Hi you", 25)
    assert m.defaults == Defaults(ttl=5400.0, max_bytes=2 * 1024 * 1024)
    docs = m.sources["docs"]
    assert docs.protocol == "file" and docs.url == str((tmp_path / "docs").resolve())
    assert (docs.ttl, docs.max_bytes, docs.description) == (0.25, 512_000, "d")
    assert docs.where == Location(str(path), 9, 3) and docs.key == "sources.docs"
    assert (m.sources["abs"].protocol, m.sources["abs"].url) == ("file", "/var/lib/x y")
    assert m.sources["rel"].url == str((tmp_path / "other").resolve())
    bucket = m.sources["bucket"]
    assert (bucket.protocol, bucket.url, bucket.kind, bucket.settings) == ("s3", "s3://b/prefix", "fsspec",
                                                              {"options": {"key": "anon", "anon": False}})
    assert bucket.ttl is None and bucket.max_bytes is None  # unset: the source inherits defaults later
    web = m.sources["web"]
    assert (web.protocol, web.url, web.ttl) == ("https", "https://api.example.com/v1", 60.0)
    a, n = m.resources
    assert (a.uri, a.name, a.source, a.path, a.text, a.size, a.key) == ("docs://a", "a", "docs", "a.md", None, 3,
                                                                       "resources[0]")
    assert a.where.line == 15
    icon = a.display.icons[0]
    assert (icon.src, icon.mime_type, icon.sizes, icon.theme) == ("https://x/i.png", "image/png", ("48x48", "any"), "dark")
    notes = a.display.annotations
    assert (notes.audience, notes.priority, notes.last_modified) == (("assistant",), 0.5, "2026-01-01T00:00:00Z")
    assert (n.text, n.source, n.path) == ("${NOT_A_VAR}", None, None)
    assert (n.display.title, n.display.description, n.display.mime_type, n.display.icons) == (
        "N", "inline", "text/plain", None)
    c0, c1 = m.collections
    assert (c0.glob, c0.uri, c0.name, c0.exclude, c0.display.title) == ("**/*.md", "docs://{path}", "{path}",
                                                                        ("drafts/**",), "{stem}")
    assert (c1.uri, c1.name, c1.display.description, c1.exclude, c1.where.line, c1.key) == (
        "txt://{stem}.{ext}", "{name}", "text files", (), 21, "collections[1]")
    t0, t1 = m.templates
    assert (t0.uri_template, t0.path, t0.display.mime_type, t0.where.line) == ("docs://{+path}", "{path}", "text/plain", 27)
    assert (t1.source, t1.path, t1.key) == ("web", "forecast/{city}.json", "templates[1]")


def test_defaults_fill_the_model(tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path, """
        version: 1
        server: {name: minimal}
        sources: {docs: {url: docs}}
        collections: [{source: docs, glob: "*.md", uri: "d://{path}"}]
        """), env={})
    assert m.defaults == Defaults() and m.defaults.ttl == 300.0 and m.defaults.max_bytes == 10 * 1024 * 1024
    assert m.server.page_size == DEFAULT_PAGE_SIZE and m.server.title is None
    assert m.collections[0].name == "{path}" and m.resources == () and m.templates == ()
    assert m.sources["docs"].url == str((tmp_path / "docs").resolve())


def test_relative_paths_resolve_against_the_folder_the_manifest_is_seen_in(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    write_manifest(real, "version: 1\nserver: {name: t}\nsources: {docs: {url: ./docs}}\n", name="m.yaml")
    mount = tmp_path / "mount"
    mount.mkdir()
    os.symlink(real / "m.yaml", mount / "m.yaml")  # as a ConfigMap mount or a dotfiles link does
    assert load_manifest(mount / "m.yaml", env={}).sources["docs"].url == str((mount / "docs").resolve())


def test_unicode_bom_and_crlf_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes("\ufeffversion: 1\r\nserver: {name: café}\r\nresources:\r\n  - {uri: x://a, name: ä, text: ß}\r\n"
                     .encode())
    m = load_manifest(path, env={})
    assert (m.server.name, m.resources[0].name, m.resources[0].where.line) == ("café", "ä", 4)


def test_a_large_manifest_loads_whole(tmp_path: Path) -> None:
    """Speed is measured by benchmarks, not asserted here; this checks a 300-line manifest loads completely."""
    lines = ["version: 1", "server: {name: big}", "sources:"]
    lines += [f"  s{i}: {{url: ./d{i}, ttl: 30s, maxBytes: 1MiB}}" for i in range(20)]
    lines.append("resources:")
    for i in range(60):
        lines += [f"  - uri: docs://r{i}", f"    name: r{i}", f"    source: s{i % 20}", f"    path: f{i}.md",
                  "    annotations: {audience: [user], priority: 0.5, lastModified: 2026-01-01T00:00:00Z}"]
    lines.append("templates:")
    lines += [f"  - {{uriTemplate: 't{i}://{{+path}}', name: t{i}, source: s0, path: '{{path}}'}}" for i in range(20)]
    lines.append("collections:")
    lines += [f"  - {{source: s1, glob: '**/*.md', uri: 'c{i}://{{path}}', title: '{{stem}}'}}" for i in range(20)]
    path = write_manifest(tmp_path, "\n".join(lines) + "\n")
    assert len(lines) > 300
    m = load_manifest(path, env={})
    assert (len(m.sources), len(m.resources), len(m.templates), len(m.collections)) == (20, 60, 20, 20)
    assert m.resources[59].where.line == lines.index("  - uri: docs://r59") + 1


# --- each error class, located ------------------------------------------------------------------------------------

def test_wrong_type_is_located() -> None:
    assert issues_of(HEAD.replace("{name: t}", "{name: t, pageSize: lots}")) == [
        (2, 29, "server.pageSize", "expected integer, got string")]
    assert issues_of(HEAD + "resources:\n  - {uri: 'x://a', name: 42, text: t}\n") == [
        (6, 26, "resources[0].name", "expected string, got integer; put it in quotes to keep it as text")]
    assert issues_of(HEAD + "resources: {a: 1}\n") == [(5, 12, "resources", "expected list, got mapping")]


def test_unknown_key_points_at_the_key_and_lists_choices() -> None:
    (issue,) = issues_of(HEAD + "collections:\n  - source: docs\n    glob: '*'\n    uri: 'x://{path}'\n    urll: x\n")
    assert issue[:3] == (9, 5, "collections[0].urll")
    assert issue[3].startswith("unknown key 'urll'; expected one of: source, glob, exclude, uri, name, title,")


def test_unknown_key_suggests_the_close_one() -> None:
    found = keyed(HEAD.replace("{name: t}", "{name: t, page_size: 5}") + "defaults:\n  tll: 5m\n")
    assert found["server.page_size"][:2] == (2, 19) and "did you mean 'pageSize'?" in found["server.page_size"][2]
    assert found["defaults.tll"][:2] == (6, 3) and "did you mean 'ttl'?" in found["defaults.tll"][2]


def test_duplicate_key_is_located_at_the_second_and_names_the_first() -> None:
    assert issues_of(HEAD + "  docs: {url: ./other}\n") == [
        (5, 3, "sources.docs", "duplicate key 'docs' (first defined on line 4)")]
    assert issues_of(HEAD + "resources:\n  - uri: x://a\n    name: a\n    text: t\n    name: b\n") == [
        (9, 5, "resources[0].name", "duplicate key 'name' (first defined on line 7)")]


def test_bad_uri_template_is_located_at_its_key() -> None:
    (issue,) = issues_of(HEAD + "templates:\n  - {uriTemplate: 'x://{a', name: t, source: docs, path: '{a}'}\n")
    assert issue[:3] == (6, 19, "templates[0].uriTemplate")
    assert issue[3].startswith("'x://{a' is not a valid uri-template: unclosed '{'")
    (issue,) = issues_of(HEAD + "templates:\n  - uriTemplate: no-scheme/{a}\n    name: t\n    source: docs\n"
                                "    path: '{a}'\n")
    assert issue[:3] == (6, 18, "templates[0].uriTemplate") and "scheme" in issue[3]


def test_bad_duration_and_size() -> None:
    assert issues_of(HEAD.replace("{url: ./docs}", "{url: ./docs, ttl: 5 minutes, maxBytes: lots}")) == [
        (4, 28, "sources.docs.ttl", ("'5 minutes' is not valid here: expected a duration such as 250ms, 30s, 5m, "
                                    "1h30m, 1d or 1w, or a number of seconds")),
        (4, 49, "sources.docs.maxBytes", ("'lots' is not valid here: expected a size such as 512KB, 10MiB or 1GiB "
                                         "(KB = 1000 bytes, KiB and K = 1024), or a whole number of bytes")),
    ]
    found = keyed(HEAD + "defaults:\n  ttl: -5\n  maxBytes: true\n")
    assert found["defaults.ttl"] == (6, 8, "must be at least 0, got -5")
    assert found["defaults.maxBytes"][:2] == (7, 13) and found["defaults.maxBytes"][2].startswith(
        "expected a size such as 512KB")
    # NaN passes a JSON Schema `minimum`; the model builder refuses it, located all the same.
    assert issues_of(HEAD + "defaults:\n  timeout: .nan\n") == [
        (6, 12, "defaults.timeout", "a duration must be a finite number of seconds")]


def test_missing_required_is_located_at_the_parent() -> None:
    assert issues_of("version: 1\nserver:\n  title: no name\n") == [
        (3, 3, "server", "required key 'name' is missing")]
    assert issues_of("server: {name: t}\n") == [(1, 1, "", "required key 'version' is missing")]
    assert issues_of(HEAD + "collections:\n  - {source: docs}\n") == [
        (6, 5, "collections[0]", "required key 'glob' is missing"),
        (6, 5, "collections[0]", "required key 'uri' is missing")]


def test_version_must_be_1() -> None:
    assert issues_of(HEAD.replace("version: 1", "version: 2")) == [(1, 10, "version", "must be 1, got 2")]


@pytest.mark.parametrize(("entry", "message"), [
    ("{uri: 'x://a', name: a, text: t, source: docs, path: a}",
     "a resource has either 'text' or both 'source' and 'path', not both kinds"),
    ("{uri: 'x://a', name: a}", "a resource needs either 'text' (inline content) or both 'source' and 'path'"),
    ("{uri: 'x://a', name: a, source: docs}",
     "required key 'path' is missing: a resource with 'source' names a file in it with 'path'"),
    ("{uri: 'x://a', name: a, path: a.md}", "required key 'source' is missing: 'path' names a file inside a source"),
])
def test_resource_is_text_or_a_file(entry: str, message: str) -> None:
    assert issues_of(HEAD + f"resources:\n  - {entry}\n") == [(6, 5, "resources[0]", message)]


def test_template_needs_path_or_query() -> None:
    assert issues_of(HEAD + "templates:\n  - {uriTemplate: 'x://{a}', name: t, source: docs}\n") == [
        (6, 5, "templates[0]", "required key 'path' is missing (or 'query' for a SQL source)")]


def test_unknown_source_reference() -> None:
    found = keyed(HEAD + """resources:
  - {uri: 'x://a', name: a, source: nope, path: a.md}
collections:
  - {source: docs2, glob: '*', uri: 'x://{path}'}
templates:
  - {uriTemplate: 'x://{a}', name: t, source: Docs, path: '{a}'}
""")
    assert found == {
        "resources[0].source": (6, 37, "unknown source 'nope'; sources: docs"),
        "collections[0].source": (8, 14, "unknown source 'docs2' (did you mean 'docs'?); sources: docs"),
        "templates[0].source": (10, 47, "unknown source 'Docs' (did you mean 'docs'?); sources: docs"),
    }
    (issue,) = issues_of("version: 1\nserver: {name: t}\nresources:\n  - {uri: 'x://a', name: a, source: s, path: p}\n")
    assert issue[2:] == ("resources[0].source", "unknown source 's'; sources: none are declared under sources:")


def test_paths_and_globs_never_leave_their_source() -> None:
    found = keyed(HEAD + """resources:
  - {uri: 'x://a', name: a, source: docs, path: ../up.md}
  - {uri: 'x://b', name: b, source: docs, path: /etc/passwd}
  - {uri: 'x://c', name: c, source: docs, path: 'a/..\\\\b'}
collections:
  - {source: docs, glob: '/etc/*', uri: 'x://{path}', exclude: [ok/**, '**/../x']}
templates:
  - {uriTemplate: 'x://{a}', name: t, source: docs, path: 'pre/../{a}'}
  - {uriTemplate: 'y://{a}', name: u, source: docs, path: 'C:\\\\{a}'}
""")
    assert found["resources[0].path"] == (6, 49, ("path '../up.md' has a '..' segment; it must stay inside its source, "
                                                 "relative to the source's root"))
    assert found["resources[1].path"][:2] == (7, 49) and "'/etc/passwd' is absolute" in found["resources[1].path"][2]
    assert "'..' segment" in found["resources[2].path"][2]
    assert found["collections[0].glob"][:2] == (10, 26) and "absolute" in found["collections[0].glob"][2]
    assert found["collections[0].exclude[1]"][:2] == (10, 72) and "'..'" in found["collections[0].exclude[1]"][2]
    assert "collections[0].exclude[0]" not in found
    assert found["templates[0].path"][:2] == (12, 59) and "'..'" in found["templates[0].path"][2]
    assert "absolute" in found["templates[1].path"][2]


def test_collection_placeholders() -> None:
    found = keyed(HEAD + """collections:
  - source: docs
    glob: '**/*'
    uri: 'x://{path}/{size}'
    name: '{filename}'
    title: '{stem} ({ext})'
  - {source: docs, glob: '*', uri: 'x://all'}
""")
    allowed = "a collection pattern may use {path}, {name}, {stem}, {ext}"
    assert found == {
        "collections[0].uri": (8, 10, f"unknown placeholder {{size}}; {allowed}"),
        "collections[0].name": (9, 11, f"unknown placeholder {{filename}}; {allowed}"),
        "collections[1].uri": (11, 36, ("the uri pattern must use {path} (or {name} or {stem}) so that every file "
                                       "gets a URI of its own")),
    }


def test_template_path_placeholders_are_template_variables() -> None:
    found = keyed(HEAD + """templates:
  - {uriTemplate: 'x://{a}/{b}', name: t, source: docs, path: 'pre/{b}/{c}.md'}
  - {uriTemplate: 'y://{+p}', name: u, source: docs, path: '{+p}'}
  - {uriTemplate: 'z://{x}{?q,r}', name: v, source: docs, path: '{x}-{q}-{r}'}
""")
    assert found == {
        "templates[0].path": (6, 63, "placeholder {c} is not a variable of the uriTemplate (its variables: a, b)"),
        "templates[1].path": (7, 60, ("placeholder {+p} is not a variable of the uriTemplate (its variables: p); "
                                     "write {p}: the operator belongs in the uriTemplate")),
    }


def test_duplicate_uris_and_uri_templates() -> None:
    found = keyed(HEAD + """resources:
  - {uri: 'x://a', name: a, text: one}
  - {uri: 'x://b', name: b, text: two}
  - {uri: 'x://a', name: c, text: three}
templates:
  - {uriTemplate: 'x://{p}', name: t, source: docs, path: '{p}'}
  - {uriTemplate: 'x://{p}', name: u, source: docs, path: 'other/{p}'}
""")
    assert found == {
        "resources[2].uri": (8, 11, "duplicate uri 'x://a': resources[0] (line 6) already uses it"),
        "templates[1].uriTemplate": (11, 19, "duplicate uriTemplate 'x://{p}': templates[0] (line 10) already uses it"),
    }


def test_source_ids_are_checked_at_the_key() -> None:
    assert issues_of(HEAD + "  '9lives': {url: ./x}\n") == [
        (5, 3, "sources.9lives", ("'9lives' is not a valid id: use letters, digits, '_', '.' and '-', starting with "
                                 "a letter or '_'"))]


def test_formats_are_checked() -> None:
    found = keyed(HEAD + """resources:
  - uri: no scheme
    name: a
    text: t
    icons: [{src: 'not a uri', sizes: [big], theme: blue}]
    annotations: {audience: [robot], priority: 2, lastModified: yesterday}
""")
    assert found["resources[0].uri"] == (6, 10, ("'no scheme' is not a valid uri: a URI starts with a scheme, such as "
                                                "docs: or https:"))
    assert found["resources[0].icons[0].src"][:2] == (9, 19)
    assert found["resources[0].icons[0].sizes[0]"] == (
        9, 40, "'big' is not valid here: expected WxH in pixels such as 48x48, or any")
    assert found["resources[0].icons[0].theme"] == (9, 53, "'blue' is not one of: 'light', 'dark'")
    assert found["resources[0].annotations.audience[0]"] == (10, 30, "'robot' is not one of: 'user', 'assistant'")
    assert found["resources[0].annotations.priority"] == (10, 48, "must be at most 1, got 2")
    assert found["resources[0].annotations.lastModified"] == (
        10, 65, "'yesterday' is not a valid date-time: expected an ISO 8601 date and time such as 2026-01-15T09:00:00Z; "
        "or 'file'")


def test_private_network_choice_names_the_kinds() -> None:
    assert issues_of(HEAD + "  web: {url: 'https://x', allowPrivateNetwork: sure}\n") == [
        (5, 48, "sources.web.allowPrivateNetwork", "expected boolean or list, got string")]


# --- YAML itself --------------------------------------------------------------------------------------------------

def test_yaml_syntax_error_located() -> None:
    ((line, col, key, message),) = issues_of("version: 1\nserver: {name: t\nsources: {}\n")
    assert (line, col, key) == (3, 8) + ("",)
    assert message.startswith("YAML syntax error: expected ',' or '}'") and "started on line 2" in message
    ((line, col, _, message),) = issues_of("version: 1\nserver:\n  name: t\n title: x\n")
    assert (line, col) == (4, 2) and "indentation" in message


@pytest.mark.parametrize(("text", "where", "hint"), [
    ("version: 1\nserver:\n\tname: t\n", (3, 1), "use spaces for indentation, not tabs"),
    ("version: 1\nserver:\n  name: t\n  title: a: b\n", (4, 11),
     "check the indentation of this key, or quote a value containing ': '"),
    ('version: 1\nserver: {name: "t}\n', (2, 16), "the quote opened on line 2 is never closed"),
    ("version: 1\nserver: {name: 'it's}\n", (2, 20), "a ' inside a '...' value is written ''"),
    ("version: 1\nsources: [a, b\n", (2, 10), "the [ opened on line 2 is never closed"),
    ("version: 1\nserver: {name: t\n", (2, 9), "the { opened on line 2 is never closed"),
    ("version: 1\nserver: {name: t, title: @home}\n", (2, 26), "quote a value that starts with @ or `"),
    ("version: 1\nserver:\n  name: t\n  - x\n", (4, 3),
     "a '- ' list item belongs under a key of its own"),
])
def test_yaml_syntax_errors_carry_a_hint(text: str, where: tuple[int, int], hint: str) -> None:
    ((line, col, key, message),) = issues_of(text)
    assert message.startswith("YAML syntax error: ") and hint in message, message
    assert (line, col, key) == (*where, "")


def test_unsafe_tag_refused() -> None:
    found = issues_of(HEAD + "resources:\n  - !!python/object/apply:os.system ['echo hi']\n")
    assert found == [(6, 5, "resources[0]", ("unsupported YAML value: tag 'tag:yaml.org,2002:python/object/apply:"
                                            "os.system' is not allowed (only plain YAML data)"))]
    assert issues_of(HEAD + "  x: !Env HOME\n")[0][:3] == (5, 6, "sources.x")


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "the manifest is empty"),
    ("# nothing but a comment\n\n", "the manifest is empty"),
    ("---\n", "the manifest is empty"),
    ("- a\n- b\n", "not a list"),
    ("just text\n", "not a single value"),
])
def test_empty_and_non_mapping(text: str, fragment: str) -> None:
    ((line, col, key, message),) = issues_of(text)
    assert (line, col, key) == (1, 1, "") and fragment in message


def test_anchors_and_merge_keys() -> None:
    text = """version: 1
server: {name: t}
sources:
  docs: {url: ./docs}
x-base: &base {source: docs, mimeType: text/markdown, glob: '*.md'}
collections:
  - <<: *base
    uri: 'a://{path}'
    mimeType: text/plain
"""
    # An unknown top-level key (x-base) is still an error: the manifest is closed. Its location is exact.
    assert issues_of(text)[0][:3] == (5, 1, "x-base")
    marked, issues = load_marked(text, "m.yaml")
    assert issues == [] and marked is not None
    assert marked.data["collections"][0] == {"uri": "a://{path}", "mimeType": "text/plain", "source": "docs",
                                             "glob": "*.md"}
    # Explicit keys keep their own marks; merged ones point where the anchor wrote them.
    assert marked.keys[("collections", 0, "mimeType")] == (9, 5)
    assert marked.keys[("collections", 0, "glob")] == (5, 55)


def test_alias_bomb_and_cycles_are_refused() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(6))
    found = issues_of("version: 1\nserver: {name: t}\n" + bomb)
    assert any("more than 100000 values" in i[3] for i in found)
    found = issues_of("version: 1\nserver: {name: t}\nsources: &s {a: *s}\n")
    assert any("cycle" in i[3] for i in found)


def test_marks_match_the_pure_python_parser() -> None:
    """libyaml is used for speed only if it reports the very same positions."""
    text = ("é: ü\nnäme: {ß: 日本語, k: [v, 😀]}\nlist:\n  - 日本: 語\n    x: 'y'\nblock: |\n  text\n"
            "z: &a {k: v}\nw: *a\n")

    def marks(loader: type) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []

        def walk(node: yaml.Node) -> None:
            out.append((node.start_mark.line, node.start_mark.column))
            for child in node.value if isinstance(node.value, list) else ():
                for n in child if isinstance(child, tuple) else (child,):
                    walk(n)
        walk(yaml.compose(text, Loader=loader))
        return out

    fast = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert marks(fast) == marks(yaml.SafeLoader)
    marked, _ = load_marked(text, "m.yaml")
    assert marked is not None and marked.keys[("list", 0, "x")] == (5, 5) and marked.values[("w",)] == (8, 4)


# --- whole-file behaviour -----------------------------------------------------------------------------------------

def test_every_error_reported_at_once_in_file_order() -> None:
    found = issues_of(HEAD + """  docs: {url: ./x}
defaults: {ttl: soon}
resources:
  - {uri: 'n://a', name: a, text: '${NOPE}'}
  - {uri: 'n://b', name: b, source: ghost, path: ../b}
""")
    assert [(i[0], i[2]) for i in found] == [
        (5, "sources.docs"), (6, "defaults.ttl"), (8, "resources[0].text"), (9, "resources[1].source"),
        (9, "resources[1].path")]


def test_issue_formats_as_file_line_col_key_message() -> None:
    with pytest.raises(ManifestError) as err:
        parse_manifest(HEAD.replace("version: 1", "version: 3"), "conf/m.yaml", Path("/srv"), env={})
    assert str(err.value) == "conf/m.yaml:1:10: version: must be 1, got 3"
    assert err.value.issues == [ManifestIssue("conf/m.yaml", 1, 10, "version", "must be 1, got 3")]


def test_messages_name_the_file_as_given_and_no_other_absolute_path(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    write_manifest(tmp_path, HEAD + "resources:\n  - {uri: 'x://a', name: a, source: nope, path: a}\n  - 7\n",
                   name="m.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManifestError) as err:
        load_manifest("m.yaml", env={})
    assert [i.file for i in err.value.issues] == ["m.yaml", "m.yaml"]
    assert str(tmp_path) not in str(err.value)


def test_not_utf8_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"version: 1\nserver: {name: caf\xe9}\n")
    with pytest.raises(ManifestError) as err:
        load_manifest(path, env={})
    assert [(i.line, i.col, i.message) for i in err.value.issues] == [(2, 19, "the manifest is not UTF-8 text")]


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_manifest(tmp_path / "absent.yaml")


def test_an_empty_section_gets_a_hint() -> None:
    assert issues_of(HEAD + "resources:\ntemplates: []\n") == [
        (5, 11, "resources", "expected list, got null; write [] for an empty list")]


def test_an_entry_level_error_does_not_hide_its_parts() -> None:
    found = issues_of(HEAD + "resources:\n  - {uri: 'x://a', name: a, text: t, source: ghost, path: ../x}\n")
    assert [i[2] for i in found] == ["resources[0]", "resources[0].source", "resources[0].path"]


def test_query_needs_a_sql_source_and_known_parameters() -> None:
    found = keyed(HEAD + "  db: {url: 'sqlite:///data/app.db'}\ntemplates:\n"
                  "  - {uriTemplate: 'db://t/{id}', name: q, source: docs, query: 'SELECT 1'}\n"
                  "  - {uriTemplate: 'db://u/{id}', name: r, source: db, query: 'SELECT * FROM u WHERE id = :id "
                  "AND x = :other'}\n")
    assert found["templates[0].query"][2] == "query needs a SQL source; source 'docs' is file"
    assert found["templates[1].query"][2] == "parameter :other is not a variable of the uriTemplate (its variables: id)"


def test_source_url_kinds(tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        sources:
          home: {url: "file://localhost/srv/x"}
          db: {url: "sqlite:///data/app.db"}
          pg: {url: "postgresql+psycopg://u@h/db"}
          repo: {url: "git+file://./repo", ref: main}
          gcs: {url: "GS://bucket/p"}
        """), env={})
    kinds = {sid: (s.protocol, s.url) for sid, s in m.sources.items()}
    assert kinds == {
        "home": ("file", "/srv/x"),
        "db": ("sql", f"sqlite:///{(tmp_path / 'data' / 'app.db').resolve()}"),
        "pg": ("sql", "postgresql+psycopg://u@h/db"),
        "repo": ("git", str((tmp_path / "repo").resolve())),
        "gcs": ("gs", "GS://bucket/p"),
    }


def test_control_character_is_located() -> None:
    assert issues_of("version: 1\nserver: {name: a\x01}\n") == [
        (2, 17, "", ('character #x0001 is not allowed in YAML (control characters must be escaped in a "quoted" '
                    "string)"))]


def test_a_duplicate_key_does_not_hide_errors_in_the_first_value() -> None:
    assert [i[2] for i in issues_of(HEAD.replace("./docs", "./docs, ttl: soon") + "  docs: {url: ./other}\n")] == [
        "sources.docs.ttl", "sources.docs"]


def test_a_refused_value_is_reported_once() -> None:
    assert [i[2:] for i in issues_of(HEAD + "resources:\n  - !!set {a}\n  - {uri: '${U}', name: u, text: t}\n")] == [
        ("resources[0]", "unsupported YAML value: tag 'tag:yaml.org,2002:set' is not allowed (only plain YAML data)"),
        ("resources[1].uri", "environment variable U is not set (set it, or give a default: ${U:-default})")]


def test_http_limits_default_parse_and_refuse_zero() -> None:
    from aggregator.manifest.model import HttpSettings

    assert parse_manifest(HEAD, "m.yaml", Path("/srv"), env={}).server.http == HttpSettings(
        header_timeout=10.0, body_timeout=30.0, keep_alive_timeout=5.0, max_connections=1000)
    text = HEAD.replace("server: {name: t}", "server:\n  name: t\n  http: {headerTimeout: 2s, bodyTimeout: 1m, "
                        "keepAliveTimeout: 500ms, maxConnections: 50}")
    http = parse_manifest(text, "m.yaml", Path("/srv"), env={}).server.http
    assert (http.header_timeout, http.body_timeout, http.keep_alive_timeout, http.max_connections) == (
        2.0, 60.0, 0.5, 50)
    found = keyed(text.replace("2s", "0s").replace("maxConnections: 50", "maxConnections: 0"))
    assert found["server.http.maxConnections"][2] == "must be at least 1, got 0"
    found = keyed(text.replace("2s", "0s"))
    assert found["server.http.headerTimeout"][2] == "must be longer than 0 seconds, got '0s'"


# --- hostile manifests: nesting, aliases and size are capped before anything recursive runs ------------------------

DEEP = "[" * 40_000
"""80 KB that made libyaml's C composer recurse until the process segfaulted."""


def _validate(manifest: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": os.environ.get("PATH", "")}
    return subprocess.run([sys.executable, "-m", "aggregator", "validate", "--offline", str(manifest)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_deep_nesting_is_a_located_error_from_validate(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    done = _validate(path)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # a negative code is a signal (SIGSEGV)
    assert f"{path}:1:{MAX_DEPTH + 1}: <root>: " in done.stderr
    assert f"nested more than {MAX_DEPTH} levels deep" in done.stderr


@pytest.mark.parametrize("text, line, col", [
    ("version: 1\nserver: {name: t}\nx: " + "{a: " * 200, 3, 4 + 4 * (MAX_DEPTH - 1)),
    ("version: 1\nserver: {name: t}\nx:\n" + "".join(" " * i + "- \n" for i in range(200)), 4 + MAX_DEPTH - 1,
     MAX_DEPTH),
    ("version: 1\nserver: {name: t}\nx: " + "[" * 200 + "]" * 200 + "\n", 3, 4 + MAX_DEPTH - 1),
])
def test_deep_nesting_is_located_at_the_first_node_too_deep(text: str, line: int, col: int) -> None:
    found = issues_of(text)
    assert [(i[0], i[1]) for i in found] == [(line, col)], found
    assert f"nested more than {MAX_DEPTH} levels deep" in found[0][3]


def test_nesting_built_through_aliases_is_capped_too() -> None:
    # Each anchor nests 30 levels and holds the previous one: the text is shallow, the tree is not.
    text = "version: 1\nserver: {name: t}\n" + "".join(
        f"a{i}: &a{i} " + "[" * 30 + (f"*a{i - 1}" if i else "x") + "]" * 30 + "\n" for i in range(4))
    found = issues_of(text)
    assert any(f"nested more than {MAX_DEPTH} levels deep" in i[3] and i[2].startswith("a2") for i in found), found


def test_billion_laughs_is_a_located_error() -> None:
    laughs = 'l0: &l0 "lol"\n' + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n"
                                        for i in range(1, 10))
    found = issues_of("version: 1\nserver: {name: t}\n" + laughs)
    assert [i[3] for i in found if "more than 100000 values" in i[3]], found
    assert all(i[0] > 2 for i in found)  # located on the alias line that crossed the cap, not at 1:1


def test_too_many_values_are_refused_before_composing() -> None:
    text = "version: 1\nserver: {name: t}\nx: [" + "1, " * (MAX_VALUES + 10) + "]\n"
    found = issues_of(text)
    assert [(i[0], i[1]) for i in found] == [(3, 5 + 3 * (MAX_VALUES - 5))], found  # 5 values before x's
    assert f"more than {MAX_VALUES} values" in found[0][3]


def test_a_manifest_over_the_default_size_is_a_located_error(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, HEAD.replace("./docs", str(tmp_path)))
    with path.open("a") as out:
        out.write("# padding\n" * (DEFAULT_MAX_MANIFEST_BYTES // 10))
    with pytest.raises(ManifestError) as caught:
        load_manifest(path, env={})
    assert [(i.file, i.line, i.col) for i in caught.value.issues] == [(str(path), 1, 1)]
    assert "larger than server.maxManifestBytes (4MiB)" in str(caught.value)


def test_max_manifest_bytes_of_the_root_applies_to_its_includes(tmp_path: Path) -> None:
    big = write_manifest(tmp_path, "version: 1\nserver: {name: big}\n" + "# padding\n" * 600_000, name="big.yaml")
    root = write_manifest(tmp_path, "version: 1\nserver: {name: t, maxManifestBytes: 8MiB}\ninclude: [big.yaml]\n")
    assert load_manifest(root, env={}).server.max_manifest_bytes == 8 * 1024 * 1024  # 6 MB: over the default
    small = write_manifest(tmp_path, "version: 1\nserver: {name: t, maxManifestBytes: 1KiB}\n"
                                     "include: [{path: big.yaml}]\n", name="small.yaml")
    with pytest.raises(ManifestError) as caught:
        load_manifest(small, env={})
    assert [(i.line, i.col, i.key) for i in caught.value.issues] == [(3, 11, "include[0]")]
    assert "'big.yaml' is larger than server.maxManifestBytes (1KiB)" in str(caught.value)
    assert big.stat().st_size > 6_000_000


def test_max_manifest_bytes_is_checked() -> None:
    assert keyed(HEAD.replace("{name: t}", "{name: t, maxManifestBytes: lots}"))["server.maxManifestBytes"]
    assert keyed(HEAD.replace("{name: t}", "{name: t, maxManifestBytes: 0}"))["server.maxManifestBytes"]


LIVE = """version: 1
server: {name: live, maxManifestBytes: 2KiB}
resources:
  - {uri: "note://a", name: a, text: first}
"""


def _save(path: Path, text: str) -> None:
    """Save as editors do: a temporary file renamed over the manifest."""
    tmp = path.with_suffix(".tmp~")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _listed(client: Any) -> list[str]:
    return [r.uri for r in (await client.list_resources()).resources]


async def _still_serving(client: Any, expected: list[str], seconds: float = 2.0) -> None:
    """The old listing keeps answering while the server had time to try (and refuse) the reload."""
    for _ in range(int(seconds / 0.25)):
        assert await _listed(client) == expected
        await anyio.sleep(0.25)


@pytest.mark.parametrize("mode", MODES)
def test_hot_reload_of_a_deep_or_too_big_manifest_keeps_the_last_good_catalog(tmp_path: Path, mode: str) -> None:
    manifest = write_manifest(tmp_path, LIVE)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            assert await _listed(client) == ["note://a"]
            _save(manifest, DEEP)  # segfaulted the server
            await _still_serving(client, ["note://a"])
            # Valid, but over the 2KiB the running manifest allows (the new file's own setting cannot apply).
            _save(manifest, LIVE.replace("2KiB", "1MiB") + "# padding\n" * 300)
            await _still_serving(client, ["note://a"])
            _save(manifest, LIVE + '  - {uri: "note://b", name: b, text: second}\n')
            with anyio.fail_after(15):
                while await _listed(client) != ["note://a", "note://b"]:
                    await anyio.sleep(0.1)
            assert (await client.read_resource("note://a")).contents[0].text == "first"

    anyio.run(main)


def test_an_explicit_tag_the_value_does_not_fit_is_located() -> None:
    """Found by the fuzzer: `!!int x` escaped as a bare ValueError (and `!!int` alone as an IndexError)."""
    found = keyed(HEAD + "defaults: {maxConcurrency: !!int x, ttl: !!float y, timeout: !!bool maybe}\n")
    assert found["defaults.maxConcurrency"][:2] == (5, 28)
    assert "'x' is not a valid !!int" in found["defaults.maxConcurrency"][2]
    assert "'y' is not a valid !!float" in found["defaults.ttl"][2]
    assert "'maybe' is not a valid !!bool" in found["defaults.timeout"][2]
    assert (1, 10, "version", "unsupported YAML value: '' is not a valid !!int") in issues_of("version: !!int\n")


def test_cluster_settings_take_the_redis_url_from_the_environment(tmp_path: Path) -> None:
    from aggregator.manifest.model import ClusterSettings

    path = write_manifest(tmp_path, """
        version: 1
        server:
          name: c
          cluster: {redis: "${REDIS_URL}", prefix: team-a, sharedCacheMaxBytes: 64KiB, timeout: 250ms}
        sources: {docs: {url: docs}}
        collections: [{source: docs, glob: "*.md", uri: "d://{path}"}]
        """)
    m = load_manifest(path, env={"REDIS_URL": "redis://:secret@127.0.0.1:6379/2"})
    assert m.server.cluster == ClusterSettings(redis="redis://:secret@127.0.0.1:6379/2", prefix="team-a",
                                               shared_max_bytes=64 * 1024, timeout=0.25)
    assert load_manifest(write_manifest(tmp_path, "version: 1\nserver: {name: c}\n"), env={}).server.cluster is None


def test_cluster_settings_are_checked_and_located() -> None:
    assert issues_of(HEAD.replace("{name: t}", "{name: t, cluster: {redis: 'http://x'}}"))[0][2] == \
        "server.cluster.redis"
    assert issues_of(HEAD.replace("{name: t}", "{name: t, cluster: {redis: 'redis://x', timeout: 0s}}")) == [
        (2, 58, "server.cluster.timeout", "a Redis timeout must be longer than 0s")]
