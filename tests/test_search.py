"""Discovery end to end: the list_resources and search_resources tools, the search:// resource template and the
full-text index (index: true), through the official client over stdio on both wires, and over HTTP with tokens
whose scopes hide entries; hostile queries fuzzed in process. The indexer's own tests: test_search_indexer.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.shared.exceptions import MCPError

from aggregator.service import ResourceService
from aggregator.errors import InvalidCursor
from aggregator.search import SEARCH_TEMPLATE, Discovery, InvalidSearch
from tests.conftest import MODES, PNG_BYTES, connect, write_manifest
from tests.test_auth import _client
from tests.served import serve_http

SOON = 10.0

MANIFEST = """
    version: 1
    server: {name: finder, tools: true, pageSize: 4}
    sources:
      docs: {url: ./docs}
      notes: {url: ./notes}
    collections:
      - {source: docs, glob: "**/*", uri: "docs://{path}", name: "{stem}", index: true,
         description: Product documentation.}
      - {source: notes, glob: "*.md", uri: "notes://{path}", title: "Note {stem}"}
    resources:
      - {uri: "about://server", name: about, text: "Inline text, never indexed: pelican", description: About me.}
    templates:
      - {uriTemplate: "docs://by-name/{name}", name: doc by name, source: docs, path: "{name}.md"}
    """


def make_tree(folder: Path) -> None:
    docs, notes = folder / "docs", folder / "notes"
    (docs / "guides").mkdir(parents=True)
    notes.mkdir()
    (docs / "install.md").write_text("# Installing\n\nRun the installer, then configure the flux capacitor.\n")
    (docs / "guides" / "docker.md").write_text("# Docker\n\nBuild the image with docker build; the capacitor "
                                               "needs no configuration here.\n")
    (docs / "guides" / "kubernetes.md").write_text("# Kubernetes\n\nDeploy with helm. Ünïcödé wörds: Straße.\n")
    (docs / "guides" / "data.json").write_text('{"answer": "forty-two capacitor"}')
    (docs / "logo.png").write_bytes(PNG_BYTES)
    for i in range(6):
        (notes / f"n{i}.md").write_text(f"note {i} about capacitor\n")  # not indexed: found by metadata only


@pytest.fixture
def finder(tmp_path: Path) -> Path:
    make_tree(tmp_path)
    return write_manifest(tmp_path, MANIFEST)


def structured(result: Any) -> dict[str, Any]:
    """A tool result's JSON, checking the text block says the same as structuredContent (when the wire has it)."""
    assert not result.is_error, result.content
    data = json.loads(result.content[0].text)
    if result.structured_content is not None:
        assert result.structured_content == data
    return data


async def search_tool(client: Client, query: str, **more: Any) -> list[dict[str, Any]]:
    return structured(await client.call_tool("search_resources", {"query": query, **more}))["results"]


async def until_found(client: Client, query: str, uri: str | None, timeout: float = SOON) -> list[dict[str, Any]]:
    """Search until `uri` is among the results (None: until there are none): the index fills in the background."""
    deadline = time.monotonic() + timeout
    while True:
        results = await search_tool(client, query)
        uris = [r["uri"] for r in results]
        if (uri in uris) if uri is not None else not uris:
            return results
        if time.monotonic() > deadline:
            raise AssertionError(f"{query!r}: waited for {uri!r}, got {uris}")
        await anyio.sleep(0.1)


@pytest.mark.parametrize("mode", MODES)
def test_list_resources_tool_pages_and_filters(finder: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(finder, mode) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert names[:3] == ["read_resource", "list_resources", "search_resources"]

            # Unfiltered, it pages exactly as resources/list does, with the same cursor.
            listed, tooled, cursor, args = [], [], None, {}
            while True:
                page = await client.list_resources(cursor=cursor)
                listed += [r.model_dump(by_alias=True, exclude_none=True) for r in page.resources]
                data = structured(await client.call_tool("list_resources", args))
                tooled += data["resources"]
                assert data.get("nextCursor") == page.next_cursor
                cursor = page.next_cursor
                if cursor is None:
                    break
                args = {"cursor": cursor}
            assert tooled == listed and len(listed) == 12

            guides = structured(await client.call_tool("list_resources", {"prefix": "docs://guides/"}))
            assert [r["uri"] for r in guides["resources"]] == ["docs://guides/data.json", "docs://guides/docker.md",
                                                              "docs://guides/kubernetes.md"]
            assert "nextCursor" not in guides
            markdown = structured(await client.call_tool("list_resources", {"mimeType": "text/markdown", "limit": 2}))
            assert [r["uri"] for r in markdown["resources"]] == ["docs://guides/docker.md",
                                                                "docs://guides/kubernetes.md"]
            rest = structured(await client.call_tool("list_resources", {"mimeType": "text/markdown",
                                                                         "cursor": markdown["nextCursor"]}))
            assert [r["uri"] for r in rest["resources"]][:2] == ["docs://install.md", "notes://n0.md"]
            images = structured(await client.call_tool("list_resources", {"mimeType": "image/*"}))
            assert [r["uri"] for r in images["resources"]] == ["docs://logo.png"]
            named = structured(await client.call_tool("list_resources", {"name": "N[12]*"}))
            assert [r["uri"] for r in named["resources"]] == ["notes://n1.md", "notes://n2.md"]

            for bad in ({"cursor": "not-a-cursor"}, {"limit": 0}, {"limit": 5}, {"prefix": 3}, {"query": "x"}):
                refused = await client.call_tool("list_resources", bad)
                assert refused.is_error, bad

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_search_tool_and_search_resource_agree(finder: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(finder, mode) as client:
            # Full text: only the indexed collection's text files; metadata: everything listed.
            hits = await until_found(client, "flux capacitor", "docs://install.md")
            assert [h["uri"] for h in hits] == ["docs://install.md"]
            assert "«flux»" in hits[0]["snippet"] and "«capacitor»" in hits[0]["snippet"]
            assert hits[0]["description"] == "Product documentation." and hits[0]["mimeType"] == "text/markdown"

            capacitor = [h["uri"] for h in await search_tool(client, "capacitor")]
            assert set(capacitor) == {"docs://install.md", "docs://guides/docker.md", "docs://guides/data.json"}
            assert [h["uri"] for h in await search_tool(client, "Note n3")] == ["notes://n3.md"]  # by title
            assert [h["uri"] for h in await search_tool(client, "strasse")] == []  # ß is not ss: no stemming
            assert [h["uri"] for h in await search_tool(client, "UNICODE")] == ["docs://guides/kubernetes.md"]
            assert [h["uri"] for h in await search_tool(client, "kube*")] == ["docs://guides/kubernetes.md"]
            assert [h["uri"] for h in await search_tool(client, "pelican")] == []  # inline text: not indexed
            guides = await search_tool(client, "capacitor", prefix="docs://guides/")
            assert {h["uri"] for h in guides} == {"docs://guides/docker.md", "docs://guides/data.json"}
            assert len(await search_tool(client, "capacitor", limit=1)) == 1

            templates = (await client.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["docs://by-name/{name}", SEARCH_TEMPLATE]
            for query, args in [("flux capacitor", "q=flux%20capacitor"), ("capacitor", "q=capacitor&limit=2"),
                                ("capacitor", "prefix=docs%3A%2F%2Fguides%2F&q=capacitor")]:
                read = (await client.read_resource(f"search://?{args}")).contents[0]
                assert read.mime_type == "application/json"
                tool_args = dict(a.split("=") for a in args.split("&"))
                expected = await search_tool(client, query, **({"limit": int(tool_args["limit"])}
                                                                 if "limit" in tool_args else {}),
                                             **({"prefix": "docs://guides/"} if "prefix" in tool_args else {}))
                assert json.loads(read.text)["results"] == expected

            for uri in ("search://?limit=1000", "search://?q=a&limit=x", "search://elsewhere?q=a"):
                with pytest.raises(MCPError) as refused:
                    await client.read_resource(uri)
                assert refused.value.error.code == -32602
            missing = await client.call_tool("search_resources", {})
            assert missing.is_error and "query" in missing.content[0].text

    anyio.run(main)


def test_search_template_only_when_search_is_on_and_never_over_the_manifests_own(tmp_path: Path) -> None:
    make_tree(tmp_path)
    off = write_manifest(tmp_path, MANIFEST.replace("tools: true, ", "").replace("index: true,", ""), "off.yaml")
    indexed = write_manifest(tmp_path, MANIFEST.replace("tools: true, ", ""), "indexed.yaml")
    owned = write_manifest(tmp_path, MANIFEST + """
      - {uriTemplate: "search://{?q}", name: own search, render: "mine: {{ args.q }}"}
    """, "owned.yaml")

    async def main() -> None:
        async with connect(off, "auto") as client:
            templates = (await client.list_resource_templates()).resource_templates
            assert SEARCH_TEMPLATE not in [t.uri_template for t in templates]
            with pytest.raises(MCPError):
                await client.read_resource("search://?q=capacitor")
        async with connect(indexed, "legacy") as client:  # index: true without tools: the resource alone
            assert client.server_capabilities.tools is None
            templates = (await client.list_resource_templates()).resource_templates
            assert templates[-1].uri_template == SEARCH_TEMPLATE
            deadline = time.monotonic() + SOON
            while True:
                text = (await client.read_resource("search://?q=flux")).contents[0].text
                if json.loads(text)["results"] or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.1)
            assert [r["uri"] for r in json.loads(text)["results"]] == ["docs://install.md"]
        async with connect(owned, "auto") as client:
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            assert SEARCH_TEMPLATE not in templates and "search://{?q}" in templates
            assert (await client.read_resource("search://?q=x")).contents[0].text == "mine: x"
            assert [h["uri"] for h in await search_tool(client, "install")] == ["docs://install.md"]

    anyio.run(main)


@pytest.mark.parametrize("query", ['"', '""', "fox\" OR \"", "NEAR(a b)", "a:b", "^x", "-x", "(x", "x)", "*", "**",
                                   "AND", "OR NOT", "'", "\x00", "{x}", "col:term", "x" * 1000, "\ud800",
                                   "capacitor OR", "rank:1", "bm25(fts)", "'; DROP TABLE docs; --"])
def test_hostile_queries_are_plain_text(finder: Path, query: str) -> None:
    async def main() -> None:
        agg = await ResourceService.open(finder)
        discovery = Discovery(agg, tools=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(discovery.run)
            await discovery.wait_indexed()
            hits = await discovery.search(query, None)
            assert all(agg.catalog.get(h.entry.uri) is not None for h in hits)
            assert len(await discovery.search("capacitor", None)) == 3  # the index still works afterwards
            assert await discovery.search("capacitor", None, prefix=query) == []  # as a prefix: matches nothing
            discovery.stop()
        await agg.aclose()

    anyio.run(main)


FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def test_fuzzed_queries_never_escape(finder: Path) -> None:
    """Any string as query, prefix and name glob: results or InvalidSearch/InvalidCursor, nothing else."""

    async def open_indexed() -> tuple[ResourceService, Discovery]:
        agg = await ResourceService.open(finder)
        discovery = Discovery(agg, tools=True)
        await discovery.index_once()
        return agg, discovery

    agg, discovery = anyio.run(open_indexed)
    try:
        @FUZZ
        @given(query=st.text(max_size=60) | st.sampled_from(['"', "NEAR(", "a OR b", "x*", "-", "^", ":"]),
               prefix=st.text(max_size=10), glob=st.text(max_size=12), cursor=st.none() | st.text(max_size=12))
        def check(query: str, prefix: str, glob: str, cursor: str | None) -> None:
            async def run() -> None:
                try:
                    await discovery.search(query, frozenset(), prefix=prefix, limit=5)
                except InvalidSearch:
                    pass
                try:
                    discovery.list_page(cursor, frozenset(), prefix=prefix, name=glob, mime_type=query, limit=3)
                except (InvalidSearch, InvalidCursor):
                    pass

            anyio.run(run)

        check()
    finally:
        anyio.run(agg.aclose)


# --- over HTTP, with tokens whose scopes hide entries ---------------------------------------------------------

HTTP_MANIFEST = """\
version: 1
server:
  name: guarded-finder
  tools: true
  auth:
    tokens:
      - {name: alice, token: "${ALICE}", scopes: [docs, secret]}
      - {name: bob, token: "${BOB}", scopes: [docs]}
sources:
  docs: {url: ./docs}
  secret: {url: ./secret, access: {scopes: [secret]}}
collections:
  - {source: docs, glob: "*.md", uri: "docs://{path}", index: true}
  - {source: secret, glob: "*.md", uri: "secret://{path}", index: true}
"""
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("guarded")
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# Public\n\nThe launch plan is public: rockets.\n")
    (folder / "secret").mkdir()
    (folder / "secret" / "plan.md").write_text("# Secret\n\nThe launch code is swordfish, hidden rockets.\n")
    (folder / "secret" / "rockets-only.md").write_text("nothing to see\n")
    manifest = write_manifest(folder, HTTP_MANIFEST)
    with serve_http(manifest, folder, env={"ALICE": ALICE, "BOB": BOB}) as server:
        yield server.url


@pytest.mark.parametrize("mode", MODES)
def test_scopes_hide_entries_from_lists_search_and_snippets(guarded: str, mode: str) -> None:
    async def main() -> None:
        async with _client(guarded, ALICE, mode) as alice:
            hits = await until_found(alice, "swordfish", "secret://plan.md")
            assert "«swordfish»" in hits[0]["snippet"]
            rockets = {h["uri"] for h in await search_tool(alice, "rockets")}
            assert rockets == {"docs://a.md", "secret://plan.md", "secret://rockets-only.md"}
            listed = structured(await alice.call_tool("list_resources", {}))
            assert len(listed["resources"]) == 3
        async with _client(guarded, BOB, mode) as bob:
            assert await search_tool(bob, "swordfish") == []
            rockets = await search_tool(bob, "rockets")
            assert [h["uri"] for h in rockets] == ["docs://a.md"]  # neither by text nor by URI
            assert "swordfish" not in json.dumps(rockets) and "hidden" not in json.dumps(rockets)
            assert await search_tool(bob, "launch", prefix="secret://") == []
            listed = structured(await bob.call_tool("list_resources", {}))
            assert [r["uri"] for r in listed["resources"]] == ["docs://a.md"]
            assert structured(await bob.call_tool("list_resources", {"prefix": "secret://"}))["resources"] == []
            read = (await bob.read_resource("search://?q=launch")).contents[0]
            assert [r["uri"] for r in json.loads(read.text)["results"]] == ["docs://a.md"]
            # The same list resources/list gives Bob.
            assert [r.uri for r in (await bob.list_resources()).resources] == ["docs://a.md"]

    anyio.run(main)


def test_search_settings_load(tmp_path: Path) -> None:
    from aggregator.manifest import load_manifest

    make_tree(tmp_path)
    manifest = load_manifest(write_manifest(tmp_path, MANIFEST.replace(
        "pageSize: 4}", "pageSize: 4, search: {indexBytes: 1MiB, indexFile: state/i.db}}")))
    assert manifest.server.search.index_bytes == 1024 * 1024
    assert manifest.server.search.index_file == tmp_path / "state" / "i.db"
    assert [c.index for c in manifest.collections] == [True, False]
    default = load_manifest(write_manifest(tmp_path, MANIFEST, "plain.yaml"))
    assert default.server.search.index_file is None and default.server.search.index_bytes == 256 * 1024 * 1024
