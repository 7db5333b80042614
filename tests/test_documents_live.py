"""`convert: markdown` kept live, through the real server (`aggregator serve --http`, the official client, both
wires): a changed document tells its subscriber `updated` and converts again on the next read; 50 concurrent first
reads of one document convert it once (the server's own /metrics counts conversions); search finds words found
only inside documents."""

from __future__ import annotations

import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from conftest import MODES, connect, write_manifest
from documents_gen import DATA, pdf_pages
from test_live import Inbox, listened
from test_search import search_tool, until_found

from tests.isolation import free_port  # the package's copy: one port sequence per worker
from tests.served import answers, start, stop, tail, wait_until

pytest.importorskip("pypdfium2", reason="the documents extra is not installed: pip install -e '.[documents]'")


MANIFEST = """
    version: 1
    server: {name: documents-live}
    sources:
      files: {url: ./files}
    collections:
      - {source: files, glob: "**/*.pdf", uri: "doc://{path}", name: "{path}", convert: markdown}
    """


class Served:
    """`aggregator serve --http` on a folder's manifest, on a free loopback port, until stopped."""

    def __init__(self, folder: Path) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.log = folder / "server.log"
        self.process = start([sys.executable, "-m", "aggregator", "serve", str(folder / "manifest.yaml"), "--http",
                              str(port)], self.log)
        try:
            wait_until(answers(self.base + "/healthz"), self.base, process=self.process, log=self.log)
        except BaseException:
            stop(self.process)
            raise

    def conversions(self) -> int:
        """Documents this server converted (aggregator_document_conversions_total{outcome="ok"})."""
        return int(self.metric('aggregator_document_conversions_total{outcome="ok"}'))

    def metric(self, name: str) -> float:
        """A figure of this server's /metrics (`name` with its labels, as written there)."""
        text = httpx.get(self.base + "/metrics", timeout=5).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert found, f"no {name} in /metrics"
        return float(found.group(1))

    def stop(self) -> None:
        assert stop(self.process) == 0, tail(self.log)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    files = tmp_path / "files"
    files.mkdir()
    (files / "report.pdf").write_bytes(pdf_pages(1, words=3))
    (files / "popular.pdf").write_bytes(pdf_pages(30))
    write_manifest(tmp_path, MANIFEST)
    server = Served(tmp_path)
    try:
        yield server, files
    finally:
        server.stop()


@pytest.mark.parametrize("mode", MODES)
def test_a_changed_document_is_told_and_converted_again(served: tuple[Served, Path], mode: str) -> None:
    server, files = served
    report = files / "report.pdf"

    def change() -> None:  # saved as editors do (a new file renamed over it), with a second page: new text
        fresh = files / "report.pdf.tmp~"
        fresh.write_bytes(pdf_pages(2, words=3))
        os.replace(fresh, report)

    async def main() -> None:
        inbox = Inbox()
        async with Client(server.base + "/mcp", mode=mode, cache=None, message_handler=inbox) as client:  # type: ignore[arg-type]
            first = (await client.read_resource("doc://report.pdf")).contents[0]
            assert first.mime_type == "text/markdown" and "Page 1" in first.text and "Page 2" not in first.text
            assert server.conversions() == 1
            if mode == "legacy":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await client.subscribe_resource("doc://report.pdf")
                await anyio.sleep(0.3)
                change()
                assert await inbox.next() == ("updated", "doc://report.pdf")
            else:
                events = await listened(client, [(change, 1)], resource_subscriptions=["doc://report.pdf"])
                assert events[0] == ResourceUpdated(uri="doc://report.pdf")
            again = (await client.read_resource("doc://report.pdf")).contents[0].text
            assert "Page 2" in again
            assert server.conversions() == 2

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_fifty_concurrent_first_reads_convert_once(served: tuple[Served, Path], mode: str) -> None:
    server, _ = served

    async def main() -> None:
        texts: list[str] = []
        async with Client(server.base + "/mcp", mode=mode, cache=None) as client:  # type: ignore[arg-type]
            async def read() -> None:
                texts.append((await client.read_resource("doc://popular.pdf")).contents[0].text)

            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(read)
        assert len(texts) == 50 and len(set(texts)) == 1 and "<!-- page 30 -->" in texts[0]
        assert server.conversions() == 1

    anyio.run(main)


SEARCHED = """
    version: 1
    server: {name: documents-search, tools: true}
    sources:
      files: {url: ./files}
    collections:
      - {source: files, glob: "**/*", uri: "doc://{path}", name: "{stem}", index: true, convert: markdown}
    """


@pytest.mark.parametrize("mode", MODES)
def test_search_finds_words_only_inside_documents(tmp_path: Path, mode: str) -> None:
    """`index: true` with `convert:` indexes the Markdown: words inside a PDF's compressed text streams and a DOCX's
    zipped XML are found, the PDF's own syntax is not."""
    files = tmp_path / "files"
    files.mkdir()
    shutil.copy(DATA / "crazyones.pdf", files / "crazyones.pdf")
    shutil.copy(DATA / "par-known-paragraphs.docx", files / "paragraphs.docx")
    (files / "notes.md").write_text("# Notes\n\nplain text about nothing\n")
    assert b"misfits" not in (files / "crazyones.pdf").read_bytes()
    manifest = write_manifest(tmp_path, SEARCHED)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            found = await until_found(client, "misfits", "doc://crazyones.pdf")
            assert [r["uri"] for r in found] == ["doc://crazyones.pdf"]
            assert [r["uri"] for r in await until_found(client, "heading", "doc://paragraphs.docx")] == [
                "doc://paragraphs.docx"]
            assert await search_tool(client, "endobj") == []  # the raw PDF was not indexed as text

    anyio.run(main)


def test_cache_dir_keeps_converted_text_across_restarts(tmp_path: Path) -> None:
    """server.documents.cacheDir: a restarted server reads an unchanged document without converting it; a changed
    document, and one whose kept file was damaged, are converted again (and the damaged file replaced)."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "report.pdf").write_bytes(pdf_pages(3, words=3))
    (files / "other.pdf").write_bytes(pdf_pages(4, words=3))
    write_manifest(tmp_path, MANIFEST.replace("server: {name: documents-live}",
                                              "server: {name: documents-live, documents: {cacheDir: ./converted}}"))

    async def read(server: Served, uri: str) -> str:
        async with Client(server.base + "/mcp", mode="auto", cache=None) as client:  # type: ignore[arg-type]
            return str((await client.read_resource(uri)).contents[0].text)

    def served_once(*uris: str) -> tuple[list[str], int]:
        server = Served(tmp_path)
        try:
            texts = [anyio.run(read, server, uri) for uri in uris]
            return texts, server.conversions()
        finally:
            server.stop()

    first, converted = served_once("doc://report.pdf", "doc://other.pdf")
    assert converted == 2 and "<!-- page 3 -->" in first[0]
    kept = sorted((tmp_path / "converted").iterdir())
    assert len(kept) == 2
    assert served_once("doc://report.pdf", "doc://other.pdf") == (first, 0)  # restarted: nothing converted

    (files / "report.pdf").write_bytes(pdf_pages(5, words=3))  # changed: never the old text
    damaged = next(p for p in kept if "<!-- page 4 -->" in p.read_text())
    damaged.write_text(damaged.read_text().replace("Page 4", "Page X"))
    again, converted = served_once("doc://report.pdf", "doc://other.pdf")
    assert converted == 2 and "<!-- page 5 -->" in again[0] and again[1] == first[1]
    assert "Page X" not in damaged.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_indexing_and_reading_a_document_convert_it_once(tmp_path: Path, mode: str) -> None:
    """`index: true` with `convert:`: the search indexer and reads share the content cache's conversion, so each
    version of a document is converted once, whichever asks first (a read racing the indexer at start, the indexer
    after a change); the server's /metrics counts the conversions."""
    files = tmp_path / "files"
    files.mkdir()
    shutil.copy(DATA / "crazyones.pdf", files / "crazyones.pdf")
    (files / "report.pdf").write_bytes(pdf_pages(1, words=3))
    write_manifest(tmp_path, SEARCHED)
    server = Served(tmp_path)

    async def main() -> None:
        async with Client(server.base + "/mcp", mode=mode, cache=None) as client:  # type: ignore[arg-type]
            async def text(uri: str) -> str:
                return str((await client.read_resource(uri)).contents[0].text)

            assert "The Crazy Ones" in await text("doc://crazyones.pdf")  # as early as can be: racing the indexer
            await until_found(client, "misfits", "doc://crazyones.pdf")
            await until_found(client, "word2", "doc://report.pdf")
            assert "The Crazy Ones" in await text("doc://crazyones.pdf")
            assert "Page 1 word0 word1 word2" in await text("doc://report.pdf")
            assert server.conversions() == 2

            fresh = files / "report.pdf.tmp~"
            fresh.write_bytes(pdf_pages(2, words=40))
            os.replace(fresh, files / "report.pdf")
            await until_found(client, "word39", "doc://report.pdf")  # the indexer converted the new version
            assert "<!-- page 2 -->\n\nPage 2 word0" in await text("doc://report.pdf")
            assert server.conversions() == 3
            assert server.metric("aggregator_document_rechecks_total") == 0  # nothing failed to parse
            assert 20e6 < server.metric("aggregator_document_worker_peak_bytes") < 1024**3  # the default maxMemory

    try:
        anyio.run(main)
    finally:
        server.stop()
