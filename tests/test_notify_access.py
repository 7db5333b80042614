"""`list_changed` follows what each caller may see: a reload that changes only who may see what tells exactly the
callers whose visible listing grew or shrank, and a change to what a caller cannot see tells it nothing. Both
wires: legacy sessions directly, modern clients on their listen streams. A real server over Streamable HTTP with
bearer tokens, the official client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.subscriptions import ResourcesListChanged

from tests.served import Server, serve_http
from tests.test_live import save

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef",
          "carol": "carol-token-0123456789abcdef"}
"""alice holds docs and secret, bob docs, carol neither (she sees only what needs no scope)."""

MANIFEST = """\
version: 1
server:
  name: scoped
  reloadSettle: 0s
  auth:
    tokens:
      - {{name: alice, token: "${{ALICE}}", scopes: [docs, secret]}}
      - {{name: bob, token: "${{BOB}}", scopes: [docs]}}
      - {{name: carol, token: "${{CAROL}}", scopes: [other]}}
sources:
  docs: {{url: ./docs}}
  secret: {{url: ./secret, access: {{scopes: [{secret}]}}}}
collections:
  - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
  - {{source: secret, glob: "*.md", uri: "secret://{{path}}"}}
resources:
  - {{uri: "note://base", name: base, text: base}}
{extra}"""

MARKER = '  - {uri: "note://marker", name: marker, text: everyone sees this}\n'
HIDDEN = '  - {uri: "note://hidden", name: hidden, text: only secret holders, access: {scopes: [secret]}}\n'

STEPS: list[tuple[str, str, dict[str, int]]] = [
    ("docs", "", {"alice": 0, "bob": 1, "carol": 0}),  # the secret source opens to docs: only bob's listing grows
    ("docs", MARKER, {"alice": 1, "bob": 1, "carol": 1}),  # a change everyone sees
    ("secret", MARKER, {"alice": 0, "bob": 1, "carol": 0}),  # closed again: only bob's listing shrinks
    ("secret", MARKER + HIDDEN, {"alice": 1, "bob": 0, "carol": 0}),  # an entry only alice may see comes
    ("secret", HIDDEN, {"alice": 1, "bob": 1, "carol": 1}),  # the marker goes: everyone sees it
]
"""Each save (the secret source's scope, extra resources) and how many list_changed each caller hears of it."""

QUIET = 0.4
"""Seconds to wait, once what must come came, for anything that must not."""


@contextmanager
def _serving(tmp_path: Path, extra: str = "") -> Iterator[Server]:
    """The server over folders docs and secret (a file each), its manifest with `extra` resources."""
    for folder, name in (("docs", "a.md"), ("secret", "plan.md")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(f"# {folder}\n")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(MANIFEST.format(secret="secret", extra=extra))
    env = {name.upper(): token for name, token in TOKENS.items()}
    with serve_http(manifest, tmp_path, env=env) as served:
        yield served


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with _serving(tmp_path) as served:
        yield served


def _client(url: str, token: str, mode: str, handler: Any = None) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http), mode=mode, cache=None, message_handler=handler)


@asynccontextmanager
async def _listening(url: str, wire: str, heard: dict[str, int]) -> AsyncIterator[dict[str, Client]]:
    """A client per token, each counting the list_changed it hears in `heard` (legacy: as notifications of its
    session; modern: on a listen stream)."""
    async with anyio.create_task_group() as tg:  # outside the clients: cancelling it leaves them to close
        async with AsyncExitStack() as stack:
            clients: dict[str, Client] = {}
            for name, token in TOKENS.items():
                heard[name] = 0

                async def count(message: Any, name: str = name) -> None:
                    if type(message).__name__ == "ResourceListChangedNotification":
                        heard[name] += 1

                if wire == "legacy":
                    clients[name] = await stack.enter_async_context(_client(url, token, "legacy", count))
                    await clients[name].list_resources()  # its `initialized` was handled: the session is registered
                    continue
                clients[name] = await stack.enter_async_context(_client(url, token, "auto"))
                sub = await stack.enter_async_context(clients[name].listen(resources_list_changed=True))

                async def collect(sub: Any = sub, name: str = name) -> None:
                    async for event in sub:
                        if isinstance(event, ResourcesListChanged):
                            heard[name] += 1

                tg.start_soon(collect)
            await anyio.sleep(0.3)
            yield clients
        tg.cancel_scope.cancel()


def _reloads(base: str) -> int:
    return int(httpx.get(base + "/healthz", timeout=2).json().get("reloads", 0))


def _full_relists(base: str) -> int:
    """Changes of files the server applied by listing the whole catalog again (from /metrics)."""
    for line in httpx.get(base + "/metrics", timeout=2).text.splitlines():
        if line.startswith('aggregator_file_changes_total{how="relist"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def _wait(check: Any, what: str, seconds: float = 10) -> None:
    with anyio.fail_after(seconds):
        while not check():
            await anyio.sleep(0.02)
    assert check(), what


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_list_changed_goes_to_exactly_the_callers_whose_listing_changed(server: Server, tmp_path: Path,
                                                                         wire: str) -> None:
    heard: dict[str, int] = {}
    expected = dict.fromkeys(TOKENS, 0)

    async def main() -> None:
        async with _listening(server.url, wire, heard) as clients:
            assert "secret://plan.md" not in {r.uri for r in (await clients["bob"].list_resources()).resources}
            for done, (secret, extra, told) in enumerate(STEPS, start=1):
                save(tmp_path / "manifest.yaml", MANIFEST.format(secret=secret, extra=extra))
                await _wait(lambda done=done: _reloads(server.base) >= done, f"reload {done}")
                for name, count in told.items():
                    expected[name] += count
                began = time.monotonic()
                try:
                    await _wait(lambda: all(heard[n] >= expected[n] for n in TOKENS), "", seconds=5)
                except TimeoutError:
                    pass  # compared below, with what each heard
                await anyio.sleep(max(0.0, QUIET - (time.monotonic() - began)))
                assert heard == expected, f"after save {done} ({secret}, {extra.strip() or 'no extra'})"
                if done == 1:  # bob was told because his listing grew
                    listed = {r.uri for r in (await clients["bob"].list_resources()).resources}
                    assert "secret://plan.md" in listed

    anyio.run(main)


CLASH = '  - {uri: "docs://clash.md", name: clash, text: the manifest claims this URI}\n'
"""A resource whose URI the docs collection gives docs/clash.md: while that file is there, no listing is served."""


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_full_relist_tells_only_the_callers_whose_listing_it_changed(tmp_path: Path, wire: str) -> None:
    """A file that collides with a manifest resource fails the relist (the last listing serves on, and every change
    after is a full relist until one succeeds); a file only secret holders may see comes meanwhile. The relist that
    succeeds once the collision is gone adds that one entry: alice hears list_changed, bob and carol do not."""
    heard: dict[str, int] = {}

    async def main() -> None:
        async with _listening(server.url, wire, heard) as clients:
            for done, (path, content) in enumerate(
                    ((tmp_path / "docs" / "clash.md", "# clash\n"), (tmp_path / "secret" / "new.md", "# new\n"),
                     (tmp_path / "docs" / "clash.md", None)), start=1):
                if content is None:
                    path.unlink()
                else:
                    path.write_text(content)
                await _wait(lambda done=done: _full_relists(server.base) >= done, f"full relist {done}")
                await anyio.sleep(QUIET)  # the relist counted, then run
            assert "secret://new.md" in {r.uri for r in (await clients["alice"].list_resources()).resources}
            assert heard == {"alice": 1, "bob": 0, "carol": 0}

    with _serving(tmp_path, CLASH) as server:
        anyio.run(main)


UPSTREAM_MANIFEST = MANIFEST[:MANIFEST.index("sources:")] + """\
sources:
  up: {{url: "mcp+stdio:", prefix: "test://", command: {command}, env: {env}}}
collections:
  - {{source: up, glob: "moving/a/*", uri: "moved://{{name}}", name: "{{name}}"}}
  - {{source: up, glob: "moving/b/*", uri: "moved://{{name}}", name: "{{name}}", access: {{scopes: [secret]}}}}
"""
"""MANIFEST's server and tokens over the upstream, whose moving/a/x and moving/b/x list the same as moved://x: open to
all from a/, to secret holders from b/."""


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_an_upstream_relist_that_only_moves_an_entry_between_scopes_tells_whose_listing_changed(
        tmp_path: Path, wire: str) -> None:
    """The upstream lists test://moving/a/x (moved://x, open to all) and, once it is read, test://moving/b/x
    instead (moved://x again, listed the same but for secret holders only) and tells list_changed: the relist of
    that upstream changes bob's and carol's listings (it leaves them), not alice's, and they are told as a full
    relist tells them."""
    from tests.test_upstream import ENV
    from tests.test_upstream_scale import UPSTREAM

    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(UPSTREAM_MANIFEST.format(command=UPSTREAM, env={**ENV, "UPSTREAM_EDITS": "1"}))
    heard: dict[str, int] = {}

    async def listed(client: Client) -> set[str]:
        return {str(r.uri) for r in (await client.list_resources()).resources}

    async def main(server: Server) -> None:
        async with _listening(server.url, wire, heard) as clients:
            with anyio.fail_after(30):  # the upstream connected and listed
                while "moved://x" not in await listed(clients["carol"]):
                    await anyio.sleep(0.05)
            await anyio.sleep(QUIET)  # what its connection told has come
            before = dict(heard)
            assert (await clients["carol"].read_resource("moved://x")).contents[0].text == "moved"
            with anyio.fail_after(30):  # relisted: the entry now needs the secret scope
                while "moved://x" in await listed(clients["bob"]):
                    await anyio.sleep(0.05)
            assert "moved://x" in await listed(clients["alice"])
            await anyio.sleep(QUIET)
            assert {name: heard[name] - before[name] for name in TOKENS} == {"alice": 0, "bob": 1, "carol": 1}

    env = {name.upper(): token for name, token in TOKENS.items()}
    with serve_http(manifest, tmp_path, env=env) as server:
        anyio.run(main, server)
