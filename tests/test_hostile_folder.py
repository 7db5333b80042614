"""A served folder holding every kind of hostile name and file, through the real server on both wires and the CLI.

The property: every listed URI reads, or fails with the documented MCP error naming it; nothing outside the root
is served; listing, reading, completion and renders follow one rule; the server keeps answering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from aggregator.templates import UriTemplate
from tests.conftest import MODES, connect, list_all, write_manifest
from tests.hostile import (
    HOSTILE_MANIFEST,
    LATIN1_NAME,
    LATIN1_TEXT,
    OUTSIDE_TEXT,
    SECRET_TEXT,
    HostileFolder,
    can_bypass_permissions,
    make_hostile_folder,
)

INTERNAL = -32603
READ_BUDGET_S = 20  # a read that hangs fails the test instead of the run


def not_found_code(mode: str) -> int:
    return -32002 if mode == "legacy" else -32602


def uri_of(prefix: str, rel: str) -> str:
    """The URI a collection lists for `rel`: its raw bytes percent-encoded."""
    return prefix + quote(os.fsencode(rel), safe="/")


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[HostileFolder, Path]:
    folder = make_hostile_folder(tmp_path)
    yield folder, write_manifest(tmp_path, HOSTILE_MANIFEST)
    os.chmod(folder.root / folder.locked, 0o600)  # let pytest clean up


async def every_resource(client: Any) -> list[types.Resource]:
    return (await list_all(client))[0]


async def read_text(client, uri: str) -> str:
    with anyio.fail_after(READ_BUDGET_S):
        (content,) = (await client.read_resource(uri)).contents
    return content.text if isinstance(content, types.TextResourceContents) else content.blob


async def assert_not_found(client, uri: str, mode: str) -> None:
    with pytest.raises(MCPError) as err, anyio.fail_after(READ_BUDGET_S):
        await client.read_resource(uri)
    assert err.value.code == not_found_code(mode), (uri, err.value.code, err.value.message)
    assert err.value.message == "Resource not found" and err.value.data == {"uri": uri}


@pytest.mark.parametrize("mode", MODES)
def test_every_listed_uri_reads_or_fails_as_documented(hostile: tuple[HostileFolder, Path], mode: str) -> None:
    folder, manifest = hostile

    async def main() -> None:
        async with connect(manifest, mode) as client:
            listed = await every_resource(client)
            by_uri = {r.uri: r for r in listed}
            plain = {u for u in by_uri if u.startswith("h://")}
            expected = {uri_of("h://", rel) for rel in [*folder.readable, folder.locked, folder.doomed]}
            assert plain == expected, plain ^ expected
            # With `hidden: true` the dotfiles are listed too, and nothing else changes.
            everything = {u for u in by_uri if u.startswith("all://")}
            assert everything == {"all://" + u[len("h://"):] for u in expected} | {
                uri_of("all://", rel) for rel in folder.hidden}
            # Names shown to clients are valid Unicode: undecodable bytes become U+FFFD.
            latin = by_uri[uri_of("h://", os.fsdecode(LATIN1_NAME))]
            assert latin.uri == "h://caf%E9.md" and latin.name == "caf\ufffd.md" and latin.title == "caf\ufffd"

            os.unlink(folder.root / folder.doomed)
            for uri in sorted(by_uri):
                try:
                    body = await read_text(client, uri)
                except MCPError as exc:
                    assert exc.code in (not_found_code(mode), INTERNAL), (uri, exc.code, exc.message)
                    assert exc.data == {"uri": uri}, (uri, exc.data)
                    assert uri in exc.message if exc.code == INTERNAL else exc.message == "Resource not found"
                    assert str(folder.root.parent) not in exc.message
                    outcome = "not found" if exc.code != INTERNAL else "unavailable"
                else:
                    assert OUTSIDE_TEXT not in body
                    outcome = body
                rel = uri.split("://", 1)[1]
                if rel.endswith(folder.doomed):
                    assert outcome == "not found", uri
                elif rel.endswith(folder.locked):
                    # Root reads a chmod 000 file; any other user gets the backend error, never a crash.
                    assert outcome == ("locked\n" if can_bypass_permissions() else "unavailable"), uri
                elif uri.startswith("h://"):
                    assert outcome == [v for k, v in folder.readable.items() if uri_of("h://", k) == uri][0].decode()
            assert await read_text(client, "all://.env") == SECRET_TEXT
            assert await read_text(client, "h://caf%E9.md") == LATIN1_TEXT
            # The render's resources() shows what the listing shows, under the same URIs and names (compared on one
            # catalog: the watcher may relist after the deletion above at any moment).
            for _ in range(50):
                before = {r.uri: r.name for r in await every_resource(client) if r.uri.startswith("h://")}
                index = await read_text(client, "idx://all")
                shown = {item.split(" ", 1)[0]: item.split(" ", 1)[1] for item in index.split("|") if item}
                after = {r.uri: r.name for r in await every_resource(client) if r.uri.startswith("h://")}
                if before == after:
                    break
                await anyio.sleep(0.1)
            assert shown == after and set(after) <= plain and len(after) >= len(plain) - 1
            # Still serving.
            assert await read_text(client, "h://ok.md") == "# ok\n"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_templates_serve_what_listing_lists_and_refuse_the_rest(hostile: tuple[HostileFolder, Path],
                                                                 mode: str) -> None:
    folder, manifest = hostile

    async def main() -> None:
        async with connect(manifest, mode) as client:
            for rel, data in folder.readable.items():
                assert await read_text(client, uri_of("t://", rel)) == data.decode(), rel
            assert await read_text(client, "t://caf%E9.md") == LATIN1_TEXT
            assert await read_text(client, "t://caf%e9.md") == LATIN1_TEXT  # either hex case
            await assert_not_found(client, "t://caf%C3%A9.md", mode)  # the UTF-8 spelling is another name
            for rel in folder.unlisted:
                await assert_not_found(client, uri_of("t://", rel), mode)
                await assert_not_found(client, uri_of("hid://", rel), mode)
            # Dotfiles and dot-folders are refused exactly like a missing file, unless the template opts in.
            for rel, data in folder.hidden.items():
                await assert_not_found(client, uri_of("t://", rel), mode)
                assert await read_text(client, uri_of("hid://", rel)) == data.decode()
            await assert_not_found(client, "one://.env", mode)
            await assert_not_found(client, "t://sub/.ssh/id_rsa", mode)
            await assert_not_found(client, "t://.git/config", mode)
            await assert_not_found(client, "t://no-such.md", mode)
            # A resource whose path the manifest spells is the author's explicit choice.
            assert await read_text(client, "env://explicit") == SECRET_TEXT
            assert await read_text(client, "one://caf%E9.md") == LATIN1_TEXT
            assert await read_text(client, "t://ok.md") == "# ok\n"

    anyio.run(main)


async def complete(client, template: str, value: str, name: str = "path") -> types.Completion:
    ref = types.ResourceTemplateReference(uri=template)
    return (await client.complete(ref, {"name": name, "value": value})).completion


@pytest.mark.parametrize("mode", MODES)
def test_completion_offers_exactly_what_reads(hostile: tuple[HostileFolder, Path], mode: str) -> None:
    folder, manifest = hostile

    async def main() -> None:
        async with connect(manifest, mode) as client:
            top = (await complete(client, "t://{+path}", "")).values
            assert "sub/" in top and "ok.md" in top and "caf%E9.md" in top and "100%.md" in top, top
            assert not any(v.startswith(".") for v in top), top
            assert not {"new\nline.md", "pipe.md", "sock.md", "loop.md", "out.md", "outdir/"} & set(top), top
            assert (await complete(client, "t://{+path}", "sub/")).values == ["sub/deep.md"]
            assert (await complete(client, "t://{+path}", "caf%E")).values == ["caf%E9.md"]
            hidden = (await complete(client, "hid://{+path}", "")).values
            assert {".env", ".git/"} <= set(hidden), hidden
            assert (await complete(client, "hid://{+path}", "sub/")).values == ["sub/.ssh/", "sub/deep.md"]
            names = (await complete(client, "one://{name}", "", name="name")).values
            # `{name}` is expanded with every byte encoded: an undecodable name cannot be typed, so it is not offered.
            assert "ok.md" in names and "caf%E9.md" not in names and not any(v.startswith(".") for v in names)
            # Every offered file, expanded the way a client expands it, reads.
            for template, values, var in (("t://{+path}", top, "path"), ("hid://{+path}", hidden, "path"),
                                          ("one://{name}", names, "name")):
                for value in values:
                    if value.endswith("/") or value == folder.locked:
                        continue
                    uri = UriTemplate.parse(template).expand({var: value})
                    assert OUTSIDE_TEXT not in await read_text(client, uri), uri

    anyio.run(main)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": os.environ.get("PATH", "")}
    return subprocess.run([sys.executable, "-m", "aggregator", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=60)


def test_cli_validate_list_and_read_a_hostile_folder(hostile: tuple[HostileFolder, Path]) -> None:
    folder, manifest = hostile
    valid = _cli("validate", str(manifest), cwd=manifest.parent)
    assert valid.returncode == 0, valid.stderr.decode()
    listed = _cli("list", "--json", str(manifest), cwd=manifest.parent)
    assert listed.returncode == 0, listed.stderr.decode()
    resources = {r["uri"]: r for r in json.loads(listed.stdout.decode("utf-8"))["resources"]}
    assert resources["h://caf%E9.md"]["name"] == "caf\ufffd.md"
    assert not any("%0A" in uri or "pipe" in uri or "sock" in uri for uri in resources)
    text = _cli("list", str(manifest), cwd=manifest.parent)
    assert text.returncode == 0 and "h://caf%E9.md" in text.stdout.decode("utf-8")
    read = _cli("read", str(manifest), "h://caf%E9.md", cwd=manifest.parent)
    assert read.returncode == 0 and read.stdout.decode() == LATIN1_TEXT, read.stderr.decode()
    read = _cli("read", str(manifest), "t://caf%E9.md", cwd=manifest.parent)
    assert read.returncode == 0 and read.stdout.decode() == LATIN1_TEXT, read.stderr.decode()
    missing = _cli("read", str(manifest), "t://.env", cwd=manifest.parent)
    assert missing.returncode != 0 and SECRET_TEXT not in missing.stdout.decode()
    assert b"Resource not found" in missing.stderr


@pytest.mark.parametrize("mode", MODES)
def test_hostile_folder_over_http(hostile: tuple[HostileFolder, Path], mode: str) -> None:
    from mcp import Client

    from tests.test_server_http import free_port

    folder, manifest = hostile
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with open(manifest.parent / "server.log", "wb") as log:  # read it when this test fails
        process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port)],
                                   env=env, stderr=log)

    async def main() -> None:
        with anyio.fail_after(15):
            while True:
                try:
                    await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await anyio.sleep(0.05)
        async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode, cache=None) as client:
            listed = {r.uri: r for r in await every_resource(client)}
            assert listed["h://caf%E9.md"].name == "caf\ufffd.md"
            assert not any("%0A" in uri for uri in listed)
            assert await read_text(client, "h://caf%E9.md") == LATIN1_TEXT
            assert await read_text(client, "t://caf%E9.md") == LATIN1_TEXT
            for uri in ("t://.env", "t://.git/config", "t://sub/.ssh/id_rsa", "t://pipe.md", "t://new%0Aline.md"):
                await assert_not_found(client, uri, mode)
            assert await read_text(client, "hid://.git/config") == folder.hidden[".git/config"].decode()

    try:
        anyio.run(main)
    finally:
        process.terminate()
        assert process.wait(15) == 0
