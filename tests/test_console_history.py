"""The console's reload history costs what a reload changed, not the catalog: a save beside a folder of thousands
of files builds none of their entries to say what it did, and still says it as `aggregator diff` does (each line
with the scopes of what it names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from aggregator.entry_builder import EntryBuilder
from aggregator.notify import Notifier
from aggregator.service import ResourceService
from aggregator.supervisor import Supervisor
from tests.conftest import write_manifest
from tests.test_live import save

FILES = 3000

MANIFEST = """\
version: 1
server: {name: history, reloadSettle: 10ms}
sources:
  docs: {url: ./docs}
collections:
  - {source: docs, glob: "**/*.md", uri: "docs://{path}", access: {scopes: [docs]}}
resources:
  - {uri: "note://kept", name: kept, text: "kept"}
  - {uri: "note://edited", name: edited, text: "before"}
  - {uri: "note://gone", name: gone, text: "gone"}
"""


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the entries built from the collection's compact rows (one per row a walk of the catalog meets)."""
    built: list[int] = []
    row_entry, row_entries = EntryBuilder.row_entry, EntryBuilder.row_entries

    def one(builder: EntryBuilder, *args: Any) -> Any:
        built.append(1)
        return row_entry(builder, *args)

    def many(builder: EntryBuilder, uris: Any, *args: Any) -> Any:
        built.append(len(uris))
        return row_entries(builder, uris, *args)

    monkeypatch.setattr(EntryBuilder, "row_entry", one)
    monkeypatch.setattr(EntryBuilder, "row_entries", many)
    return built


def test_a_save_beside_thousands_of_files_builds_none_of_their_entries_for_the_history(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save that edits one manifest resource, removes one and adds a scoped one: the history's lines are those of
    `aggregator diff`, each with its scopes, and no entry of the 3,000 kept files is built to find them (the history
    compared both whole catalogs: two entries a file)."""
    docs = tmp_path / "docs"
    for i in range(FILES):
        (docs / f"d{i // 100:02}").mkdir(parents=True, exist_ok=True)
        (docs / f"d{i // 100:02}" / f"f{i:05}.md").write_text(f"# {i}\n")
    manifest = write_manifest(tmp_path, MANIFEST)
    edited = (MANIFEST.replace('text: "before"', 'text: "after", title: Edited')
              .replace('  - {uri: "note://gone", name: gone, text: "gone"}\n',
                       '  - {uri: "note://new", name: new, text: "new", access: {scopes: [notes]}}\n'))

    async def main() -> list[tuple[str, frozenset[str]]]:
        service = await ResourceService.open(manifest)
        try:
            live = Supervisor(service, Notifier())
            live.history.keep_diffs = True  # as a console turns them on
            assert len(service.catalog) == FILES + 3
            built = _counted(monkeypatch)
            save(manifest, edited)
            assert await live.reload_if_changed()
            assert service.catalog.generation == 2
            assert sum(built) < 100, f"{sum(built)} entries built for a save that changed 3 resources"
            [record] = live.history.records
            assert record.ok and record.lines_known and record.more == 0 and record.resources == FILES + 3
            return [(line.text, line.access) for line in record.lines]
        finally:
            await service.aclose()

    assert anyio.run(main) == [("~ note://edited (title, size, text)", frozenset()), ("- note://gone", frozenset()),
                               ("+ note://new", frozenset({"notes"}))]
