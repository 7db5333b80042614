"""Fuzzing URI resolution (hypothesis): any string or byte sequence a client sends as a URI either names what the
catalog serves or is ResourceNotFound; nothing else escapes, and resolving stays fast."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.catalog import FileTarget, Target
from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound
from tests.conftest import write_manifest

SECONDS = 5.0
"""Per URI, far above what one takes (microseconds): only a runaway match (backtracking, a huge expansion) fails."""

FUZZ = settings(max_examples=1500, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Every kind of entry: listed files, inline text, a render, and templates of every RFC 6570 operator, prefixes and
# explode, over a local folder, an HTTP source (URL paths), SQL queries and renders; some need scopes.
MANIFEST = """
    version: 1
    server: {name: fuzz}
    sources:
      docs: {url: ./docs}
      web: {url: "https://example.invalid/base/"}
      db: {url: "sqlite:///db.sqlite"}
    resources:
      - {uri: "note://inline", name: inline, text: hello}
      - {uri: "note://rendered", name: rendered, render: "{{ 1 + 1 }}"}
      - {uri: "docs://readme", name: readme, source: docs, path: README.md, access: {scopes: [docs]}}
    collections:
      - {source: docs, glob: "**/*", uri: "docs://{path}", name: "{stem}"}
      - {source: docs, glob: "**/*.md", uri: "md://{stem}/{name}", name: "md-{path}"}
    templates:
      - {uriTemplate: "file://docs/{+path}", name: file, source: docs, path: "{path}"}
      - {uriTemplate: "page://{name}", name: page, source: docs, path: "guides/{name}.md"}
      - {uriTemplate: "seg://x{/parts*}", name: segments, source: docs, path: "{parts}"}
      - {uriTemplate: "dot://f{.ext}", name: dot, source: docs, path: "a{ext}"}
      - {uriTemplate: "frag://a{#f}", name: fragment, source: docs, path: "{f}"}
      - {uriTemplate: "pre://{name:3}/{rest}", name: prefix, source: docs, path: "{name}/{rest}"}
      - {uriTemplate: "semi://x{;a,b}", name: semicolon, source: docs, path: "{a}/{b}"}
      - {uriTemplate: "web://{+path}{?q,lang}", name: web, source: web, path: "{path}", access: {scopes: [web]}}
      - {uriTemplate: "web://item/{id}{&page}", name: item, source: web, path: "items/{id}"}
      - {uriTemplate: "db://people/{id}", name: person, source: db, query: "select * from people where id = :id"}
      - {uriTemplate: "db://find{?name,limit}", name: find, source: db, format: csv,
         query: "select * from people where name = :name limit :limit"}
      - {uriTemplate: "r://hello/{who}{?times}", name: hello, render: "{% for i in range(2) %}{{ who }}{% endfor %}"}
      - {uriTemplate: "r://{a}-{b}{/c}{.d}", name: mixed, render: "{{ a }}"}
      - {uriTemplate: "x://any/{x}{#rest}", name: anything, source: docs, path: "{x}"}
    """

# Pieces of URIs the catalog knows, so generated URIs get past the literal prefixes into matching.
PREFIXES = ["note://", "docs://", "md://", "file://docs/", "page://", "seg://x", "dot://f", "frag://a", "pre://",
            "semi://x", "web://", "web://item/", "db://people/", "db://find", "r://hello/", "r://", "x://any/", ""]
PIECES = ["/", "//", "..", ".", "%2e%2e", "%2F", "%00", "%", "%zz", "%C3%A9", "%FF", "?", "&", "=", "#", ";",
          ",", "*", "{", "}", "a", "README.md", "guides", "page01", "\x00", "\n", "é", "\U0001f600", "\udcff",
          ".hidden.md", "~", "+", " ", "q=1", "lang=en", "id=1", "page=2", "name=x", "limit=-1", "times=9"]


@pytest.fixture(scope="module")
def aggregator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResourceService]:
    folder = tmp_path_factory.mktemp("uri-fuzz")
    docs = folder / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "guides" / "page01.md").write_text("# one\n")
    (docs / "README.md").write_text("# readme\n")
    (docs / ".hidden.md").write_text("hidden\n")
    (docs / "a.txt").write_text("a\n")
    with sqlite3.connect(folder / "db.sqlite") as db:
        db.execute("create table people (id integer primary key, name text)")
        db.execute("insert into people values (1, 'ada')")
    opened = anyio.run(ResourceService.open, write_manifest(folder, MANIFEST))
    yield opened
    anyio.run(opened.aclose)


URIS = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=80).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.tuples(st.sampled_from(PREFIXES), st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)),
                                                  max_size=12)).map(lambda p: p[0] + "".join(p[1])),
    st.tuples(st.sampled_from(PREFIXES), st.sampled_from(PIECES), st.integers(0, 20_000)).map(
        lambda p: p[0] + p[1] * p[2]),  # long repetitions: a matcher that backtracks shows here
)
SCOPES = st.one_of(st.none(), st.frozensets(st.sampled_from(["docs", "web", "other"])))


def _resolved(uri: str, aggregator: ResourceService, scopes: frozenset[str] | None) -> None:
    start = time.monotonic()
    for resolve in (aggregator.catalog.resolve, lambda u: aggregator.allowed(u, scopes)):
        try:
            target = resolve(uri)
        except ResourceNotFound as exc:
            assert exc.uri == uri
        else:
            assert isinstance(target, Target) and target.uri == uri
            if isinstance(target, FileTarget):  # never outside the source: no absolute path, no parent step
                assert not target.path.startswith("/") and ".." not in target.path.split("/")
    assert time.monotonic() - start < SECONDS


@FUZZ
@given(uri=URIS, scopes=SCOPES)
def test_resolve_only_raises_resource_not_found(aggregator: ResourceService, uri: str,
                                                scopes: frozenset[str] | None) -> None:
    _resolved(uri, aggregator, scopes)


def test_the_fuzzed_catalog_serves_every_kind(aggregator: ResourceService) -> None:
    """The catalog under fuzz is the one described: each kind of entry resolves (the fuzzer is not all misses)."""
    resolve = aggregator.catalog.resolve
    assert resolve("docs://guides/page01.md").path == "guides/page01.md"
    assert resolve("file://docs/guides/page01.md").path == "guides/page01.md"
    assert resolve("seg://x/guides/page01.md").path == "guides/page01.md"
    assert resolve("web://a/b?q=1").source == "web"
    assert resolve("db://people/1").query is not None
    assert resolve("r://hello/ada?times=2").render is not None
    with pytest.raises(ResourceNotFound):
        aggregator.allowed("docs://readme", frozenset())
    with pytest.raises(ResourceNotFound):
        resolve("file://docs/../secret")
    assert isinstance(Path(aggregator.manifest.path), Path)


def test_a_lone_surrogate_is_not_found(aggregator: ResourceService) -> None:
    """JSON may carry "\\udcff": such a URI names nothing (RE2 raised UnicodeEncodeError on it)."""
    for uri in ("file://docs/\udcff", "web://\ud800?q=1", "r://hello/\udfff"):
        with pytest.raises(ResourceNotFound):
            aggregator.allowed(uri)
