"""Documents converted to Markdown in worker processes (aggregator/documents/): real documents from document
libraries' own test suites (tests/data/documents/SOURCES.md), generated large ones and crafted bombs, each within
its limits; a worker that overruns is killed and replaced."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

pytest.importorskip("pypdfium2", reason="the documents extra is not installed: pip install -e '.[documents]'")

from aggregator.documents.failures import ConversionFailed, OverLimit  # noqa: E402
from aggregator.documents.pool import DocumentPool  # noqa: E402
from aggregator.manifest.model import ConvertSettings  # noqa: E402

from documents_gen import DATA, docx_bomb, padded, pdf_pages, xlsx_broken_sheet, xlsx_rows  # noqa: E402

LIMITS = ConvertSettings()


@pytest.fixture
async def pool():
    pool = DocumentPool(2)
    yield pool
    await pool.aclose()


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


@pytest.mark.anyio
async def test_real_documents_convert(pool: DocumentPool) -> None:
    pdf = await pool.convert(fixture("crazyones.pdf"), "pdf", LIMITS)
    assert pdf.startswith("<!-- page 1 -->\n\nThe Crazy Ones\nOctober 14, 1998")
    docx = await pool.convert(fixture("tbl-cell-access.docx"), "docx", LIMITS)
    assert "| 1 | 2 | 3 |\n| --- | --- | --- |\n| 4 | 5 | 6 |" in docx
    headed = await pool.convert(fixture("par-known-paragraphs.docx"), "docx", LIMITS)
    assert "## Heading Paragraph" in headed and "Normal paragraph" in headed
    pptx = await pool.convert(fixture("txt-text-frame.pptx"), "pptx", LIMITS)
    assert pptx.startswith("## Slide 1") and "Text frame having no auto-size setting" in pptx
    xlsx = await pool.convert(fixture("shp-embedded-xlsx.xlsx"), "xlsx", LIMITS)
    assert xlsx == "## Sheet: Sheet1\n\n| 1 |\n| --- |\n| 2 |\n| 3 |\n"
    assert pool.started == 1  # one worker, kept between conversions


@pytest.mark.anyio
async def test_encrypted_scanned_and_corrupt(pool: DocumentPool) -> None:
    with pytest.raises(ConversionFailed, match="^it is an encrypted PDF"):
        await pool.convert(fixture("encrypted-file.pdf"), "pdf", LIMITS)
    scanned = await pool.convert(fixture("imagemagick-CCITTFaxDecode.pdf"), "pdf", LIMITS)
    assert "no text layer" in scanned
    with pytest.raises(ConversionFailed, match="corrupt or unreadable PDF"):
        await pool.convert(b"%PDF-1.4\n" + b"\x00" * 100, "pdf", LIMITS)
    with pytest.raises(ConversionFailed, match="not a valid DOCX file"):
        await pool.convert(fixture("crazyones.pdf"), "docx", LIMITS)
    with pytest.raises(ConversionFailed, match="password-protected XLSX"):
        await pool.convert(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 512, "xlsx", LIMITS)


@pytest.mark.anyio
async def test_pages_rows_and_characters_are_cut_with_a_note(pool: DocumentPool) -> None:
    five_hundred = pdf_pages(500)  # the default maxPages: read whole
    whole = await pool.convert(five_hundred, "pdf", LIMITS)
    assert "<!-- page 500 -->\n\nPage 500 word0" in whole and "cut" not in whole
    more = pdf_pages(150)  # past the lower limits below: a third of the pages to convert
    first = await pool.convert(more, "pdf", replace(LIMITS, max_pages=100))
    assert "<!-- page 100 -->" in first and "<!-- page 101 -->" not in first
    assert first.endswith("[... cut after page 100 of 150: limit convert.maxPages]\n")
    short = await pool.convert(more, "pdf", replace(LIMITS, max_chars=1000))
    assert short.endswith("\n\n[... cut at 1000 characters: limit convert.maxChars]\n")
    assert len(short) < 1100
    rows = await pool.convert(xlsx_rows(25_000), "xlsx", replace(LIMITS, max_chars=10**7))  # 2.5 x maxRows
    assert "| 9999 | row 9999 | 14998.5 |" in rows and "| 10000 |" not in rows  # the header is a row too
    assert rows.endswith("[... cut after 10000 rows, in sheet 'Data': limit convert.maxRows]\n")


@pytest.mark.anyio
async def test_a_zip_bomb_is_refused_unread(pool: DocumentPool) -> None:
    bomb = docx_bomb(300 * 1024 * 1024)
    assert len(bomb) < 1024 * 1024
    with pytest.raises(OverLimit, match=r"more than 268435456 \(limit convert.maxUnzippedBytes\)$"):
        await pool.convert(bomb, "docx", LIMITS)
    with pytest.raises(OverLimit, match=r"\(limit convert.maxInputBytes\)$"):
        await pool.convert(bomb, "docx", replace(LIMITS, max_input_bytes=1000))


@pytest.mark.anyio
async def test_an_overrunning_worker_is_killed_and_replaced(pool: DocumentPool) -> None:
    big = pdf_pages(500)
    await pool.convert(fixture("crazyones.pdf"), "pdf", LIMITS)  # a warm worker: the limit times conversion only
    with pytest.raises(OverLimit, match=r"took longer than 0.001s \(limit convert.timeout\)"):
        await pool.convert(big, "pdf", replace(LIMITS, timeout=0.001))
    assert pool.killed == 1
    # Conversions go on: a new worker replaces the killed one.
    assert "The Crazy Ones" in await pool.convert(fixture("crazyones.pdf"), "pdf", LIMITS)
    assert pool.started == 2


@pytest.mark.anyio
async def test_out_of_memory_fails_that_document_only(pool: DocumentPool) -> None:
    with pytest.raises(ConversionFailed, match="maxMemory"):
        await pool.convert(xlsx_rows(20_000), "xlsx", replace(LIMITS, max_memory=64 * 1024 * 1024, max_rows=20_000))
    assert "The Crazy Ones" in await pool.convert(fixture("crazyones.pdf"), "pdf", LIMITS)


@pytest.mark.anyio
async def test_a_corrupt_file_near_the_memory_limit_is_told_from_one_over_it(pool: DocumentPool) -> None:
    """A parser that gives up says "corrupt" whether the file is broken or an allocation failed under maxMemory (the
    parsers turn a MemoryError into errors of their own): the pool converts it once more in a fresh worker with
    twice the memory, whose peak tells which. A broken sheet that fits within the limit, even closely, is corrupt;
    within a limit it cannot even be opened in, it is over the limit."""
    broken = xlsx_broken_sheet(20_000)
    with pytest.raises(ConversionFailed, match="^it is a corrupt or unreadable XLSX file$"):
        await pool.convert(broken, "xlsx", LIMITS)
    assert (pool.rechecked, pool.started) == (1, 2)  # the second attempt in a fresh worker, which is kept
    near = pool.peak + 6 * 1024 * 1024  # the most it took in either worker, and a little more
    with pytest.raises(ConversionFailed, match="^it is a corrupt or unreadable XLSX file$"):
        await pool.convert(broken, "xlsx", replace(LIMITS, max_memory=near))
    with pytest.raises(OverLimit, match=r"more than 50331648 bytes of memory to convert \(limit convert.maxMemory\)"):
        await pool.convert(broken, "xlsx", replace(LIMITS, max_memory=48 * 1024 * 1024))
    assert "The Crazy Ones" in await pool.convert(fixture("crazyones.pdf"), "pdf", LIMITS)


@pytest.mark.anyio
async def test_a_pptx_read_whole_past_the_memory_limit_is_refused_unparsed(pool: DocumentPool) -> None:
    """python-pptx reads every part of a PPTX into memory first: parts declaring more than maxMemory are refused from
    the zip's directory, before any parsing, and the worker goes on (the same file converts within a larger limit)."""
    bigger = padded("txt-text-frame.pptx", 128 * 1024 * 1024)
    with pytest.raises(OverLimit, match=r"read whole: more than 104857600 \(limit convert.maxMemory\)$"):
        await pool.convert(bigger, "pptx", replace(LIMITS, max_memory=100 * 1024 * 1024))  # the worker takes 79
    assert "## Slide 1" in await pool.convert(bigger, "pptx", LIMITS)
    assert (pool.started, pool.killed, pool.rechecked) == (1, 0, 0)


@pytest.mark.anyio
async def test_conversions_at_once_are_capped(pool: DocumentPool) -> None:
    document = pdf_pages(50)
    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(pool.convert, document, "pdf", LIMITS)
    assert pool.started == 2


LONG_PAGES = 4000
"""A long document (about 0.25 s to convert whole): pypdfium2 converts a generated page in well under 0.1 ms, and
the default limits stop at 500 pages and 200,000 characters, so a "long" one took about 35 ms and which conversion
ended first was the machine's whim, not the pool's order."""
LONG = replace(LIMITS, max_pages=LONG_PAGES, max_chars=10**8)


async def _converting(pool: DocumentPool) -> None:
    """Until background work holds a worker (what a read or a wanted conversion comes in behind)."""
    with anyio.fail_after(30):
        while pool.busy < 1:
            await anyio.sleep(0.002)


@pytest.mark.anyio
async def test_background_conversions_leave_a_worker_to_reads(pool: DocumentPool) -> None:
    """Eight long documents queued for the index, then a short read: the read takes the worker background work may
    not hold, so it ends first (without the cap it would wait for a long one to end)."""
    long, short, done = pdf_pages(LONG_PAGES), fixture("crazyones.pdf"), []

    async def convert(name: str, document: bytes, background: bool) -> None:
        await pool.convert(document, "pdf", LONG if background else LIMITS, background=background)
        done.append(name)

    async with anyio.create_task_group() as tg:  # both workers started first: starting one takes longer than a PDF
        for i in range(2):
            tg.start_soon(convert, f"warm {i}", short, False)
    done.clear()
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(convert, f"index {i}", long, True)
        await _converting(pool)
        ended = len(done)  # what ended before the read was asked for is not behind or ahead of it
        tg.start_soon(convert, "read", short, False)
    assert done.index("read") == ended, (ended, done)  # the first to end once asked for
    assert pool.converted == 11 and pool.started == 2


@pytest.mark.anyio
async def test_background_work_a_read_waits_for_goes_ahead(pool: DocumentPool) -> None:
    """The search indexer's conversion of a document a client's read now waits for (the read gets it from the content
    cache) stops waiting for a background turn once `wanted`: behind four long documents queued for the index (one
    background turn at a time in a pool of two), it ends first, not last."""
    long, short, done = pdf_pages(LONG_PAGES), fixture("crazyones.pdf"), []

    async def convert(name: str, document: bytes, key: str | None = None) -> None:
        if key is None:
            await pool.convert(document, "pdf", LONG, background=True)
        else:
            with pool.queued(key) as turn:
                await pool.convert(document, "pdf", LIMITS, background=True, wanted=turn)
        done.append(name)

    async with anyio.create_task_group() as tg:  # both workers started first
        for i in range(2):
            tg.start_soon(pool.convert, short, "pdf", LIMITS)
    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(convert, f"index {i}", long)
        tg.start_soon(convert, "wanted", short, "doc://short.pdf")
        await _converting(pool)
        ended = len(done)
        pool.wanted("doc://short.pdf")
        pool.wanted("doc://nothing-queued.pdf")  # nothing waits for it: nothing happens
    assert done.index("wanted") == ended, (ended, done)
    assert pool.converted == 7 and pool.started == 2


@pytest.mark.anyio
async def test_stored_conversions_are_bounded_and_keyed_by_bytes_and_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from aggregator.documents.stored import StoredConversions

    store = StoredConversions(tmp_path / "kept", max_bytes=250)
    names = [store.name(b"doc %d" % i, "pdf", LIMITS) for i in range(3)]
    assert store.name(b"doc 0", "pdf", replace(LIMITS, max_pages=1)) != names[0]  # other settings, other text
    for i, name in enumerate(names):
        await store.put(name, "x" * 100)
        os.utime(tmp_path / "kept" / name, (i, i))  # written in this order
    assert await store.get(names[0]) is None  # 3 x ~165 bytes > 250: the oldest went first
    assert await store.get(names[2]) == "x" * 100
    assert not [p for p in (tmp_path / "kept").iterdir() if p.name.startswith(".writing-")]


@pytest.mark.anyio
async def test_html_converts_visible_text_within_limits(pool: DocumentPool) -> None:
    page = (b'<html><head><meta charset="iso-8859-1"><title>hidden title</title><script>alert("x")</script></head>'
            b'<body><h2>Caf\xe9 &amp; more</h2><p>See <a href="https://example.org/doc">the doc</a> or '
            b'<a href="javascript:steal()">this</a>.</p><ul><li>one</li></ul><pre>a  b\n  c</pre>'
            b'<table><tr><th>k</th><th>v</th></tr><tr><td>x</td><td>1|2</td></tr></table></body></html>')
    text = await pool.convert(page, "html", LIMITS)
    assert text == ("## Caf\u00e9 & more\n\nSee [the doc](https://example.org/doc) or this.\n\n- one\n\n"
                    "```\na  b\n  c\n```\n\n| k | v |\n| --- | --- |\n| x | 1\\|2 |\n")
    deep = await pool.convert(b"<div>" * 200_000 + b"deep" + b"</div>" * 200_000, "html", LIMITS)
    assert deep == "deep\n"  # the parser keeps no tree: nesting costs nothing
    cut = await pool.convert(b"<p>" + b"word " * 5000 + b"</p>", "html", replace(LIMITS, max_chars=100))
    assert cut.endswith("[... cut at 100 characters: limit convert.maxChars]\n")
    rows = b"<table>" + b"<tr><td>r</td></tr>" * 50 + b"</table>"
    assert "limit convert.maxRows" in await pool.convert(rows, "html", replace(LIMITS, max_rows=10))
