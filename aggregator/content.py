"""Resource bodies: MIME type guessing and the text-or-binary decision."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass

__all__ = ["Content", "decode_body", "guess_mime_type", "is_text_mime"]

_EXTRA_TYPES = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".mdx": "text/markdown",
    ".rst": "text/x-rst",
    ".adoc": "text/asciidoc",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".toml": "application/toml",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".ndjson": "application/x-ndjson",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".ts": "text/x-typescript",
    ".tsx": "text/x-typescript",
    ".py": "text/x-python",
    ".go": "text/x-go",
    ".rs": "text/x-rust",
    ".sql": "application/sql",
    ".sh": "text/x-shellscript",
    ".ini": "text/plain",
    ".cfg": "text/plain",
    ".log": "text/plain",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
    ".webp": "image/webp",
    ".parquet": "application/vnd.apache.parquet",
}
_TEXT_APPLICATION_TYPES = {
    "application/json",
    "application/jsonl",
    "application/x-ndjson",
    "application/xml",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/javascript",
    "application/ecmascript",
    "application/sql",
    "application/x-sh",
    "application/graphql",
}
_SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Content:
    """A resource body ready to serve: exactly one of `text` and `blob` is set."""

    mime_type: str
    text: str | None = None
    blob: bytes | None = None

    @property
    def nbytes(self) -> int:
        """Approximate memory held, for the cache's byte budget."""
        if self.text is not None:
            # str stores 1, 2 or 4 bytes a character; len(encode) would cost a copy.
            return len(self.text) * (1 if self.text.isascii() else 4) + 64
        return len(self.blob or b"") + 64


def guess_mime_type(path: str) -> str | None:
    """The MIME type a file name suggests, or None."""
    dot = path.rfind(".")
    if dot != -1:
        extra = _EXTRA_TYPES.get(path[dot:].lower())
        if extra:
            return extra
    return mimetypes.guess_type(path, strict=False)[0]


def is_text_mime(mime_type: str) -> bool:
    """True for MIME types whose bodies are text (text/*, JSON, XML, YAML and their +suffix forms)."""
    base = mime_type.split(";", 1)[0].strip().lower()
    return (
        base.startswith("text/")
        or base in _TEXT_APPLICATION_TYPES
        or base.endswith(("+json", "+xml", "+yaml"))
    )


def decode_body(data: bytes, mime_type: str | None) -> Content:
    """Text when the type says text (or, untyped, the bytes look like text) and the bytes are UTF-8; else a blob."""
    if mime_type is None:
        looks_text = b"\x00" not in data[:_SNIFF_BYTES]
        text = _utf8(data) if looks_text else None
        if text is not None:
            return Content("text/plain", text=text)
        return Content("application/octet-stream", blob=data)
    if is_text_mime(mime_type):
        text = _utf8(data)
        if text is not None:
            return Content(mime_type, text=text)
    return Content(mime_type, blob=data)


def _utf8(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # A byte-order mark is an encoding artefact, not content.
    return text[1:] if text.startswith("\ufeff") else text
