"""The catalog compiled from a typed manifest: order, cursors across rebuilds, collisions, template lookup."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.catalog import Catalog, Entry, FileTarget, prefix_range
from aggregator.catalog_rows import Rows
from aggregator.compiler import compile_catalog
from aggregator.errors import InvalidCursor, ResourceNotFound
from aggregator.manifest.model import (
    Annotations,
    CollectionSpec,
    Defaults,
    Display,
    Location,
    Manifest,
    ManifestError,
    ResourceSpec,
    ServerSettings,
    SourceSpec,
    TemplateSpec,
)
from aggregator.sources import LocalSource

HERE = Location("m.yaml", 1, 1)


def manifest(root: Path, *, resources=(), collections=(), templates=()) -> Manifest:
    source = SourceSpec("docs", str(root), "file", HERE, "sources.docs")
    return Manifest(Path("m.yaml"), ServerSettings("t"), Defaults(), {"docs": source},
                    tuple(resources), tuple(collections), tuple(templates))


def collection(uri: str = "docs://{path}", glob: str = "**/*.md", line: int = 5, **kw) -> CollectionSpec:
    return CollectionSpec("docs", glob, uri, kw.pop("name", "{path}"), Display(**kw), Location("m.yaml", line, 3),
                          "collections[0]")


def compile_(m: Manifest) -> Catalog:
    return anyio.run(compile_catalog, m, {"docs": LocalSource("docs", m.sources["docs"].url)})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ["b.md", "a.md", "sub/c.md", "sub/d e.md", "x.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    return tmp_path


def test_collection_entries_patterns_and_order(root: Path) -> None:
    cat = compile_(manifest(root, collections=[collection(name="{stem}.{ext}", title="T {name}")]))
    assert [e.uri for e in cat.entries] == ["docs://a.md", "docs://b.md", "docs://sub/c.md", "docs://sub/d%20e.md"]
    d = cat.get("docs://sub/d%20e.md")
    assert d is not None and d.name == "d e.md" and d.title == "T d e.md" and d.path == "sub/d e.md"
    assert d.mime_type == "text/markdown" and d.size == len("sub/d e.md")
    assert d.last_modified is not None and d.last_modified.endswith("Z")
    assert d.listed_last_modified is None  # listed only when the manifest asks for it


def test_last_modified_is_listed_when_asked(root: Path) -> None:
    import os

    os.utime(root / "a.md", (1_700_000_000, 1_700_000_000))
    by_file = compile_(manifest(root, collections=[collection(annotations=Annotations(last_modified="file"))]))
    entry = by_file.get("docs://a.md")
    assert entry is not None and entry.listed_last_modified == entry.last_modified == "2023-11-14T22:13:20Z"
    given = Annotations(last_modified="2026-01-01T00:00:00Z")
    fixed = compile_(manifest(root, collections=[collection(annotations=given)]))
    entry = fixed.get("docs://a.md")
    assert entry is not None and entry.listed_last_modified == entry.last_modified == "2026-01-01T00:00:00Z"
    # What resources/list shows changes with it: a touched file changes the listing only when mtimes are listed.
    plain = compile_(manifest(root, collections=[collection()]))
    os.utime(root / "a.md", (1_800_000_000, 1_800_000_000))
    assert compile_(manifest(root, collections=[collection()])).listing_signature == plain.listing_signature
    touched = compile_(manifest(root, collections=[collection(annotations=Annotations(last_modified="file"))]))
    assert touched.listing_signature != by_file.listing_signature


def test_pages_and_cursor_survive_rebuild(root: Path) -> None:
    cat = compile_(manifest(root, collections=[collection()]))
    first = cat.page(None, 2)
    assert [e.uri for e in first.items] == ["docs://a.md", "docs://b.md"] and first.next_cursor
    # A rebuilt catalog (one file gone, one added before the cursor) resumes after the last URI seen.
    (root / "b.md").unlink()
    (root / "aa.md").write_text("new")
    rebuilt = compile_(manifest(root, collections=[collection()]))
    rest = rebuilt.page(first.next_cursor, 10)
    assert [e.uri for e in rest.items] == ["docs://sub/c.md", "docs://sub/d%20e.md"] and rest.next_cursor is None
    assert cat.page("", 2).items == first.items  # an empty cursor is the start
    for bad in ["garbage", "Zm9v", "!!!"]:
        with pytest.raises(InvalidCursor):
            cat.page(bad, 2)


def test_uri_collisions_are_located_errors(root: Path) -> None:
    readme = ResourceSpec("docs://a.md", "a", Display(), Location("m.yaml", 3, 5), "resources[0]", source="docs",
                          path="a.md")
    with pytest.raises(ManifestError) as err:
        compile_(manifest(root, resources=[readme], collections=[collection(line=9)]))
    (issue,) = err.value.issues
    assert (issue.line, issue.col) == (9, 3)
    assert "docs://a.md" in issue.message and "resources[0]" in issue.message and "m.yaml:3:5" in issue.message

    twin = TemplateSpec("x://{a}", "t", "docs", "{a}", Display(), Location("m.yaml", 12, 3), "templates[1]")
    first = TemplateSpec("x://{a}", "t", "docs", "{a}", Display(), Location("m.yaml", 11, 3), "templates[0]")
    with pytest.raises(ManifestError) as err:
        compile_(manifest(root, templates=[first, twin]))
    assert err.value.issues[0].line == 12 and "templates[0]" in err.value.issues[0].message


def test_resolve_listed_then_most_specific_template(root: Path) -> None:
    generic = TemplateSpec("x://{+path}", "any", "docs", "{path}", Display(), HERE, "templates[0]")
    specific = TemplateSpec("x://sub/{name}", "sub", "docs", "sub/{name}.md", Display(), HERE, "templates[1]")
    cat = compile_(manifest(root, collections=[collection(uri="x://{path}")], templates=[generic, specific]))
    assert cat.resolve("x://a.md").path == "a.md"              # listed
    assert cat.resolve("x://sub/c").path == "sub/c.md"         # the more literal template
    assert cat.resolve("x://x.txt").path == "x.txt"            # the generic one
    assert cat.resolve("x://x.txt").mime_type == "text/plain"  # guessed from the path
    with pytest.raises(ResourceNotFound):
        cat.resolve("y://a.md")


def read(cat: Catalog, uri: str, root: Path) -> bytes:
    target = cat.resolve(uri)
    assert isinstance(target, FileTarget)
    return anyio.run(LocalSource("docs", str(root)).read, target.path, 1 << 16).data


def test_a_match_refused_for_safety_never_falls_through(root: Path) -> None:
    """`x://sub/a%2Fb` puts a '/' in the one-segment {name}: refused, and not then served by `x://{+rest}`."""
    (root / "sub" / "a").mkdir()
    (root / "sub" / "a" / "b").write_text("the looser template's file")
    loose = TemplateSpec("x://{+rest}", "any", "docs", "{rest}", Display(), HERE, "templates[0]")
    specific = TemplateSpec("x://sub/{name}", "sub", "docs", "sub/{name}.md", Display(), HERE, "templates[1]")
    # Alone, the looser template reads a real file for these URIs: they are not simply unmatched.
    alone = compile_(manifest(root, templates=[loose]))
    for uri in ("x://sub/a%2Fb", "x://sub/a%2fb"):
        assert read(alone, uri, root) == b"the looser template's file"
    both = compile_(manifest(root, templates=[loose, specific]))
    assert read(both, "x://sub/c", root) == b"sub/c.md"  # the specific template answers first (`sub/c` is no file)
    for uri in ("x://sub/a%2Fb", "x://sub/a%2fb"):
        with pytest.raises(ResourceNotFound):
            both.resolve(uri)


def test_missing_explicit_file_is_listed_without_size(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    gone = ResourceSpec("docs://gone", "gone", Display(), Location("m.yaml", 4, 5), "resources[0]", source="docs",
                        path="gone.md")
    cat = compile_(manifest(root, resources=[gone]))
    entry = cat.get("docs://gone")
    assert isinstance(entry, Entry) and entry.size is None
    assert "m.yaml:4:5" in caplog.text and "gone.md" in caplog.text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab\U0010ffff/:", max_size=5), max_size=30),
       st.text(alphabet="ab\U0010ffff/:", max_size=3))
def test_prefix_range_is_exactly_the_keys_with_the_prefix(keys: list[str], prefix: str) -> None:
    keys = sorted(keys)
    start, end = prefix_range(keys, prefix)
    assert keys[start:end] == [k for k in keys if k.startswith(prefix)]


def test_a_listed_uri_resolves_alike_again_and_in_a_successor_afresh(root: Path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """A listed URI's target is kept once resolved (the same again, past the bound the kept ones are dropped and
    resolved anew); a successor with other entries resolves its own, never one its predecessor kept."""
    monkeypatch.setattr("aggregator.catalog._MAX_TARGETS", 2)
    cat = compile_(manifest(root, collections=[collection()]))
    uris = [e.uri for e in cat.entries]
    first = [cat.resolve(uri) for uri in uris]
    assert [cat.resolve(uri) for uri in uris] == first
    assert [t.path for t in first if isinstance(t, FileTarget)] == ["a.md", "b.md", "sub/c.md", "sub/d e.md"]
    moved = [e._replace(path=f"moved/{e.path}") for e in cat.entries]
    later = cat.successor(Rows.of(moved), uris, cat.generation + 1, 0)
    got = later.resolve(uris[0])
    assert isinstance(got, FileTarget) and got.path == "moved/a.md"
    assert cat.resolve(uris[0]) == first[0]
