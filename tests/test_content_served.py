"""One resource, one set of metadata: a file's mimeType is the same through a listing, a read and a template read,
and `decompress: true` serves `*.gz` text as text, bounded by maxBytes after decompression.

Driven through the real stdio server on both wires."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import MODES, connect, list_all, write_manifest

ODD_NAMES = {
    "what?#frag.md": "text/markdown",
    "x.MD": "text/markdown",
    "a.tar.gz": "application/gzip",
    "notes.txt.gz": "application/gzip",
    "README": None,  # the name says nothing: not listed with a type; a read says what the bytes are
}


def _odd_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "what?#frag.md").write_text("# frag\n")
    (folder / "x.MD").write_text("# upper\n")
    (folder / "a.tar.gz").write_bytes(gzip.compress(b"tar bytes"))
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"some notes\n"))
    (folder / "README").write_text("read me\n")
    return folder


async def _listing(client: Any) -> dict[str, Any]:
    return {str(r.uri): r for r in (await list_all(client))[0]}


@pytest.mark.parametrize("mode", MODES)
def test_list_read_and_template_read_agree_on_mime_type(tmp_path: Path, mode: str) -> None:
    _odd_folder(tmp_path)
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        sources: {f: {url: ./f}}
        collections:
          - {source: f, glob: "**/*", uri: "f://{path}", name: "{path}"}
        templates:
          - {uriTemplate: "t://{+path}", name: t, source: f, path: "{path}"}
        """)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            listed = {r.name: r for r in (await _listing(client)).values()}
            assert set(listed) == set(ODD_NAMES)
            for name, expected in ODD_NAMES.items():
                entry = listed[name]
                read = (await client.read_resource(str(entry.uri))).contents[0]
                via_template = (await client.read_resource("t://" + str(entry.uri)[len("f://"):])).contents[0]
                assert entry.mime_type == expected, name
                assert read.mime_type == via_template.mime_type, name
                if expected is not None:
                    assert read.mime_type == expected, name
                else:
                    assert read.mime_type == "text/plain" and read.text == "read me\n"
                assert type(read) is type(via_template), name

    anyio.run(main)


def _gz_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "z"
    folder.mkdir()
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"plain notes\n"))
    (folder / "guide.md.gz").write_bytes(gzip.compress(b"# Guide\n") + gzip.compress(b"second member\n"))
    (folder / "bomb.txt.gz").write_bytes(gzip.compress(bytes(10 * 1024 * 1024)))
    (folder / "corrupt.txt.gz").write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate" + os.urandom(64))
    (folder / "truncated.txt.gz").write_bytes(gzip.compress(b"cut short " * 100)[:-12])
    (folder / "plain.md").write_text("# Plain\n")
    return folder


@pytest.mark.parametrize("mode", MODES)
def test_decompress_serves_gz_text_as_text_bounded_by_max_bytes(tmp_path: Path, mode: str) -> None:
    _gz_folder(tmp_path)
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: t}
        defaults: {maxBytes: 64KiB}
        sources: {z: {url: ./z}}
        resources:
          - {uri: "one://notes", name: notes, source: z, path: notes.txt.gz, decompress: true}
        collections:
          - {source: z, glob: "**/*", uri: "z://{path}", name: "{name}", decompress: true}
        templates:
          - {uriTemplate: "zt://{+path}", name: zt, source: z, path: "{path}", decompress: true}
          - {uriTemplate: "raw://{+path}", name: raw, source: z, path: "{path}"}
        """)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            listed = await _listing(client)
            notes = listed["z://notes.txt.gz"]
            assert notes.name == "notes.txt.gz" and notes.mime_type == "text/plain"
            assert listed["z://guide.md.gz"].mime_type == "text/markdown"
            assert listed["z://plain.md"].mime_type == "text/markdown"
            assert listed["one://notes"].mime_type == "text/plain"
            for uri in ("z://notes.txt.gz", "zt://notes.txt.gz", "one://notes"):
                content = (await client.read_resource(uri)).contents[0]
                assert content.mime_type == "text/plain" and content.text == "plain notes\n", uri
            guide = (await client.read_resource("z://guide.md.gz")).contents[0]
            assert guide.mime_type == "text/markdown" and guide.text == "# Guide\nsecond member\n"
            assert (await client.read_resource("z://plain.md")).contents[0].text == "# Plain\n"
            # Without decompress the same file is what it is on disk: gzip bytes.
            raw = (await client.read_resource("raw://notes.txt.gz")).contents[0]
            assert raw.mime_type == "application/gzip" and gzip.decompress(__import__("base64").b64decode(raw.blob))

            for uri in ("z://bomb.txt.gz", "zt://bomb.txt.gz"):
                with pytest.raises(MCPError) as bomb:
                    await client.read_resource(uri)
                assert uri in str(bomb.value) and "too large" in str(bomb.value)
            for uri in ("z://corrupt.txt.gz", "z://truncated.txt.gz"):
                with pytest.raises(MCPError) as corrupt:
                    await client.read_resource(uri)
                message = str(corrupt.value)
                assert uri in message and "gzip" in message and "right now" not in message
                assert str(tmp_path) not in message
            # The server keeps serving.
            assert (await client.read_resource("z://notes.txt.gz")).contents[0].text == "plain notes\n"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_decompress_over_http_plain_gzip_bytes_and_content_encoding(tmp_path: Path, mode: str) -> None:
    """An HTTP `.gz` comes as gzip bytes (application/gzip) or, from some servers, with Content-Encoding: gzip
    that the client already undid: both read as the text inside, typed by the name; the raw one, undecompressed,
    keeps the upstream's type."""
    import asyncio
    import threading

    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        if request.path == "/base/notes.txt.gz":
            return web.Response(body=gzip.compress(b"gz notes\n"), content_type="application/gzip")
        if request.path == "/base/encoded.txt.gz":
            return web.Response(body=gzip.compress(b"encoded notes\n"), content_type="application/gzip",
                                headers={"Content-Encoding": "gzip"})
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    ports: list[int] = []

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    while not ports:
        threading.Event().wait(0.01)
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: t}}
        sources:
          api: {{url: "http://127.0.0.1:{ports[0]}/base", allowPrivateNetwork: ["127.0.0.1/32"]}}
        templates:
          - {{uriTemplate: "gz://{{+path}}", name: gz, source: api, path: "{{path}}", decompress: true}}
          - {{uriTemplate: "raw://{{+path}}", name: raw, source: api, path: "{{path}}"}}
        """)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            for uri, text in (("gz://notes.txt.gz", "gz notes\n"), ("gz://encoded.txt.gz", "encoded notes\n")):
                content = (await client.read_resource(uri)).contents[0]
                assert content.mime_type == "text/plain" and content.text == text, uri
            raw = (await client.read_resource("raw://notes.txt.gz")).contents[0]
            assert raw.mime_type == "application/gzip" and raw.blob

    try:
        anyio.run(main)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
