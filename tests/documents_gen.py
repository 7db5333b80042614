"""Documents the tests make themselves: large ones (a many-page PDF, a many-row XLSX) and hostile ones (zip bombs)."""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "documents"


def pdf_pages(pages: int, words: int = 40) -> bytes:
    """A valid PDF of `pages` pages, page N reading "Page N" then `words` words, in Helvetica."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b"",
                            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for n in range(1, pages + 1):
        text = f"Page {n} " + " ".join(f"word{i}" for i in range(words))
        stream = f"BT /F1 10 Tf 40 800 Td ({text}) Tj ET".encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        content = len(objects)
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> "
                       b">> /Contents %d 0 R >>" % content)
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), pages)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


@functools.cache  # 100,000 rows take seconds of CPU to write: once per test process
def xlsx_rows(rows: int) -> bytes:
    """An XLSX with one sheet: a header row, then `rows` rows of (n, "row n", n * 1.5)."""
    import openpyxl

    workbook = openpyxl.Workbook(write_only=True)
    sheet = workbook.create_sheet("Data")
    sheet.append(["id", "label", "value"])
    for n in range(1, rows + 1):
        sheet.append([n, f"row {n}", n * 1.5])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def docx_bomb(uncompressed: int) -> bytes:
    """The fixture DOCX with its document part swapped for `uncompressed` bytes of one repeated paragraph: a few
    hundred KB on disk (deflate gets ~1000:1 on it), `uncompressed` bytes once inflated."""
    base = (DATA / "par-known-paragraphs.docx").read_bytes()
    paragraph = b"<w:p><w:r><w:t>boom</w:t></w:r></w:p>"
    head = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://schemas.'
            b'openxmlformats.org/wordprocessingml/2006/main"><w:body>')
    tail = b"</w:body></w:document>"
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb:
        for info in source.infolist():
            if info.filename != "word/document.xml":
                bomb.writestr(info, source.read(info))
                continue
            entry = zipfile.ZipInfo("word/document.xml")
            entry.compress_type = zipfile.ZIP_DEFLATED
            with bomb.open(entry, "w", force_zip64=True) as part:
                part.write(head)
                chunk = paragraph * (1024 * 1024 // len(paragraph))
                left = uncompressed - len(head) - len(tail)
                while left > 0:
                    part.write(chunk[:left])
                    left -= len(chunk)
                part.write(tail)
    return out.getvalue()


def xlsx_broken_sheet(rows: int) -> bytes:
    """xlsx_rows(rows) with its sheet's XML cut short: openpyxl opens it (reading its `rows` shared strings) and
    fails on the sheet's first row, a corrupt file that takes some memory before it fails."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(xlsx_rows(rows))) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as broken:
        for info in source.infolist():
            part = source.read(info)
            if info.filename.startswith("xl/worksheets/"):
                part = part[: part.index(b"<sheetData>") + len(b"<sheetData>")] + b"<row r=\"1\"><c r=\"A1\" t=\"s\"><v>"
            broken.writestr(info, part)
    return out.getvalue()


def padded(name: str, size: int) -> bytes:
    """The fixture `name` (an Office file) with one more part: `size` zero bytes (a few hundred KB compressed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO((DATA / name).read_bytes())) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bigger:
        for info in source.infolist():
            bigger.writestr(info, source.read(info))
        entry = zipfile.ZipInfo("filler.bin")
        entry.compress_type = zipfile.ZIP_DEFLATED
        with bigger.open(entry, "w", force_zip64=True) as part:
            chunk = bytes(1024 * 1024)
            for start in range(0, size, len(chunk)):
                part.write(chunk[: size - start])
    return out.getvalue()
