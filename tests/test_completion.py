"""completion/complete for template arguments, through the official client over stdio on both wires."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import types

from aggregator.completion import MAX_VALUES
from tests.conftest import MODES, connect, write_manifest


@pytest.fixture
def team_manifest(tmp_path: Path) -> Path:
    docs = tmp_path / "teams"
    for team, docs_of_team in {"eng": ["arch", "api", "onboarding"], "ops": ["alerts", "runbook"],
                               "sales": ["pricing"]}.items():
        (docs / team).mkdir(parents=True)
        for doc in docs_of_team:
            (docs / team / f"{doc}.md").write_text(f"# {team}/{doc}\n")
    (docs / "eng" / "deep" / "nested").mkdir(parents=True)
    (docs / "eng" / "deep" / "nested" / "x.md").write_text("x")
    (docs / "eng" / "deep" / "y.md").write_text("y")
    (docs / "eng" / "archive.md").write_text("z")
    many = tmp_path / "many"
    many.mkdir()
    for i in range(150):
        (many / f"item{i:03}.txt").write_text(str(i))
    return write_manifest(tmp_path, """
        version: 1
        server: {name: completing}
        sources:
          teams: {url: ./teams}
          many: {url: ./many}
        templates:
          - {uriTemplate: "team://{team}/{doc}", name: team-doc, source: teams, path: "{team}/{doc}.md"}
          - {uriTemplate: "tree://{+path}", name: tree, source: teams, path: "{path}"}
          - {uriTemplate: "item://{name}", name: item, source: many, path: "{name}.txt"}
          - uriTemplate: "region://{region}/{team}"
            name: by-region
            source: teams
            path: "{team}/arch.md"
            values: {region: [eu-west, eu-central, us-east]}
        """)


async def _complete(client, template: str, name: str, value: str, context: dict[str, str] | None = None):
    return (await client.complete(types.ResourceTemplateReference(uri=template), {"name": name, "value": value},
                                  context_arguments=context)).completion


@pytest.mark.parametrize("mode", MODES)
def test_completion_from_the_data(team_manifest: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(team_manifest, mode) as client:
            assert client.server_capabilities.completions is not None
            teams = await _complete(client, "team://{team}/{doc}", "team", "")
            assert teams.values == ["eng", "ops", "sales"] and teams.total == 3 and not teams.has_more
            assert (await _complete(client, "team://{team}/{doc}", "team", "o")).values == ["ops"]
            # An earlier argument narrows a later one.
            eng = await _complete(client, "team://{team}/{doc}", "doc", "a", {"team": "eng"})
            assert eng.values == ["api", "arch", "archive"]
            ops = await _complete(client, "team://{team}/{doc}", "doc", "a", {"team": "ops"})
            assert ops.values == ["alerts"]
            # Path variables complete a folder at a time, folders first.
            tree = await _complete(client, "tree://{+path}", "path", "eng/")
            assert tree.values == ["eng/deep/", "eng/api.md", "eng/arch.md", "eng/archive.md", "eng/onboarding.md"]
            deeper = await _complete(client, "tree://{+path}", "path", "eng/deep/")
            assert deeper.values == ["eng/deep/nested/", "eng/deep/y.md"]
            # Enumerations from the manifest.
            regions = await _complete(client, "region://{region}/{team}", "region", "eu")
            assert regions.values == ["eu-central", "eu-west"]
            # At most 100 values, with the total.
            items = await _complete(client, "item://{name}", "name", "item")
            assert len(items.values) == MAX_VALUES and items.total == 150 and items.has_more
            assert items.values[0] == "item000"
            # Unknown templates, unknown variables and prompt references complete to nothing.
            assert (await _complete(client, "nope://{x}", "x", "")).values == []
            assert (await _complete(client, "team://{team}/{doc}", "zzz", "")).values == []
            prompt = await client.complete(types.PromptReference(name="p"), {"name": "a", "value": ""})
            assert prompt.completion.values == []

    anyio.run(main)


def test_completion_values_never_leave_the_source(team_manifest: Path) -> None:
    outside = team_manifest.parent / "outside.md"
    outside.write_text("secret")

    async def main() -> None:
        async with connect(team_manifest, "auto") as client:
            for prefix in ("../", "/", "..", "%2e%2e/"):
                tree = await _complete(client, "tree://{+path}", "path", prefix)
                assert tree.values == []
            escaped = await _complete(client, "team://{team}/{doc}", "doc", "", {"team": "../"})
            assert escaped.values == []

    anyio.run(main)


def test_values_must_name_template_variables(tmp_path: Path) -> None:
    from aggregator.manifest import load_manifest
    from aggregator.manifest.model import ManifestError

    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: v}
        sources: {d: {url: .}}
        templates:
          - {uriTemplate: "t://{a}", name: t, source: d, path: "{a}", values: {b: [x]}}
        """)
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest)
    assert "templates[0].values.b: 'b' is not a variable of the uriTemplate (its variables: a)" in str(caught.value)
