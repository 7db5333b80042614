"""Fuzzing the manifest loader (hypothesis): whatever the text, bytes or size, loading ends quickly with a Manifest
or a ManifestError whose every issue is located; nothing else escapes, nothing crashes the process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.manifest import ManifestError, load_manifest, parse_manifest
from aggregator.manifest.model import Manifest

SECONDS = 20.0
"""Per example, far above what any takes (under 0.1 s alone): only a runaway load fails it, even on a busy CI."""

FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])

# The manifest's own keys, so generated trees reach the schema, the cross-reference checks and the model builder.
KEYS = ["version", "server", "name", "title", "defaults", "sources", "resources", "collections", "templates",
        "include", "extends", "url", "uri", "uriTemplate", "source", "path", "glob", "text", "render", "query",
        "format", "ttl", "maxBytes", "timeout", "pageSize", "maxSubscriptions", "maxManifestBytes", "http", "auth",
        "tokens", "token", "sha256", "namespace", "options", "access", "scopes", "values", "exclude", "remove",
        "mimeType", "annotations", "icons", "tables", "allowPrivateNetwork", "headers", "poll", "<<", "", "x-y"]
ODD_SCALARS = ["~", "null", "true", "on", "no", "1", "-0", "0x1F", "0o17", "1_000", ".inf", "-.nan", "1e400",
               "2001-12-14t21:59:43.10-05:00", "2002-12-14", "'${X}'", "${X}", "${X:-d}", "${", "'it''s'",
               '"\\u0000\\x85\\U0010ffff"', '"\\ud800"', "!!binary aGVsbG8=", "!!str 1", "!!int x", "!!float y",
               "!!bool maybe", "!!timestamp nope", "!!python/object:os.system x", "!foo bar", "!<tag:x> y",
               "./docs", "docs://{path}", "n://{+p}{?q,r}", "{{ x }}", "{% for %}", "'**/*.md'", "10MiB", "30s",
               "'\\t'", "é", "日本", "'\U0001f600'", "-", "?", "'#'", "|", ">", "'%'", "&", "*"]
ANCHORS = ["a", "b", "c"]


def _key(text: str) -> str:
    return text if text and text.replace("-", "").isalnum() else yaml.safe_dump(text).split("\n")[0]


@st.composite
def flow(draw: st.DrawFn, depth: int = 0) -> str:
    """A YAML flow value: odd scalars, lists, mappings (manifest keys), anchors, aliases, tags and merge keys."""
    kind = draw(st.sampled_from(["scalar", "scalar", "text", "alias", "list", "map"] if depth < 6 else
                                ["scalar", "text", "alias"]))
    prefix = ""
    if draw(st.integers(0, 7)) == 0:
        prefix = f"&{draw(st.sampled_from(ANCHORS))} "
    if draw(st.integers(0, 11)) == 0:
        prefix += draw(st.sampled_from(["!!map ", "!!seq ", "!!str ", "!!set ", "!!omap ", "!x ",
                                        "!!python/tuple "])) if kind in ("list", "map") else ""
    if kind == "scalar":
        return prefix + draw(st.sampled_from(ODD_SCALARS))
    if kind == "text":
        return prefix + yaml.safe_dump(draw(st.text(max_size=12)), default_style='"').strip()
    if kind == "alias":
        return f"*{draw(st.sampled_from(ANCHORS))}"
    if kind == "list":
        return prefix + "[" + ", ".join(draw(st.lists(flow(depth + 1), max_size=4))) + "]"
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), flow(depth + 1)), max_size=5))
    return prefix + "{" + ", ".join(f"{_key(k)}: {v}" for k, v in pairs) + "}"


VALUES = st.one_of(st.sampled_from(ODD_SCALARS), flow(4))
URIS = st.sampled_from(["n://a", "n://{x}", "n://{+p}", "n://{/s*}{?q}", "n://{x:3}{.e}{;m}{&a}", "docs://{path}",
                        "n://{", "{x}", "n://{x}{x}", "", "n://%zz", "n://a b", "n://{#f}", "n://{x}/{y}{?x}",
                        "n://{x:99999}", "n://{x*}", "n://{=x}"]).map(
    lambda u: yaml.safe_dump(u, default_style="'").strip())


@st.composite
def shaped_text(draw: st.DrawFn) -> str:
    """A manifest of the right shape whose values are odd: it gets past YAML and the schema to the deeper checks
    (cross-references, units, templates, renders, the model builder) often enough."""

    def entries(fields: dict[str, st.SearchStrategy[str]]) -> str:
        items = []
        for _ in range(draw(st.integers(0, 3))):
            chosen = {k: draw(v) for k, v in fields.items() if draw(st.integers(0, 4))}
            items.append("{" + ", ".join(f"{k}: {v}" for k, v in chosen.items()) + "}")
        return "[" + ", ".join(items) + "]"

    maybe_odd = lambda valid: st.one_of(st.just(valid), st.just(valid), st.just(valid), VALUES)  # noqa: E731
    lines = ["version: 1", f"server: {{name: &a fuzz, pageSize: {draw(maybe_odd('5'))}, "
                           f"maxManifestBytes: {draw(maybe_odd('1MiB'))}}}",
             f"defaults: &c {{ttl: {draw(maybe_odd('30s'))}, maxBytes: {draw(maybe_odd('1KiB'))}}}",
             f"sources: {{docs: {{url: {draw(maybe_odd('./docs'))}, timeout: {draw(maybe_odd('5s'))}}}}}",
             "resources: " + entries({"uri": URIS, "name": maybe_odd("r"), "text": maybe_odd("hi"),
                                      "source": maybe_odd("docs"), "path": maybe_odd("a.md"),
                                      "render": maybe_odd("'{{ 1 }}'"), "mimeType": maybe_odd("text/plain")}),
             "collections: " + entries({"uri": URIS, "source": maybe_odd("docs"), "glob": maybe_odd("'*.md'"),
                                        "name": maybe_odd("'{stem}'"), "exclude": maybe_odd("[x]")}),
             "templates: " + entries({"uriTemplate": URIS, "name": maybe_odd("t"), "source": maybe_odd("docs"),
                                      "path": maybe_odd("'{x}.md'"), "values": maybe_odd("{x: [a, b]}"),
                                      "render": maybe_odd("'{{ x }}'"), "query": maybe_odd("'select 1'")})]
    if draw(st.integers(0, 3)) == 0:
        lines.append(f"include: [{draw(maybe_odd('other.yaml'))}]")
    if draw(st.integers(0, 3)) == 0:
        lines.append(f"extends: {draw(maybe_odd('base.yaml'))}")
    return "\n".join(lines) + "\n"


@st.composite
def manifest_text(draw: st.DrawFn) -> str:
    """A block mapping of manifest keys with flow values, often starting as a valid manifest would."""
    lines = ["version: &b 1", "server: &c {name: &a fuzz}"] if draw(st.booleans()) else []
    for key, value in draw(st.lists(st.tuples(st.sampled_from(KEYS), flow()), max_size=6)):
        lines.append(f"{_key(key)}: {value}")
    if draw(st.booleans()):
        lines.append("sources: {docs: {url: ./docs}}")
    return "\n".join(lines) + "\n"


@st.composite
def block_text(draw: st.DrawFn) -> str:
    """A generated tree written as block YAML (indentation, quoting and anchors as PyYAML writes them)."""
    scalars = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(), st.floats(), st.booleans(),
                        st.none())
    tree = draw(st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=30))
    shared = draw(st.dictionaries(st.sampled_from(KEYS), scalars, max_size=3))
    if isinstance(tree, dict):
        tree = {**tree, "server": shared, "defaults": shared}  # one object twice: PyYAML writes an anchor and alias
    return yaml.safe_dump(tree, default_flow_style=False, allow_unicode=draw(st.booleans()))


@st.composite
def sized_text(draw: st.DrawFn) -> str:
    """Sizes and depths around the limits: nesting near 64, long lines and many values."""
    depth = draw(st.integers(0, 300))
    opener = draw(st.sampled_from(["[", "{a: ", "- ", "? ", "&a [", "!!seq ["]))
    body = opener * depth if opener != "- " else "".join(" " * i + "- \n" for i in range(depth))
    repeat = draw(st.integers(0, 50_000))
    filler = draw(st.sampled_from(["1, ", "*a, ", "x" * 9, "\n", "# c\n", "'q', "]))
    return draw(st.sampled_from(["", "version: 1\nserver: {name: s}\nx: "])) + body + filler * repeat


TEXTS = st.one_of(shaped_text(), manifest_text(), block_text(), sized_text(),
                  st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")))


def _check_outcome(load: object) -> None:
    start = time.monotonic()
    try:
        result = load()  # type: ignore[operator]
    except ManifestError as exc:
        assert exc.issues, "a ManifestError names at least one problem"
        for issue in exc.issues:
            assert issue.line >= 1 and issue.col >= 1 and issue.message and issue.file
    else:
        assert isinstance(result, Manifest)
    assert time.monotonic() - start < SECONDS


BASE = """version: 1
server: {name: base, pageSize: 3}
defaults: {ttl: 1m}
sources: {docs: {url: ./docs}, old: {url: ./old}}
resources:
  - {uri: "n://a", name: a, text: hi}
  - &r {uri: "n://b", name: b, source: docs, path: a.md}
collections: [{source: docs, glob: "*.md", uri: "docs://{path}"}]
templates: [{uriTemplate: "t://{x}", name: t, source: docs, path: "{x}.md"}]
include: [other.yaml]
"""
OTHER = """version: 1
server: {name: other}
resources: [{uri: "o://a", name: a, text: from other}]
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where fuzzed manifests are loaded: `extends: base.yaml` and `include: [other.yaml]` find real files."""
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "base.yaml").write_text(BASE)
    (folder / "other.yaml").write_text(OTHER)
    return folder


@FUZZ
@given(text=TEXTS)
def test_parse_manifest_only_raises_located_manifest_errors(folder: Path, text: str) -> None:
    _check_outcome(lambda: parse_manifest(text, "m.yaml", folder, env={"X": "1", "Y": "two words"}))


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.tuples(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\x00", b""]), TEXTS).map(
                     lambda p: p[0] + p[1].encode("utf-8", "surrogatepass"))))
def test_load_manifest_of_any_bytes_only_raises_located_manifest_errors(folder: Path, data: bytes) -> None:
    path = folder / "fuzz.yaml"
    path.write_bytes(data)
    _check_outcome(lambda: load_manifest(path, env={}))


def test_the_fuzzer_reaches_valid_manifests_too(folder: Path) -> None:
    """The generators are not all noise: the skeleton they start from loads, and so do the files they name."""
    manifest = parse_manifest("version: 1\nserver: {name: fuzz}\nsources: {docs: {url: ./docs}}\n", "m.yaml",
                              folder, env={})
    assert manifest.server.name == "fuzz" and "docs" in manifest.sources
    overlay = parse_manifest("extends: base.yaml\nserver: {name: o}\nresources: [{uri: 'n://a', remove: true}]\n",
                             "m.yaml", folder, env={})
    assert [r.uri for r in overlay.resources] == ["n://b", "o://a"]
