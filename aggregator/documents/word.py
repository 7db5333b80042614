"""DOCX -> Markdown with python-docx: paragraphs and tables in document order, headings by their style (Title,
Heading 1-6), list items as `-` or `1.`; images and formatting are dropped."""

from __future__ import annotations

import io

from typing import Any

from aggregator.documents.failures import Unreadable
from aggregator.documents.markdown import Budget, table
from aggregator.documents.zipped import check_zip
from aggregator.manifest.model import ConvertSettings

__all__ = ["docx_to_markdown"]


def docx_to_markdown(data: bytes, limits: ConvertSettings) -> str:
    import docx
    from docx.table import Table

    check_zip(data, "DOCX", limits.max_unzipped_bytes).close()
    try:
        document = docx.Document(io.BytesIO(data))
    except MemoryError:  # an Exception too: the worker reports the limit convert.maxMemory
        raise
    except Exception:  # python-docx raises KeyError, ValueError, lxml errors... for a broken package
        raise Unreadable("it is a corrupt or unreadable DOCX file") from None
    out = Budget(limits.max_chars)
    for block in document.iter_inner_content():
        text = _table(block) if isinstance(block, Table) else _paragraph(block)
        if text and not out.add(text):
            break
    return out.text()


def _paragraph(paragraph: Any) -> str:
    text = paragraph.text.strip()
    if not text:
        return ""
    style = (paragraph.style.name or "") if paragraph.style is not None else ""
    if style == "Title":
        return f"# {text}"
    if style.startswith("Heading "):
        level = style.removeprefix("Heading ").strip()
        return f"{'#' * min(int(level) + 1, 6)} {text}" if level.isdigit() else text
    if style.startswith("List Number"):
        return f"1. {text}"
    if style.startswith("List") or paragraph._p.pPr is not None and paragraph._p.pPr.numPr is not None:
        return f"- {text}"
    return text


def _table(block: Any) -> str:
    return table([cell.text for cell in row.cells] for row in block.rows)
