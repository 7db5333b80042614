"""What a scoped console caller may learn of changes it may not see, over real HTTP with real tokens: a save about
hidden things alone changes nothing the reader sees (no catalog generation, no manifest digest, no reload record,
no event, no listing time), while the admin, who sees everything, sees the generation advance; and a reload whose change lines
could not be computed (a source kind that fails to compare its settings) is not shown to the reader at all, since
it cannot be proven to be about what the reader may see; and a stream open across a reload that hides a source from
its caller filters by what the caller may see after it, not by what it saw when the stream opened. In process, a
scoped stream decides from each change's ListingChange, never by comparing the catalogs it sees (O(n))."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from watchfiles import Change

from aggregator.catalog import Catalog
from tests.console_server import READER, Served, make_folder, serve
from tests.served import ROOT
from tests.test_console import _admin_and_reader
from tests.test_live import save

HIDDEN = 'resources:\n  - {uri: "secret://hush", name: hush, text: "h", access: {scopes: [secret]}}\n'
VISIBLE = 'resources:\n  - {uri: "note://new", name: new, text: "new"}\n'


def _reader_sees(running: Served) -> dict[str, Any]:
    """Everything the reader's overview, sources (their rows with their listing times too) and reload list say."""
    return {"whoami": running.get("/console/api/whoami", READER).json(),
            "sources": running.get("/console/api/sources", READER).json(),
            "reloads": running.get("/console/api/reloads", READER).json()}


def _listed_at(running: Served, times: int) -> set[tuple[tuple[str, float | None], ...]]:
    """The reader's sources' listing times, as `times` requests in a row say them (one set member when they agree)."""
    return {tuple((row["id"], row["listedAt"]) for row in running.get("/console/api/sources", READER).json()["sources"])
            for _ in range(times)}


def test_a_listing_time_moves_only_when_its_source_is_listed_again(tmp_path: Path) -> None:
    """The reader's watched docs folder, listed once at start: every request says the same listing time, before
    and after a save about the hidden source alone (which lists that source again, and not the docs folder); a
    save that changes the docs source lists it again, and its time moves then."""
    with serve(tmp_path) as running:
        with _admin_and_reader(running) as (admin, _):
            [before] = _listed_at(running, 30)
            assert dict(before)["docs"] is not None
            hidden_source = running.manifest.read_text().replace("  secret: {url: ./secret,",
                                                                 "  secret: {url: ./secret, description: s,")
            save(running.manifest, hidden_source)
            admin.wait_for("reload", generation=2)
            assert _listed_at(running, 30) == {before}
            save(running.manifest, hidden_source.replace("  docs: {url: ./docs}", "  docs: {url: ./docs, "
                                                                                   "description: d}"))
            admin.wait_for("reload", generation=3)
            [after] = _listed_at(running, 5)
            assert dict(after)["docs"] > dict(before)["docs"] and dict(after)["web"] == dict(before)["web"]


def test_a_save_about_hidden_things_alone_changes_nothing_a_scoped_caller_sees(tmp_path: Path) -> None:
    with serve(tmp_path) as running:
        with _admin_and_reader(running) as (admin, reader):
            generation = running.get("/console/api/whoami").json()["generation"]
            before = _reader_sees(running)
            text = running.manifest.read_text()
            hidden = text.replace("resources:\n", HIDDEN)
            save(running.manifest, hidden)
            assert admin.wait_for("catalog")["generation"] == generation + 1  # the admin's view is unchanged
            admin.wait_for("reload", generation=generation + 1)
            assert _reader_sees(running) == before
            save(running.manifest, hidden.replace("resources:\n", VISIBLE))
            admin.wait_for("reload", generation=generation + 2)
            reader.wait_for("catalog")
            reader.wait_for("reload", ok=True)
            assert [name for name, _ in reader.frames] == ["hello", "catalog", "reload"]
            # The reader is told that its view changed, never which global generation that is (nor the gap).
            assert all("generation" not in data for _, data in reader.frames), reader.frames
            after = _reader_sees(running)
            assert "generation" not in after["whoami"] and "manifestDigest" not in after["whoami"]
            assert "generation" not in after["sources"] and "manifestDigest" not in after["sources"]
            assert "generation" not in after["reloads"]
            [seen] = after["reloads"]["reloads"]
            assert seen["lines"] == ["+ note://new"] and "generation" not in seen and "digest" not in seen
            everything = running.get("/console/api/reloads").json()
            assert everything["generation"] == generation + 2
            assert [r["generation"] for r in everything["reloads"]] == [generation + 2, generation + 1]
            assert all(r["digest"] for r in everything["reloads"])
            as_reader = running.get("/console/api/whoami", **{"as": "docs"}).json()
            assert "generation" not in as_reader and "manifestDigest" not in as_reader


BROKEN_KIND = '''\
"""An installed source kind that replaces the file kind and fails to compare two sources' settings."""
from aggregator.sources.builtin import LocalKind


class FileKind(LocalKind):
    def changed(self, old, new):
        raise RuntimeError("this kind cannot compare its settings")
'''


def _broken_kind(site: Path) -> Path:
    """What installing a package whose entry point replaces the `file` kind with BROKEN_KIND leaves on the path."""
    info = site / "broken_diff_kind-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-diff-kind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[aggregator.source_kinds]\nfile = broken_diff_kind:FileKind\n")
    (site / "broken_diff_kind.py").write_text(BROKEN_KIND)
    return site


def test_a_reload_whose_change_lines_are_unknown_is_not_shown_to_a_scoped_caller(tmp_path: Path) -> None:
    """Every reload's diff fails here: the admin sees each record, marked as having no known lines; the reader,
    who cannot be shown that such a reload was about what it may see, sees none of them (as a reload about
    hidden things alone), and still hears `catalog` when what it sees changed."""
    site = _broken_kind(tmp_path / "site")
    with serve(tmp_path, extra_env={"PYTHONPATH": os.pathsep.join((str(ROOT), str(site)))}) as running:
        with _admin_and_reader(running) as (admin, reader):
            hidden = running.manifest.read_text().replace("resources:\n", HIDDEN)
            save(running.manifest, hidden)
            first = admin.wait_for("reload", ok=True)
            assert "could not be computed" in running.log.read_text()
            [record] = running.get("/console/api/reloads").json()["reloads"]
            assert running.get("/console/api/reloads", READER).json()["reloads"] == []
            assert record["generation"] == first["generation"] and record["lines"] == []
            assert record["linesKnown"] is False
            save(running.manifest, hidden.replace("resources:\n", VISIBLE))
            admin.wait_for("reload", generation=first["generation"] + 1)
            reader.wait_for("catalog")
            assert [name for name, _ in reader.frames] == ["hello", "catalog"], reader.frames
            assert running.get("/console/api/reloads", READER).json()["reloads"] == []
            assert len(running.get("/console/api/reloads").json()["reloads"]) == 2
            assert "secret" not in json.dumps(reader.frames)


SECRET_SOURCE = "  secret: {url: ./secret, access: {scopes: [secret]}}\n"
MORE_SECRET = 'resources:\n  - {uri: "secret://extra", name: extra, source: secret, path: plan.md}\n'


def test_a_stream_open_across_a_reload_that_hides_a_source_follows_the_new_rules(tmp_path: Path) -> None:
    """The reader's stream opens while the secret source is open to all (the reader sees everything, so it is told
    the generation); a save puts the source behind the `secret` scope, and the reader hears `catalog` (what it sees
    lost the source's entries), but no `reload` (its lines are about what it may no longer see) and no generation;
    a later save about the now hidden source alone reaches the admin's stream and not the reader's, which still
    hears a visible change after it."""
    manifest = make_folder(tmp_path)
    shown = manifest.read_text().replace(SECRET_SOURCE, "  secret: {url: ./secret}\n")
    assert shown != manifest.read_text()
    manifest.write_text(shown)
    with serve(tmp_path, manifest) as running:
        with _admin_and_reader(running) as (admin, reader):
            assert reader.wait_for("hello")["generation"] == 1  # it sees everything now
            hidden = shown.replace("  secret: {url: ./secret}\n", SECRET_SOURCE)
            save(running.manifest, hidden)
            admin.wait_for("reload", generation=2)
            reader.wait_for("catalog")
            save(running.manifest, hidden.replace("resources:\n", MORE_SECRET))  # the hidden source alone
            admin.wait_for("reload", generation=3)
            save(running.manifest, hidden.replace("resources:\n", MORE_SECRET + VISIBLE.removeprefix("resources:\n")))
            admin.wait_for("reload", generation=4)
            reader.wait_for("reload", ok=True)
            # The events after hello: what its view lost, then only the visible change (its catalog and reload).
            assert [name for name, _ in reader.frames] == ["hello", "catalog", "catalog", "reload"], reader.frames
            assert all("generation" not in data for _, data in reader.frames[1:]), reader.frames
            assert "secret" not in json.dumps(reader.frames)
            [seen] = running.get("/console/api/reloads", READER).json()["reloads"]
            assert seen["lines"] == ["+ note://new"]


GUIDE = '  - {uriTemplate: "guide://{name}", name: guide, title: A guide by name, source: docs, path: "guides/{name}.md"}\n'
SECRET_TEMPLATE = '  - {uriTemplate: "secret://by-name/{name}", name: secret-by-name, source: secret, path: "{name}.md"}\n'


def test_a_scoped_stream_learns_of_reloads_without_comparing_whole_catalogs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, a docs-scoped console stream open across reloads hears `catalog` exactly when what it sees
    changed: not for a hidden resource or a hidden template's values, but for a visible resource, a visible
    template's values and its entries' source (shown by the console, not by resources/list). Deciding so never asks
    for the caller's view of a whole catalog (`Catalog.visible`, O(n) in the entries it sees, on every reload)."""
    from starlette.requests import Request

    from aggregator.console.app import Console
    from aggregator.notify import Notifier
    from aggregator.service import ResourceService
    from aggregator.supervisor import Supervisor
    from tests.console_server import TOKENS

    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    manifest = make_folder(tmp_path)
    scopes = frozenset({"docs"})
    viewed: list[frozenset[str] | None] = []
    visible = Catalog.visible

    def counted(catalog: Catalog, asked: frozenset[str] | None = None) -> Any:
        viewed.append(asked)
        return visible(catalog, asked)

    async def main() -> tuple[list[str], int]:
        service = await ResourceService.open(manifest)
        live = Supervisor(service, notifier := Notifier())
        console = Console(live)
        request = Request({"type": "http", "method": "GET", "headers": [], "query_string": b"", "path": "/"})
        frames = (await console.stream(request, scopes)).body_iterator
        told: list[str] = []

        async def next_event() -> str:
            with anyio.fail_after(10):
                frame = await frames.__anext__()
            return str(frame).split("\n", 1)[0].removeprefix("event: ")

        async def reload(text: str) -> None:
            generation = service.catalog.generation
            save(manifest, text)
            await live.reload_if_changed()
            assert service.catalog.generation == generation + 1

        try:
            told.append(await next_event())  # hello
            monkeypatch.setattr(Catalog, "visible", counted)
            text = manifest.read_text()
            await reload(text := text.replace("resources:\n", HIDDEN))  # hidden alone: nothing
            await reload(text := text.replace("resources:\n", VISIBLE))
            told += [await next_event(), await next_event()]
            sent = notifier.sent_list_changed
            hidden_values = SECRET_TEMPLATE.replace('"{name}.md"}', '"{name}.md", values: {name: [plan]}}')
            await reload(text := text.replace(SECRET_TEMPLATE, hidden_values))  # a hidden template's values
            await reload(text := text.replace(GUIDE, GUIDE.replace('.md"}', '.md", values: {name: [intro]}}')))
            told += [await next_event(), await next_event()]
            # The docs source renamed: its entries and template list the same, and show another source.
            await reload(text.replace("  docs: {url: ./docs}", "  library: {url: ./docs}")
                         .replace("source: docs", "source: library"))
            told += [await next_event(), await next_event()]
            unlisted = notifier.sent_list_changed - sent
            # A visible file changed size in place (no list_changed is sent for that), then a hidden file came: the
            # caller is told at that list change, as what it sees changed since it was last told.
            (tmp_path / "docs" / "api.json").write_text("[]")
            await live.files_changed("library", {(Change.modified, "api.json")})  # docs, renamed
            (tmp_path / "secret" / "more.md").write_text("# more\n")
            await live.files_changed("secret", {(Change.added, "more.md")})
            told.append(await next_event())
        finally:
            await frames.aclose()
            await service.aclose()
        return told, unlisted

    told, unlisted = anyio.run(main)
    assert told == ["hello", "catalog", "reload", "catalog", "reload", "catalog", "reload", "catalog"], told
    assert viewed.count(scopes) == 0, f"the caller's view of a whole catalog was taken {viewed.count(scopes)} times"
    assert unlisted == 0  # the values and source changes listed nothing else: no MCP client was told of them
