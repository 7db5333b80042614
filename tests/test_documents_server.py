"""`convert: markdown` through the real server (`aggregator serve` over stdio, the official client, both wires):
real documents listed and read as Markdown under their URIs while another collection serves the original bytes;
every failure a specific error naming the URI (and the limit), and the server serving on after each."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import MODES, connect, list_all, write_manifest
from documents_gen import DATA, docx_bomb, pdf_pages, xlsx_rows

pytest.importorskip("pypdfium2", reason="the documents extra is not installed: pip install -e '.[documents]'")

MANIFEST = """
    version: 1
    server: {name: documents}
    defaults: {maxBytes: 64KiB, convert: {maxPages: 100, maxUnzippedBytes: 10MiB}}
    sources:
      files: {url: ./files}
    collections:
      - {source: files, glob: "**/*", uri: "doc://{path}", name: "{path}", convert: markdown}
      - {source: files, glob: "**/*", uri: "raw://{path}", name: "raw {path}"}
    resources:
      - {uri: "first://big.pdf", name: first, source: files, path: big.pdf,
         convert: {to: markdown, maxPages: 2, maxChars: 5000}}
    templates:
      - {uriTemplate: "slow://{+path}", name: slow, source: files, path: "{path}",
         convert: {to: markdown, timeout: 1ms}}
    """


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    for name in ("crazyones.pdf", "encrypted-file.pdf", "imagemagick-CCITTFaxDecode.pdf", "tbl-cell-access.docx",
                 "txt-text-frame.pptx", "shp-embedded-xlsx.xlsx"):
        shutil.copy(DATA / name, files / name)
    (files / "big.pdf").write_bytes(pdf_pages(500))  # 270 KB: past maxBytes, within convert.maxInputBytes
    (files / "bomb.docx").write_bytes(docx_bomb(20 * 1024 * 1024))
    (files / "fake.pdf").write_bytes(b"not a pdf at all")
    (files / "notes.txt").write_text("plain notes", encoding="utf-8")
    (files / "table.csv").write_text("name,qty\napples,3\npears,5\n", encoding="utf-8")
    return write_manifest(tmp_path, MANIFEST)


async def _error(client, uri: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(MCPError) as err:
        await client.read_resource(uri)
    return err.value.error.message


@pytest.mark.parametrize("mode", MODES)
def test_documents_are_listed_and_read_as_markdown(manifest: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(manifest, mode) as client:
            listed = {r.uri: r for r in (await list_all(client))[0]}
            for name in ("crazyones.pdf", "tbl-cell-access.docx", "txt-text-frame.pptx", "table.csv"):
                assert listed[f"doc://{name}"].mime_type == "text/markdown", name
                assert listed[f"doc://{name}"].size is None  # known only once converted
            assert listed["raw://crazyones.pdf"].mime_type == "application/pdf"
            assert listed["raw://crazyones.pdf"].size == (DATA / "crazyones.pdf").stat().st_size
            assert (listed["doc://notes.txt"].mime_type, listed["doc://notes.txt"].size) == ("text/plain", 11)

            pdf = (await client.read_resource("doc://crazyones.pdf")).contents[0]
            assert pdf.mime_type == "text/markdown" and "The Crazy Ones\nOctober 14, 1998" in pdf.text
            raw = (await client.read_resource("raw://crazyones.pdf")).contents[0]
            assert raw.mime_type == "application/pdf" and hasattr(raw, "blob")
            docx = (await client.read_resource("doc://tbl-cell-access.docx")).contents[0].text
            assert "| 1 | 2 | 3 |\n| --- | --- | --- |" in docx
            pptx = (await client.read_resource("doc://txt-text-frame.pptx")).contents[0].text
            assert "## Slide 1" in pptx and "Text frame having no auto-size setting" in pptx
            xlsx = (await client.read_resource("doc://shp-embedded-xlsx.xlsx")).contents[0].text
            assert xlsx.startswith("## Sheet: Sheet1\n\n| 1 |")
            csv = (await client.read_resource("doc://table.csv")).contents[0].text
            assert csv == "| name | qty |\n| --- | --- |\n| apples | 3 |\n| pears | 5 |\n"
            assert (await client.read_resource("doc://notes.txt")).contents[0].text == "plain notes"
            scanned = (await client.read_resource("doc://imagemagick-CCITTFaxDecode.pdf")).contents[0].text
            assert "no text layer" in scanned

            big = (await client.read_resource("doc://big.pdf")).contents[0].text
            assert big.endswith("[... cut after page 100 of 500: limit convert.maxPages]\n")
            first = (await client.read_resource("first://big.pdf")).contents[0].text
            assert "<!-- page 2 -->" in first and "<!-- page 3 -->" not in first
            # The original is past maxBytes: only the conversion's own input limit lets it through.
            assert "too large" in await _error(client, "raw://big.pdf")

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_each_failure_names_the_uri_and_the_server_serves_on(manifest: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(manifest, mode) as client:
            assert await _error(client, "doc://encrypted-file.pdf") == (
                "Resource doc://encrypted-file.pdf could not be converted to Markdown: it is an encrypted PDF (it "
                "needs a password)")
            assert await _error(client, "doc://fake.pdf") == (
                "Resource doc://fake.pdf could not be converted to Markdown: it is not a PDF file (no %PDF- header)")
            bomb = await _error(client, "doc://bomb.docx")
            assert bomb.startswith("Resource doc://bomb.docx could not be converted to Markdown: its parts hold ")
            assert bomb.endswith("more than 10485760 (limit convert.maxUnzippedBytes)")
            assert await _error(client, "slow://big.pdf") == (
                "Resource slow://big.pdf could not be converted to Markdown: converting it took longer than 0.001s "
                "(limit convert.timeout)")
            # The killed worker is replaced; every other read is served.
            results: list[str] = []

            async def read(uri: str) -> None:
                results.append((await client.read_resource(uri)).contents[0].text)

            async with anyio.create_task_group() as tg:
                for _ in range(20):  # concurrent first reads: one conversion (the cache's single flight)
                    tg.start_soon(read, "doc://txt-text-frame.pptx")
            assert len(set(results)) == 1 and "## Slide 1" in results[0]
            assert "The Crazy Ones" in (await client.read_resource("doc://crazyones.pdf")).contents[0].text

    anyio.run(main)


def test_validate_names_the_missing_extra(manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aggregator.documents import formats
    from aggregator.manifest import load_manifest
    from aggregator.preflight import check_manifest

    assert check_manifest(load_manifest(manifest)) == []
    monkeypatch.setattr(formats, "missing_libraries", lambda: ["pypdfium2"])
    findings = [str(f) for f in check_manifest(load_manifest(manifest))]
    assert [f.split(": ")[1] for f in findings] == ["resources[0].convert", "collections[0].convert",
                                                    "templates[0].convert"]
    assert findings[1].endswith(": collections[0].convert: converting documents needs the documents extra "
                                "(missing: pypdfium2): pip install 'mcp-aggregator[documents]'")


SHEETS = """
    version: 1
    server: {name: sheets}
    sources:
      files: {url: ./files}
    collections:
      - {source: files, glob: "*.xlsx", uri: "sheet://{path}", name: "{path}",
         convert: {to: markdown, maxChars: 1000000, maxMemory: 160MiB}}
      - {source: files, glob: "*.xlsx", uri: "short://{path}", name: "short {path}", convert: markdown}
    """


def test_a_hundred_thousand_row_sheet_is_read_to_its_row_cap(tmp_path: Path) -> None:
    """A 100,000-row XLSX (2 MB) read as Markdown by a worker held to 160 MiB of address space: the sheet is streamed
    (about 95 MiB at its peak, the worker's 79 included; loading it whole takes 208), the first convert.maxRows rows
    (the header counts) then a note saying where and why it stops; with the default maxChars the characters run out
    first, and the note says that instead. On the modern wire only: the cut is the converter's, and a converted
    sheet crosses both wires in test_documents_are_listed_and_read_as_markdown (both were 20-40 s under load)."""
    mode = "auto"
    files = tmp_path / "files"
    files.mkdir()
    (files / "rows.xlsx").write_bytes(xlsx_rows(100_000))
    manifest = write_manifest(tmp_path, SHEETS)

    async def main() -> None:
        async with connect(manifest, mode) as client:
            listed = {r.uri: r for r in (await list_all(client))[0]}
            assert listed["sheet://rows.xlsx"].mime_type == "text/markdown"
            sheet = (await client.read_resource("sheet://rows.xlsx")).contents[0]
            assert sheet.mime_type == "text/markdown"
            assert sheet.text.startswith("## Sheet: Data\n\n| id | label | value |\n| --- | --- | --- |\n"
                                         "| 1 | row 1 | 1.5 |\n")
            assert "\n| 9999 | row 9999 | 14998.5 |\n\n" in sheet.text and "| 10000 |" not in sheet.text
            assert sheet.text.endswith("\n\n[... cut after 10000 rows, in sheet 'Data': limit convert.maxRows]\n")
            short = (await client.read_resource("short://rows.xlsx")).contents[0].text
            assert short.endswith("\n\n[... cut at 200000 characters: limit convert.maxChars]\n")
            assert short[:200_000] == sheet.text[:200_000]

    anyio.run(main)
