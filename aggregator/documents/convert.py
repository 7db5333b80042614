"""One document's conversion, start to end, as a worker process runs it: the format's converter over the bytes,
within the manifest's limits."""

from __future__ import annotations

from collections.abc import Callable

from aggregator.documents.failures import ConversionFailed, OverLimit
from aggregator.manifest.model import ConvertSettings

__all__ = ["convert"]


def _converter(fmt: str) -> Callable[[bytes, ConvertSettings], str]:
    # Imported per format: a worker that only ever sees PDFs never loads lxml or openpyxl.
    if fmt == "pdf":
        from aggregator.documents.pdf import pdf_to_markdown
        return pdf_to_markdown
    if fmt == "docx":
        from aggregator.documents.word import docx_to_markdown
        return docx_to_markdown
    if fmt == "pptx":
        from aggregator.documents.slides import pptx_to_markdown
        return pptx_to_markdown
    if fmt == "xlsx":
        from aggregator.documents.sheets import xlsx_to_markdown
        return xlsx_to_markdown
    if fmt == "csv":
        from aggregator.documents.sheets import csv_to_markdown
        return csv_to_markdown
    if fmt == "html":
        from aggregator.documents.html import html_to_markdown
        return html_to_markdown
    raise ConversionFailed(f"{fmt} files cannot be converted")


def convert(data: bytes, fmt: str, limits: ConvertSettings) -> str:
    """The Markdown of a `fmt` document; ConversionFailed (OverLimit for a limit) when it cannot be had."""
    if len(data) > limits.max_input_bytes:
        raise OverLimit(f"it is {len(data)} bytes, more than {limits.max_input_bytes}", "maxInputBytes")
    return _converter(fmt)(data, limits)
