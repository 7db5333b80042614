"""An upstream relisted in place (live.relisted.relist_upstream over catalog_published.apply_upstream) against a
fresh compile: over random sequences of what an upstream lists and publishes (resources that come, change and go,
templates that come and go), beside a real folder, the catalog spliced change by change equals `compile_catalog`
over the same sources (entries, order, lookups, pages, scope views, collections, templates), collisions included.
The upstream is an in-memory publishing source (the backend, not the part under test)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aggregator import chunked
from aggregator.catalog import Catalog
from aggregator.compiler import compile_catalog
from aggregator.globs import path_filter
from aggregator.live.relisted import relist_upstream
from aggregator.manifest.model import (CollectionSpec, Defaults, Display, Location, Manifest, ManifestError,
                                       ResourceSpec, ServerSettings, SourceSpec, TemplateSpec)
from aggregator.service import ResourceService
from aggregator.sources import Blob, FileInfo, LocalSource, Source, SourceError, SourceNotFound
from aggregator.upstream.answers import ListedResource
from aggregator.upstream.records import PublishedRecords, ResourceRecords
from aggregator.sources.base import Published, PublishedResource, PublishedTemplate
from tests.test_catalog_delta import SCOPES, _collided, assert_same

NAMES = ["a.md", "b.md", "c/one", "c/two", "d/a.md", "d/z.md", "x", "r", "deep/er/q"]
"""Paths the upstream picks from: under a collection over it (c/*, d/*.md: d/a.md collides with the folder's
docs://d/a.md), a resource naming it (r), one whose published URI a manifest resource holds (x)."""
UNLISTED = "c/templated"
"""A path a manifest resource names that the upstream answers but never lists (a templated URI)."""
TEMPLATES = ["t/{id}", "u/{id}", "m/{id}"]
"""Templates it picks from: m/{id} is also the manifest's (a collision)."""


class Board(Source):
    """A namespaced upstream held in memory: it lists and publishes what the test sets."""

    pushes_changes = True
    uri_paths = True  # type: ignore[assignment]

    def __init__(self) -> None:
        self.id = "up"
        self.files: dict[str, tuple[int, str]] = {}  # path -> (size, title)
        self.templates: set[str] = set()
        self.down = False
        """Every call fails (the connection is lost)."""
        self.columns = False
        """Publish as `upstream.records` columns (an mcp source's), not as a list of resources."""

    def _answer(self) -> None:
        if self.down:
            raise SourceError("connection lost")

    @property
    def publishes(self) -> bool:
        return True

    async def published(self) -> Published:
        self._answer()
        templates = [PublishedTemplate(f"up+test://{t}", t, t, None, None, None) for t in sorted(self.templates)]
        if self.columns:  # as an mcp source publishes them: records kept as columns, rows compact
            return Published(PublishedRecords(ResourceRecords(
                [ListedResource(f"test://{path}", path.rsplit("/", 1)[-1], title, None, None, size)
                 for path, (size, title) in self.files.items()], "up+"), "test://"), templates)
        return Published([PublishedResource(f"up+test://{path}", path, path.rsplit("/", 1)[-1], title, None, None,
                                            size) for path, (size, title) in sorted(self.files.items())], templates)

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        self._answer()
        keep = path_filter(pattern, exclude, hidden)
        return [FileInfo(path, size) for path, (size, _) in self.files.items() if keep(path)]

    async def stat(self, path: str) -> FileInfo:
        self._answer()
        if path == UNLISTED:  # it reads, so it exists, though the upstream never lists it
            return FileInfo(path, 7)
        if path not in self.files:
            raise SourceNotFound(path)
        return FileInfo(path, self.files[path][0])

    async def read(self, path: str, max_bytes: int) -> Blob:
        raise SourceNotFound(path)

    def describe(self) -> str:
        return "board"


def _where(line: int) -> Location:
    return Location("m.yaml", line, 3)


def _manifest(root: Path, stale_if_error: float) -> Manifest:
    sources = {"docs": SourceSpec("docs", str(root), "file", _where(1), "sources.docs"),
               "up": SourceSpec("up", "mcp+stdio:", "mcp", _where(2), "sources.up", kind="mcp",
                                access=frozenset({"s"}), stale_if_error=stale_if_error)}
    collections = (
        CollectionSpec("docs", "**/*.md", "docs://{path}", "{name}", Display(), _where(10), "collections[0]"),
        CollectionSpec("up", "c/*", "c://{name}", "{name}", Display(), _where(11), "collections[1]",
                       access=frozenset({"t"})),
        CollectionSpec("up", "d/*.md", "docs://{path}", "{name}", Display(), _where(12), "collections[2]"),
    )
    resources = (
        ResourceSpec("up+test://x", "x", Display(), _where(3), "resources[0]", text="held"),
        ResourceSpec("res://r", "r", Display(), _where(4), "resources[1]", source="up", path="r"),
        ResourceSpec("res://t", "t", Display(), _where(5), "resources[2]", source="up", path=UNLISTED),
    )
    templates = (TemplateSpec("up+test://m/{id}", "m", "docs", "m/{id}", Display(), _where(5), "templates[0]"),)
    return Manifest(Path("m.yaml"), ServerSettings("t"), Defaults(), sources, resources, collections, templates)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunked, "LOAD", 2)
    monkeypatch.setattr(chunked, "_FEW", 1)


Step = list[tuple[str, str, int]]
_steps = st.lists(st.lists(st.one_of(
    st.tuples(st.sampled_from(["put", "drop"]), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.sampled_from(["template", "untemplate"]), st.sampled_from(TEMPLATES), st.just(0)),
    st.tuples(st.sampled_from(["down", "back"]), st.just(""), st.just(0)),
), min_size=1, max_size=4), min_size=1, max_size=6)


def _change(board: Board, step: Step) -> None:
    for op, name, n in step:
        if op == "put":
            board.files[name] = (n, f"v{n % 2}")  # a size and a title that change apart
        elif op == "drop":
            board.files.pop(name, None)
        elif op in ("down", "back"):
            board.down = op == "down"
        elif op == "template":
            board.templates.add(name)
        else:
            board.templates.discard(name)


def _assert_templates(got: Catalog, want: Catalog) -> None:
    assert got.templates == want.templates
    assert got.templates_shown() == want.templates_shown()
    for uri in ("up+test://t/1", "up+test://u/2", "up+test://m/3", "up+test://nope"):
        try:
            found: object = got.resolve(uri)
        except Exception as exc:  # noqa: BLE001 - the same refusal either way
            found = type(exc)
        try:
            wanted: object = want.resolve(uri)
        except Exception as exc:  # noqa: BLE001
            wanted = type(exc)
        assert found == wanted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=st.sets(st.sampled_from(NAMES), max_size=5), steps=_steps, stale_if_error=st.sampled_from([0, 3600]),
       columns=st.booleans())
def test_an_upstream_relisted_in_place_equals_a_fresh_compile(tmp_path: Path, initial: set[str], steps: list[Step],
                                                              stale_if_error: float, columns: bool) -> None:
    """staleIfError 0 drops what the upstream listed once it cannot be listed, an hour keeps it (the fresh compile
    then builds on the catalog before it, as the supervisor's relist does)."""
    root = tmp_path / "f"
    (root / "d").mkdir(parents=True, exist_ok=True)
    (root / "a.md").write_text("a")
    (root / "d" / "a.md").write_text("da")
    m = _manifest(root, stale_if_error)
    board = Board()
    board.columns = columns
    board.files = {name: (1, "v1") for name in initial}
    sources: dict[str, Source] = {"docs": LocalSource("docs", str(root)), "up": board}

    async def main() -> None:
        try:
            catalog: Catalog | None = await compile_catalog(m, sources)
        except ManifestError:
            catalog = None  # the supervisor keeps serving the last good catalog and relists on the next change
        for step in steps:
            _change(board, step)
            try:
                want: Catalog | None = await compile_catalog(m, sources, previous=catalog)
            except ManifestError as exc:
                want, error = None, exc
            if catalog is None:  # out of step with the upstream: only a full relist catches up
                catalog = want
                event("relisted after a collision")
                continue
            for scopes in SCOPES:  # views the successor must carry (or rebuild) correctly
                catalog.visible(scopes)
            service = ResourceService(m, sources, catalog)
            if want is None:
                with pytest.raises(ManifestError) as raised:
                    await relist_upstream(service, "up")
                assert _collided(raised.value) == _collided(error)
                assert service.catalog is catalog
                event("a collision")
                catalog = None
                continue
            delta = await relist_upstream(service, "up")
            got = service.catalog
            if delta is None:
                assert got is catalog
                event("nothing changed")
            else:
                assert got is delta.catalog and got.generation == catalog.generation + 1
                assert delta.listing_changed == (catalog.listing_signature != want.listing_signature)
                assert delta.added == set(want._uris) - set(catalog._uris)
                assert delta.removed == set(catalog._uris) - set(want._uris)
                assert delta.gone >= catalog.targets() - want.targets()
                event(f"listing changed: {delta.listing_changed}")
            assert_same(got, want)
            _assert_templates(got, want)
            assert got.published == want.published
            if board.down:  # what is kept counts its age from when it was listed, in both
                event("down")
                ages = [key for key in want.listed_at if key.source == "up"]
                assert [got.listed_at[k] for k in ages] == [want.listed_at[k] for k in ages] or not stale_if_error
                assert got.published_at == want.published_at or not stale_if_error
            catalog = got

    anyio.run(main)
