"""A watched folder's files that came, changed or went reach the catalog without listing it again (issue 26): the
official client over stdio on both wires, and the server's log says when a change needed a full relist."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

from tests.conftest import server_params
from tests.test_live import BASE as LIVE_BASE
from tests.test_live import QUIET, SOON, Inbox, listened, live_folder, uris
from tests.served import watchers_up

BASE = LIVE_BASE.replace('glob: "*.md"', 'glob: "**/*.md"')
"""test_live's manifest over the whole tree: folders that come and go are what these tests change."""

FULL_RELIST = "full relist after changes"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return live_folder(tmp_path, BASE)


def logged_server(manifest: Path, log: Path) -> StdioServerParameters:
    """`aggregator serve manifest` with its stderr (the log) appended to `log`."""
    params = server_params(manifest)
    return StdioServerParameters(command="sh", args=["-c", f'exec "$0" "$@" 2>>"{log}"', params.command, *params.args],
                                 env=params.env)


async def _listed(client: Client, uri: str, present: bool) -> None:
    with anyio.fail_after(SOON):
        while (uri in await uris(client)) != present:
            await anyio.sleep(0.05)


def test_legacy_added_removed_modified_file_without_full_relist(folder: Path) -> None:
    inbox = Inbox()
    log = folder / "server.log"
    docs = folder / "docs"

    async def main() -> None:
        async with Client(logged_server(folder / "manifest.yaml", log), mode="legacy", cache=None,
                          message_handler=inbox) as client:
            assert await uris(client) == ["docs://a.md", "docs://b.md"]
            await watchers_up(docs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource("docs://a.md")

            (docs / "c.md").write_text("# C\n")
            assert await inbox.next() == ("list_changed", None)
            assert await uris(client) == ["docs://a.md", "docs://b.md", "docs://c.md"]

            (docs / "b.md").unlink()
            assert await inbox.next() == ("list_changed", None)
            assert await uris(client) == ["docs://a.md", "docs://c.md"]

            (docs / "a.md").write_text("# A, longer now\n")  # its size changed: updated, not list_changed
            assert await inbox.next() == ("updated", "docs://a.md")
            assert await inbox.next(QUIET) is None
            assert (await client.read_resource("docs://a.md")).contents[0].text == "# A, longer now\n"
            listed = {r.uri: r.size for r in (await client.list_resources()).resources}
            assert listed["docs://a.md"] == len("# A, longer now\n")
            assert FULL_RELIST not in log.read_text()

            # A folder that comes is walked alone: no full relist either.
            (docs / "sub").mkdir()
            (docs / "sub" / "d.md").write_text("# D\n")
            await _listed(client, "docs://sub/d.md", True)
            assert FULL_RELIST not in log.read_text()

    anyio.run(main)


def test_modern_listen_hears_added_and_removed_files_without_full_relist(folder: Path) -> None:
    log = folder / "server.log"
    docs = folder / "docs"

    async def main() -> None:
        async with Client(logged_server(folder / "manifest.yaml", log), mode="auto", cache=None) as client:
            steps = [(lambda: (docs / "c.md").write_text("# C\n"), 1), (lambda: (docs / "b.md").unlink(), 2),
                     (lambda: (docs / "a.md").write_text("# A, longer\n"), 3)]
            events = await listened(client, steps, quiet=QUIET, watched=[docs], resources_list_changed=True,
                                    resource_subscriptions=["docs://a.md"])
            assert events == [ResourcesListChanged(), ResourcesListChanged(), ResourceUpdated(uri="docs://a.md")]
            assert await uris(client) == ["docs://a.md", "docs://c.md"]
            assert FULL_RELIST not in log.read_text()

    anyio.run(main)


def _moved_folder(root: Path) -> Path:
    """A folder of three files (one hidden, one nested) beside the watched one, to be moved in."""
    outside = root / "outside"
    (outside / "deep").mkdir(parents=True)
    for name in ("e.md", ".hidden.md", "deep/f.md"):
        (outside / name).write_text(f"# {name}\n")
    return outside


MOVED_IN = ["docs://a.md", "docs://b.md", "docs://in/deep/f.md", "docs://in/e.md"]


def test_legacy_folder_moved_in_and_out_without_full_relist(folder: Path) -> None:
    """A folder moved into the watched tree (the watcher names only the folder) is walked alone, and one moved out
    drops the files listed under it: one list_changed each, the listing that of a fresh walk, no full relist."""
    inbox = Inbox()
    log = folder / "server.log"
    outside = _moved_folder(folder)

    async def main() -> None:
        async with Client(logged_server(folder / "manifest.yaml", log), mode="legacy", cache=None,
                          message_handler=inbox) as client:
            await watchers_up(folder / "docs")
            os.rename(outside, folder / "docs" / "in")
            assert await inbox.next() == ("list_changed", None)
            assert await uris(client) == MOVED_IN
            assert (await client.read_resource("docs://in/deep/f.md")).contents[0].text == "# deep/f.md\n"
            os.rename(folder / "docs" / "in", outside)
            assert await inbox.next() == ("list_changed", None)
            assert await uris(client) == ["docs://a.md", "docs://b.md"]
            assert await inbox.next(QUIET) is None
            assert FULL_RELIST not in log.read_text()

    anyio.run(main)


def test_modern_folder_moved_in_and_out_without_full_relist(folder: Path) -> None:
    log = folder / "server.log"
    outside = _moved_folder(folder)

    async def main() -> None:
        async with Client(logged_server(folder / "manifest.yaml", log), mode="auto", cache=None) as client:

            async def moved_in() -> None:
                assert await uris(client) == MOVED_IN

            steps = [(lambda: os.rename(outside, folder / "docs" / "in"), 1, moved_in),
                     (lambda: os.rename(folder / "docs" / "in", outside), 2)]
            events = await listened(client, steps, quiet=QUIET, watched=[folder / "docs"], resources_list_changed=True)
            assert events == [ResourcesListChanged(), ResourcesListChanged()]
            assert await uris(client) == ["docs://a.md", "docs://b.md"]
            assert FULL_RELIST not in log.read_text()

    anyio.run(main)
