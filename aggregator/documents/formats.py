"""Which files `convert:` converts, by the name they are served under, and the media type they are served as."""

from __future__ import annotations

from aggregator.content import served_name
from aggregator.manifest.model import ConvertSettings

__all__ = ["CONVERTED_MIME_TYPES", "FORMATS", "converted", "document_format", "install_hint", "missing_libraries"]

FORMATS = {".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx", ".xlsm": "xlsx", ".csv": "csv", ".html": "html",
           ".htm": "html", ".xhtml": "html"}
"""File extension (lower case) -> the converter that reads it."""

CONVERTED_MIME_TYPES = {"markdown": "text/markdown"}
"""`convert: <to>` -> the mimeType converted files are listed and served with."""

_LIBRARIES = {"pdf": "pypdfium2", "docx": "docx", "pptx": "pptx", "xlsx": "openpyxl"}
"""The importable module each format needs (CSV needs only the standard library)."""


def document_format(name: str) -> str | None:
    """The format a file is converted from, by its (served) name's extension; None: served as it is."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return FORMATS.get(base[dot:].lower()) if dot > 0 else None


def converted(path: str, decompress: bool, convert: ConvertSettings | None) -> ConvertSettings | None:
    """The conversion a file of an entry with `convert` gets (None: served as it is), by its served name."""
    if convert is None or document_format(served_name(path, decompress)) is None:
        return None
    return convert


def missing_libraries() -> list[str]:
    """The modules of the `documents` extra this installation lacks (found without importing them)."""
    from importlib.util import find_spec

    return sorted({module for module in _LIBRARIES.values() if find_spec(module) is None})


def install_hint() -> str:
    return "pip install 'mcp-aggregator[documents]'"
