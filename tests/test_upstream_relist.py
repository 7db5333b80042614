"""An upstream's list_changed costs the upstream's listing, not the catalog's (issue 26): the gateway lists that
upstream again and splices what came, changed or went into the catalog in place (catalog_published), in process with
the official client on both wires. The folder beside it is never walked again (its walks are counted by
`LISTINGS`), the catalog equals a fresh compile, and list_changed comes only when the listing shows something else
(an upstream's list_changed that changed nothing is not passed on)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from aggregator.compiler import compile_catalog
from aggregator.sources.progress import LISTINGS
from tests.conftest import MODES
from tests.test_live import QUIET, uris
from tests.test_live_inprocess import running
from tests.test_live_polling import heard
from tests.test_upstream_scale import gateway

FILES = 50
LISTED = 20.0
"""Seconds to wait for what an upstream's list_changed brings (an upper bound: the wait ends at the event)."""


def _manifest(tmp_path: Path) -> Path:
    """The scale tests' gateway (a folder and the upstream, namespace up) with UPSTREAM_CHANGES, FILES files in the
    folder, a collection over the upstream too, and a render over the listing (told `updated` when it changes)."""
    path = gateway(tmp_path, ', prefix: "test://"', UPSTREAM_CHANGES="1", UPSTREAM_FLOOD="2",
                   UPSTREAM_FLOOD_SECONDS="0.2")
    for i in range(FILES):
        (tmp_path / "docs" / f"f{i:03}.md").write_text(f"# {i}\n")
    with path.open("a") as more:
        more.write("""  - {source: up, glob: "added/*", uri: "added://{name}"}
resources:
  - {uri: "index://all", name: index, render: "{{ resources('up+') | map(attribute='uri') | join(' ') }}"}
""")
    return path


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_list_changed_relists_that_upstream_only(tmp_path: Path, mode: str) -> None:
    manifest = _manifest(tmp_path)

    async def main() -> None:
        async with running(manifest) as (server, live):
            async with heard(server, mode, "index://all") as (client, inbox):
                listed = await uris(client)
                assert "up+test://static-text" in listed and "docs://f000.md" in listed
                assert "added://x" not in listed
                assert "up+test://added/x" not in (await client.read_resource("index://all")).contents[0].text
                with anyio.fail_after(LISTED):  # what the listen streams' start changed upstream has settled
                    while await inbox.next(QUIET) is not None:
                        pass
                walks, relists, incremental = LISTINGS["docs"], live.file_changes["relist"], \
                    live.file_changes["incremental"]
                upstream_lists = LISTINGS["up"]

                assert (await client.read_resource("up+test://add/x")).contents[0].text == "added"
                told = {await inbox.next(LISTED), await inbox.next(LISTED)}
                assert told == {("list_changed", None), ("updated", "index://all")}
                listed = await uris(client)
                assert {"up+test://added/x", "added://x"} <= set(listed)
                assert "up+test://added/x" in (await client.read_resource("index://all")).contents[0].text
                assert (await client.read_resource("added://x")).contents[0].text == "test://added/x"

                assert LISTINGS["up"] > upstream_lists  # the upstream was listed again ...
                assert LISTINGS["docs"] == walks  # ... and the folder beside it was never walked
                assert live.file_changes["relist"] == relists
                assert live.file_changes["incremental"] > incremental

                # list_changed upstream with nothing changed: listed again, and nothing told.
                upstream_lists, incremental = LISTINGS["up"], live.file_changes["incremental"]
                assert (await client.read_resource("up+test://flood/go")).contents[0].text == "2"
                with anyio.fail_after(LISTED):
                    while LISTINGS["up"] == upstream_lists:
                        await anyio.sleep(0.05)
                assert await inbox.next(QUIET) is None
                assert live.file_changes["incremental"] == incremental and LISTINGS["docs"] == walks
                # A fresh compile over the same sources (the same upstream process) lists what was spliced in.
                service = live.service
                want = await compile_catalog(service.manifest, service.sources)
                got = service.catalog
                assert list(got.entries) == list(want.entries)
                assert got.listing_signature == want.listing_signature
                assert got.published == want.published

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_entry_an_upstream_relist_finds_changed_is_read_anew(tmp_path: Path, mode: str) -> None:
    """The upstream changes a resource and its listed description and tells list_changed only (no `updated`: nobody
    subscribed to it): the relist finds the entry changed and drops its cached content, as a poll's relist does, so
    it is read anew, not served from the cache for the source's ttl (an hour; legacy upstream wire: no hints)."""
    manifest = gateway(tmp_path, ", ttl: 1h", UPSTREAM_EDITS="1", UPSTREAM_WIRE="legacy")

    async def main() -> None:
        async with running(manifest) as (server, _):
            async with heard(server, mode, "docs://a.md") as (client, inbox):  # what it hears: list_changed
                assert (await client.read_resource("up+test://edited")).contents[0].text == "edition 0"
                with anyio.fail_after(LISTED):  # what the listen streams' start changed upstream has settled
                    while await inbox.next(QUIET) is not None:
                        pass
                assert (await client.read_resource("up+test://edit/1")).contents[0].text == "edited"
                assert await inbox.next(LISTED) == ("list_changed", None)  # told once the relist swapped
                listed = {str(r.uri): r for r in (await client.list_resources()).resources}
                assert listed["up+test://edited"].description == "edition 1"
                assert (await client.read_resource("up+test://edited")).contents[0].text == "edition 1"
                assert await inbox.next(QUIET) is None

    anyio.run(main)
