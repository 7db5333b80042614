"""The tool fallback (`server.tools: true`) through the official client over stdio, on both wires."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from tests.conftest import MODES, PNG_BYTES, connect, write_manifest

def tools_manifest(collection: str, more: str = "") -> str:
    """A manifest with the tool fallback on (`server.tools: true`) over the folder ./docs: `collection` is its one
    collection's mapping, `more` YAML after it (at the top level, indented like the rest)."""
    return f"""
    version: 1
    server: {{name: tooled, tools: true}}
    sources:
      docs: {{url: ./docs}}
    collections:
      - {collection}
    {more}"""


MANIFEST = tools_manifest('{source: docs, glob: "**/*", uri: "docs://{path}"}', """templates:
      - {uriTemplate: "team://{team}/{doc}", name: team doc, description: One team's document., source: docs,
         path: "{team}/{doc}.md", values: {team: [eng, ops]}}
      - {uriTemplate: "search://docs{?q,lang}", name: search, render: "q={{ args.q }} lang={{ args.lang | default('-') }}"}
    """)


@pytest.fixture
def tooled(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "eng").mkdir(parents=True)
    (tmp_path / "docs" / "eng" / "api.md").write_text("# API\n")
    (tmp_path / "docs" / "logo.png").write_bytes(PNG_BYTES)
    return write_manifest(tmp_path, MANIFEST)


@pytest.mark.parametrize("mode", MODES)
def test_tools_match_resources_read(tooled: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(tooled, mode) as client:
            assert client.server_capabilities.tools is not None
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"read_resource", "list_resources", "search_resources", "read_team_doc",
                                  "read_search"}
            team = tools["read_team_doc"].input_schema
            assert team["required"] == ["team", "doc"] and team["properties"]["team"]["enum"] == ["eng", "ops"]
            assert tools["read_search"].input_schema["required"] == []  # query variables are optional
            assert tools["read_resource"].annotations.read_only_hint

            for uri, call in [("docs://eng/api.md", ("read_resource", {"uri": "docs://eng/api.md"})),
                              ("docs://logo.png", ("read_resource", {"uri": "docs://logo.png"})),
                              ("team://eng/api", ("read_team_doc", {"team": "eng", "doc": "api"})),
                              ("search://docs?q=mcp", ("read_search", {"q": "mcp"}))]:
                result = await client.call_tool(*call)
                assert not result.is_error
                embedded = result.content[0]
                assert isinstance(embedded, types.EmbeddedResource)
                read = (await client.read_resource(uri)).contents[0]
                assert embedded.resource.model_dump() == read.model_dump()
            search = await client.call_tool("read_search", {"q": "mcp", "lang": "en"})
            assert search.content[0].resource.text == "q=mcp lang=en"

            missing = await client.call_tool("read_resource", {"uri": "docs://nope.md"})
            assert missing.is_error and "docs://nope.md" in missing.content[0].text
            bad = await client.call_tool("read_team_doc", {"team": "eng"})
            assert bad.is_error and "doc" in bad.content[0].text
            unsafe = await client.call_tool("read_team_doc", {"team": "..", "doc": "secret"})
            assert unsafe.is_error and "not found" in unsafe.content[0].text.lower()
            with pytest.raises(MCPError):
                await client.call_tool("no_such_tool", {})

    anyio.run(main)


def test_no_tools_unless_asked(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, MANIFEST.replace("tools: true", "tools: false"))
    (tmp_path / "docs").mkdir()

    async def main() -> None:
        async with connect(manifest, "auto") as client:
            assert client.server_capabilities.tools is None

    anyio.run(main)
