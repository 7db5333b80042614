"""XLSX and CSV -> Markdown tables. XLSX with openpyxl in read-only mode, which streams rows instead of building
the whole workbook (a 100,000-row sheet costs the rows read, not the sheet): one `## Sheet` section per sheet,
values as last saved (formulas' cached results). Rows past `maxRows` (all sheets together) are cut with a note."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Sequence

from aggregator.documents.failures import ConversionFailed, Unreadable
from aggregator.documents.markdown import Budget, table
from aggregator.documents.zipped import check_zip
from aggregator.manifest.model import ConvertSettings

__all__ = ["MAX_COLUMNS", "csv_to_markdown", "xlsx_to_markdown"]

MAX_COLUMNS = 256
"""Columns shown per row: a table wider than this is not one a model can read as a table."""


def xlsx_to_markdown(data: bytes, limits: ConvertSettings) -> str:
    import openpyxl

    check_zip(data, "XLSX", limits.max_unzipped_bytes).close()
    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except MemoryError:  # an Exception too: the worker reports the limit convert.maxMemory
        raise
    except Exception:  # openpyxl raises KeyError, ValueError, XML errors... for a broken package
        raise Unreadable("it is a corrupt or unreadable XLSX file") from None
    try:
        out = Budget(limits.max_chars)
        sheets = workbook.worksheets
        rows_left = limits.max_rows
        for sheet in sheets[: limits.max_pages]:
            rows = _trimmed(sheet.iter_rows(values_only=True))
            taken, more = _take(rows, rows_left)
            rows_left -= len(taken)
            if not out.add(f"## Sheet: {sheet.title}\n\n" + (table(taken) or "(empty)")):
                break
            if more:
                out.note(f"[... cut after {limits.max_rows} rows, in sheet {sheet.title!r}: limit convert.maxRows]")
                break
        if not out.full and rows_left > 0 and len(sheets) > limits.max_pages:
            out.note(f"[... cut after sheet {limits.max_pages} of {len(sheets)}: limit convert.maxPages]")
        return out.text()
    except (ConversionFailed, MemoryError):
        raise
    except Exception:
        raise Unreadable("it is a corrupt or unreadable XLSX file") from None
    finally:
        workbook.close()


def csv_to_markdown(data: bytes, limits: ConvertSettings) -> str:
    text = data.decode("utf-8-sig", errors="replace")
    try:
        dialect: type[csv.Dialect] | csv.Dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    out = Budget(limits.max_chars)
    try:
        taken, more = _take(_trimmed(csv.reader(io.StringIO(text, newline=""), dialect)), limits.max_rows)
    except csv.Error as exc:
        raise ConversionFailed(f"it is not valid CSV ({exc})") from None
    out.add(table(taken))
    if more and not out.full:
        out.note(f"[... cut after {limits.max_rows} rows: limit convert.maxRows]")
    return out.text()


def _trimmed(rows: Iterable[Sequence[object]]) -> Iterator[list[object]]:
    """Rows without their trailing empty cells, at most MAX_COLUMNS wide; wholly empty rows are skipped."""
    for row in rows:
        cells = list(row[:MAX_COLUMNS])
        while cells and (cells[-1] is None or cells[-1] == ""):
            cells.pop()
        if cells:
            yield cells


def _take(rows: Iterator[list[object]], count: int) -> tuple[list[list[object]], bool]:
    """The first `count` rows, and whether more followed."""
    taken: list[list[object]] = []
    for row in rows:
        if len(taken) >= count:
            return taken, True
        taken.append(row)
    return taken, False
